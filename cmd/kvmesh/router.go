package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/internal/gcpace"
	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/proxy/disagg"
	"github.com/kvmesh/kvmesh/proxy/health"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// defaultDrainTimeout bounds how long a stopping router waits for
// in-flight requests before cutting them: long enough for a long stream.
const defaultDrainTimeout = 60 * time.Second

// defaultGCHeadroom is --gc-headroom's default: at most 32 MiB more heap
// than GOGC=100 would hold (a live heap under about 11 MB gets GOGC=400).
const defaultGCHeadroom = 32 << 20

// routerConfig is the parsed command line of `kvmesh router`.
type routerConfig struct {
	name, region      string
	listen            string
	gossipBind        string
	advertise         string
	join, replicas    []string
	gossipKey         []byte
	insecureMesh      bool // --insecure-mesh: join without a key or peer mTLS (router_trust.go)
	logLevel          hclog.Level
	logJSON           bool
	maxBodyBytes      int64
	sessionHeader     string
	capacityBlocks    int
	loadFactor        float64
	policy            route.Policy // from the route flags (policyflags.go)
	apiAdvertise      string
	timing            mesh.Timing
	healthInterval    time.Duration
	contract          summary.Contract
	logOutput         io.Writer
	registerProcessGo bool // Go and process collectors (off in in-process tests: they are per process)
	sources           replicaSources
	kvEvents          kvEventsFlag // --kv-events (router_kvevents.go)

	// Edges (router_edges.go); zero values mean no cap or the default.
	adminListen          string // "" : no admin server
	tlsCert, tlsKey      string
	peerTLSCA            string
	peerCert, peerKey    string
	apiKeyFile           string
	maxConns             int
	maxInflightPerClient int
	clientSendBuffer     int
	upstreamRecvBuffer   int
	headerTimeout        time.Duration
	bodyTimeout          time.Duration
	writeTimeout         time.Duration
	upstreamIdleTimeout  time.Duration
	stallWindow          time.Duration
	noStreamLoop         bool
	idleTimeout          time.Duration
	retryBudget          time.Duration
	maxAttempts          int
	hopDispatchTimeout   time.Duration
	drainTimeout         time.Duration
	gossipStreams        mesh.StreamLimits
	// gcHeadroom: internal/gcpace's headroom in bytes (0: the runtime's
	// GOGC as it is); gogcSet: GOGC is in the environment, which wins.
	gcHeadroom int64
	gogcSet    bool
	// admission: the admission's limits (router_admit.go; MaxWaiting 0:
	// off).
	admission admit.Config
	tenants   tenantConfig // router_tenants.go
	// pd: how requests are split into prefill and decode legs
	// (--pd-protocol; disagg.None: not split); pdWarm: send prefill
	// replicas warm requests (--pd-warm, proxy.Config.PDWarm).
	pd     disagg.Protocol
	pdWarm bool
	// lateBind: keep the owned replicas' queues here (--late-bind,
	// proxy.Config.LateBind).
	lateBind bool
}

// parseRouterFlags parses args, then fills every flag not given on the
// command line from KVMESH_<FLAG> in the environment (getenv).
func parseRouterFlags(args []string, getenv func(string) (string, bool), stderr io.Writer) (routerConfig, error) {
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvmesh router --name NAME --region REGION --listen HOST:PORT --gossip-bind HOST:PORT
       [--advertise HOST:PORT] --join SEED [--join SEED ...]
       [--replica URL ...] [--replica-dns HOST:PORT|_service._proto.name] [--replica-file PATH] [flags]

Serves the OpenAI API (POST /v1/chat/completions, /v1/completions, /v1/responses,
/v1/embeddings, GET /v1/models) and Anthropic's POST /v1/messages in front of
the replicas declared here, and joins the mesh of routers that
gossip which prompt prefixes every replica holds. Also serves /healthz and
/readyz; /metrics, /debug/mesh and a status page for people (at /) are on
--admin-listen (loopback by default).
SIGHUP reloads --api-key-file, --replica-file, --tenant-budgets and the TLS certificates;
SIGTERM leaves the mesh, stops accepting, and drains for --drain-timeout.

Every flag can also be set in the environment as KVMESH_<FLAG> (upper case,
dashes as underscores, e.g. KVMESH_GOSSIP_BIND); the command line wins.
Repeatable flags take a comma-separated list from the environment.

flags:
`)
		fs.PrintDefaults()
	}
	var cfg routerConfig
	var join, replicas listFlag
	fs.StringVar(&cfg.name, "name", "", "this router's unique name in the mesh (required)")
	fs.StringVar(&cfg.region, "region", "", "region of this router; routers of one region are the nearest network tier")
	fs.StringVar(&cfg.listen, "listen", "127.0.0.1:8080", "HOST:PORT of the OpenAI API")
	fs.StringVar(&cfg.gossipBind, "gossip-bind", "0.0.0.0:7946", "HOST:PORT to bind gossip to (UDP and TCP)")
	fs.StringVar(&cfg.advertise, "advertise", "", "HOST:PORT peers use to reach this router's gossip (default: the bound address)")
	fs.Var(&join, "join", "seed router's gossip HOST:PORT, or a DNS name resolving to routers (repeatable)")
	fs.Var(&cfg.kvEvents, "kv-events", "subscribe to replicas' KV-cache events (vLLM's ZMQ publisher, bound with endpoint tcp://*:PORT) so that their summaries drop what the engines evict: auto (each declared replica's GET /kv_event_sources), or REPLICA_URL=tcp://HOST:PORT[,replay=tcp://HOST:PORT][,topic=TOPIC] (repeatable)")
	fs.Var(&replicas, "replica", "base URL of an OpenAI-compatible replica this router fronts, e.g. http://10.0.0.5:8000, with #prefill, #decode or #both after it for its role in disaggregated serving (#prefill:8998 with SGLang's KV bootstrap port) (repeatable)")
	lateBind := fs.Bool("late-bind", false, "keep the queues of the replicas this router owns: a request for an owned replica whose known slots are all taken waits here, not in that engine's queue, and goes to the first of the router's replicas that can start it, decided again (off by default: on real llama.cpp its tail gain was within noise and it cached fewer follow-ups; docs/BENCHMARKS.md)")
	pdWarm := fs.Bool("pd-warm", true, "with --pd-protocol: once a split request's answer is complete, send the replica that prefilled it the prompt and the answer as a prefill-only request, when that replica can start it at once, so that the conversation's next turn finds the answer cached there (--pd-warm=false: prefill replicas never hold answers)")
	pd := fs.String("pd-protocol", "off", "split chat and completions requests into a prefill leg (a prefill replica chosen by cache) and a decode leg (a decode replica chosen by load): off, vllm (kv_transfer_params, NIXL connector) or sglang (bootstrap_host/port/room)")
	keyFile := fs.String("gossip-key-file", "", "file holding the gossip encryption key: 16, 24 or 32 bytes, base64-encoded or raw; all routers must share it. It also authenticates the requests routers forward to each other; a router with --join needs it (or peer mutual TLS, or --insecure-mesh)")
	fs.BoolVar(&cfg.insecureMesh, "insecure-mesh", false, "let a router with --join run without --gossip-key-file or peer mutual TLS: gossip is then unauthenticated and the router believes the hop headers of anyone who reaches its API; only on a network you fully trust")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error or off")
	fs.BoolVar(&cfg.logJSON, "log-json", false, "log JSON lines instead of text")
	fs.Int64Var(&cfg.maxBodyBytes, "max-body-bytes", proxy.DefaultMaxBodyBytes, "largest accepted request body in bytes (larger: 413)")
	fs.StringVar(&cfg.sessionHeader, "session-header", proxy.DefaultSessionHeader, "request header whose value is a client routing key (\"-\": none); prompt_cache_key in the body takes precedence")
	fs.IntVar(&cfg.capacityBlocks, "capacity-blocks", 16384, "cache capacity in router blocks assumed for replicas whose engine does not report one (vLLM's does)")
	pf := bindPolicyFlags(fs)
	fs.StringVar(&cfg.apiAdvertise, "api-advertise", "", "base URL peers forward requests to (default: http://<listen>)")
	profile := fs.String("gossip-profile", "lan", "gossip timings: lan (one data centre), wan (regions apart) or test (fast, for local experiments)")
	fs.DurationVar(&cfg.healthInterval, "health-interval", 2*time.Second, "interval of the replicas' health checks")
	loadInterval := fs.String("load-interval", "", "how often at most an owner sends its peers the in-flight and pending prefill counts of its replicas whose load changed, when one changes (load beacons, UDP): a duration, 0 for none; empty takes the gossip profile's (lan 25ms, wan 100ms, test 10ms)")
	failedPeer := fs.Duration("failed-peer-timeout", 30*time.Minute, "how long a failed peer router is remembered and re-joined (seeds are re-joined for as long as they are missing)")
	fs.DurationVar(&cfg.hopDispatchTimeout, "hop-dispatch-timeout", hop.DefaultDispatchTimeout, "how long a request forwarded to a peer router (that announces its dispatches) may go without an answer before the peer is taken for dead and the request, never dispatched, is retried (0: off; a hop then is retried only when it provably was not sent)")
	finishReplicaFlags := replicaFlags(fs, &cfg.sources)
	edgeFlags(fs, &cfg)
	admitFlags(fs, &cfg)
	tenantFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("router: unexpected arguments %q", fs.Args())
	}
	if err := applyEnv(fs, getenv); err != nil {
		return cfg, err
	}
	cfg.join, cfg.replicas = join, replicas

	cfg.logLevel = hclog.LevelFromString(*logLevel)
	if cfg.logLevel == hclog.NoLevel {
		return cfg, fmt.Errorf("router: invalid --log-level %q (trace, debug, info, warn, error, off)", *logLevel)
	}
	if cfg.name == "" {
		return cfg, errors.New("router: --name is required")
	}
	if cfg.maxBodyBytes <= 0 {
		return cfg, fmt.Errorf("router: --max-body-bytes %d must be positive", cfg.maxBodyBytes)
	}
	policy, err := pf.Policy()
	if err != nil {
		return cfg, fmt.Errorf("router: %w", err)
	}
	cfg.policy = policy
	cfg.loadFactor = cfg.policy.LoadFactor
	if err := (summary.Params{CapacityBlocks: cfg.capacityBlocks, FalsePositiveRate: summary.DefaultFalsePositiveRate}).Validate(); err != nil {
		return cfg, fmt.Errorf("router: --capacity-blocks: %w", err)
	}
	if cfg.healthInterval <= 0 {
		return cfg, errors.New("router: --health-interval must be positive")
	}
	for i, r := range cfg.replicas {
		sp, err := parseReplicaSpec(r)
		if err != nil {
			return cfg, fmt.Errorf("router: --replica: %w", err)
		}
		if cfg.replicas[i] = sp.id; sp.declared {
			cfg.replicas[i] += "#" + sp.role.String()
			if sp.bootstrap != 0 {
				cfg.replicas[i] += ":" + strconv.Itoa(int(sp.bootstrap))
			}
		}
	}
	cfg.pdWarm = *pdWarm
	cfg.lateBind = *lateBind
	if cfg.pd, err = disagg.ParseProtocol(*pd); err != nil {
		return cfg, fmt.Errorf("router: --pd-protocol: %w", err)
	}
	if err := finishReplicaFlags(); err != nil {
		return cfg, err
	}
	if cfg.apiAdvertise != "" {
		if u, err := url.Parse(cfg.apiAdvertise); err != nil || u.Host == "" {
			return cfg, fmt.Errorf("router: --api-advertise %q is not a URL", cfg.apiAdvertise)
		}
	}
	switch *profile {
	case "lan":
		cfg.timing = mesh.LANTiming()
	case "wan":
		cfg.timing = wanTiming()
	case "test":
		cfg.timing = mesh.TestTiming()
	default:
		return cfg, fmt.Errorf("router: --gossip-profile %q is not lan, wan or test", *profile)
	}
	if *failedPeer <= 0 {
		return cfg, errors.New("router: --failed-peer-timeout must be positive")
	}
	cfg.timing.FailedPeerTimeout = *failedPeer
	if *loadInterval != "" {
		d, err := time.ParseDuration(*loadInterval)
		if err != nil || d < 0 || (d > 0 && d < time.Millisecond) {
			return cfg, fmt.Errorf("router: --load-interval %q: want 0 (no load beacons) or a duration of at least 1ms", *loadInterval)
		}
		cfg.timing.LoadInterval = d
	}
	if *keyFile != "" {
		key, err := readGossipKey(*keyFile)
		if err != nil {
			return cfg, err
		}
		cfg.gossipKey = key
	}
	if err := checkAdmitFlags(&cfg); err != nil {
		return cfg, err
	}
	if err := checkTenantFlags(&cfg); err != nil {
		return cfg, err
	}
	if err := checkEdgeFlags(&cfg); err != nil {
		return cfg, err
	}
	if err := checkMeshAuth(&cfg); err != nil {
		return cfg, err
	}
	if cfg.gcHeadroom < 0 {
		return cfg, fmt.Errorf("router: --gc-headroom %d must not be negative", cfg.gcHeadroom)
	}
	_, cfg.gogcSet = getenv("GOGC")
	cfg.contract = summary.DefaultContract()
	cfg.registerProcessGo = true
	return cfg, nil
}

// wanTiming is memberlist's WAN profile with a slower state period and a
// longer staleness window, for routers regions apart. Load beacons go
// every 100 ms: an owner sends them to every peer, the far regions'
// included, whose decisions read its replicas as tier 1 and seldom pick
// them; the routers of one region, which herd on a stale load as a LAN's
// do, still hear it ten times as often as the 1 s states say it, for a
// quarter of the LAN profile's packets.
func wanTiming() mesh.Timing {
	c := memberlist.DefaultWANConfig()
	t := mesh.LANTiming()
	t.GossipInterval, t.PushPullInterval = c.GossipInterval, c.PushPullInterval
	t.ProbeInterval, t.ProbeTimeout = c.ProbeInterval, c.ProbeTimeout
	t.SuspicionMult, t.TCPTimeout = c.SuspicionMult, c.TCPTimeout
	t.StateInterval, t.StaleAfter = time.Second, 30*time.Second
	t.LoadInterval = 100 * time.Millisecond
	t.ReconnectInterval = 60 * time.Second
	return t
}

// readGossipKey reads a gossip key file: base64 (as serf and consul
// keys are written) or the raw key bytes.
func readGossipKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("router: gossip key: %w", err)
	}
	s := strings.TrimSpace(string(b))
	key, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		key = []byte(s)
	}
	if err := memberlist.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("router: gossip key in %s: %w", path, err)
	}
	return key, nil
}

// runRouter serves the OpenAI API, fronts the declared replicas and joins
// the mesh until ctx is cancelled, then leaves and drains. A listener
// that fails stops the router at once with the listener's error.
func runRouter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseRouterFlags(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	cfg.logOutput = stderr
	if cfg.gcHeadroom > 0 && !cfg.gogcSet {
		// The GC percent is the process's: set here, in the command, not
		// by startRouter (tests run several routers in one process).
		pacer := gcpace.Start(uint64(cfg.gcHeadroom), gcMaxPercent, gcPaceInterval)
		defer pacer.Stop()
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	r, err := startRouter(ctx, cfg)
	if err != nil {
		return err
	}
	return r.run(ctx, hup)
}

// The router's GC pacing (--gc-headroom, internal/gcpace): the percent
// is at most 400 (the CPU per request stops improving much beyond it,
// docs/history/benchmarks.md, s17-reqcpu), and follows the live heap every few seconds.
const (
	gcMaxPercent   = 400
	gcPaceInterval = 5 * time.Second
)

// router is one running kvmesh router.
type router struct {
	name   string
	log    hclog.Logger
	reg    *prometheus.Registry
	mesh   *mesh.Mesh
	health *health.Checker
	kv     *kvEvents // --kv-events' subscriptions (router_kvevents.go)
	proxy  *proxy.Proxy
	srv    *http.Server
	ln     net.Listener
	tcpLn  net.Listener // ln's socket, under the limits and TLS
	api    string

	admin    *http.Server // nil without --admin-listen
	adminLn  net.Listener
	edges    routerEdges
	draining atomic.Bool
	quiet    *quiescer // the API's keep-alive connections, rested before the close
	// budgets are the tenants' budgets (nil: none), which reload reads
	// again from tenants' file.
	budgets *quota.Ledger
	tenants tenantConfig

	stopHealth context.CancelFunc
	wg         sync.WaitGroup
	serveErr   chan error
	// beforeStopAccepting runs in shutdown after the mesh is left and
	// before the API stops accepting (tests observe the order).
	beforeStopAccepting func()
}

// startRouter wires and starts a router: registry, logger, mesh, health
// checks, proxy and HTTP server. The router runs until shutdown.
func startRouter(ctx context.Context, cfg routerConfig) (*router, error) {
	out := cfg.logOutput
	if out == nil {
		out = os.Stderr
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "kvmesh", Level: cfg.logLevel, Output: out, JSONFormat: cfg.logJSON}).With("router", cfg.name)
	reg := prometheus.NewRegistry()
	if cfg.registerProcessGo {
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	edges, err := loadEdges(cfg, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return nil, fmt.Errorf("router: listen %s: %w", cfg.listen, err)
	}
	api := cfg.apiAdvertise
	if api == "" {
		scheme := "http://"
		if edges.serverTLS != nil {
			scheme = "https://"
		}
		api = scheme + advertisedHostPort(ln.Addr().(*net.TCPAddr))
	}
	var adminLn net.Listener
	if cfg.adminListen != "" {
		if adminLn, err = net.Listen("tcp", cfg.adminListen); err != nil {
			ln.Close()
			return nil, fmt.Errorf("router: admin listen %s: %w", cfg.adminListen, err)
		}
	}
	closeLns := func() {
		ln.Close()
		if adminLn != nil {
			adminLn.Close()
		}
	}
	budgets, err := tenantLedger(&cfg, reg)
	if err != nil {
		closeLns()
		return nil, err
	}
	m, err := mesh.New(ctx, mesh.Config{
		Name: cfg.name, Region: cfg.region, APIAddr: api,
		BindAddr: cfg.gossipBind, AdvertiseAddr: cfg.advertise, Join: cfg.join, SecretKey: cfg.gossipKey,
		Contract: cfg.contract, DefaultCapacityBlocks: cfg.capacityBlocks, Timing: cfg.timing,
		Streams: cfg.gossipStreams, Logger: log, Registerer: reg,
		Usage: meshUsage(&cfg, budgets), UsageInterval: cfg.tenants.interval,
	})
	if err != nil {
		closeLns()
		return nil, fmt.Errorf("router: %w", err)
	}
	// One recorder of recovered panics for every component that
	// contains them (internal/panics): one metric, one log throttle.
	rec := panics.New(reg, log)
	// Replicas are declared once they pass a health check (replicaSet).
	set := newReplicaSet(m, log.Named("replicas"), reg, cfg.pd != disagg.None)
	client := upstream.NewClientRecvBuffer(cfg.upstreamRecvBuffer)
	if edges.peerTLS != nil {
		client.Transport.(*http.Transport).TLSClientConfig = edges.peerTLS
	}
	// The replicas' bytes per token, learned by the proxy from their
	// answers, size their summaries in the health checks.
	ratios := proxy.NewTokenRatios()
	hc := health.New(health.Config{Interval: cfg.healthInterval, LoadInterval: cfg.sources.loadInterval, Engine: cfg.sources.engine, Panics: rec,
		BytesPerToken: ratios.Of},
		nil, client, set.onStatus, cfg.contract.BlockBytes, log.Named("health"), reg)
	set.health = hc
	kv := newKVEvents(cfg.kvEvents, m, client, log.Named("kvevents"))
	var answers func(string, proxy.Answered)
	if cfg.kvEvents.on() {
		reg.MustRegister(kv)
		set.onDeclare, set.onWithdraw, answers = kv.declared, kv.withdrawn, kv.answered
	}
	set.update("static", cfg.replicas)
	policy := cfg.policy
	if policy == (route.Policy{}) {
		policy = route.DefaultPolicy()
	}
	if cfg.loadFactor > 0 {
		policy.LoadFactor = cfg.loadFactor
	}
	r := &router{name: cfg.name, log: log, reg: reg, mesh: m, health: hc, kv: kv, api: api, edges: edges, serveErr: make(chan error, 2),
		budgets: budgets, tenants: cfg.tenants}
	p, err := proxy.New(proxy.Config{
		RouterName: cfg.name, View: m, Policy: policy, Contract: cfg.contract,
		MaxBodyBytes: cfg.maxBodyBytes, Client: client, Logger: log.Named("proxy"),
		Registerer: reg, Gatherer: reg, Panics: rec, Debug: r.debug, Ready: r.ready, ModelsKnown: r.modelsKnown, ReportFailure: hc.ReportFailure, ProbeLoad: hc.ProbeLoad, SlotsLearned: hc.SlotsLearned,
		MaxAttempts: cfg.maxAttempts, RetryBudget: cfg.retryBudget, BodyTimeout: cfg.bodyTimeout, WriteTimeout: cfg.writeTimeout,
		UpstreamIdleTimeout: offTimeout(cfg.upstreamIdleTimeout),
		StallWindow:         offTimeout(cfg.stallWindow), Stalled: hc.Stall,
		SharesQueuedPrefill:  func(id string) (bool, bool) { return hc.Engine(id).SharesQueuedPrefill() },
		HopDispatchTimeout:   offTimeout(cfg.hopDispatchTimeout),
		MaxInflightPerClient: cfg.maxInflightPerClient, HopKey: hop.Key(cfg.gossipKey),
		TrustPeerCerts: edges.serverTLS != nil && edges.peerCA != nil, RequirePeerTLS: edges.peerCA != nil, APIKeys: edges.keys,
		InsecureHops:  cfg.insecureMesh && !meshAuthenticated(&cfg),
		SessionHeader: cfg.sessionHeader, Peers: m.PeerAPIs, NoStreamLoop: cfg.noStreamLoop, TokenRatios: ratios,
		Admission: cfg.admissionConfig(), Quota: budgets, PD: cfg.pd, PDWarm: cfg.pdWarm, LateBind: cfg.lateBind, Answers: answers,
	})
	if err != nil {
		kv.close()
		closeLns()
		_ = m.Close(context.Background())
		return nil, fmt.Errorf("router: %w", err)
	}
	r.proxy = p
	r.tcpLn = ln
	r.ln = r.edgeListener(ln, cfg.maxConns, cfg.clientSendBuffer)
	r.srv = r.apiServer(cfg, p)
	if adminLn != nil {
		admin, err := withStatusPage(p.AdminHandler(), cfg.name, m, reg, budgets, log.Named("status"))
		if err != nil {
			closeLns()
			_ = m.Close(context.Background())
			return nil, err
		}
		r.adminLn = adminLn
		r.admin = &http.Server{Handler: p.ContainAdmin(admin), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute, ErrorLog: r.srv.ErrorLog}
	}
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stopHealth = stop
	r.wg.Add(2)
	go func() { defer r.wg.Done(); hc.Run(hctx) }()
	go func() { defer r.wg.Done(); runDiscovery(hctx, cfg.sources, set, log.Named("discover"), rec) }()
	r.serve("API", r.srv, r.ln)
	if r.admin != nil {
		r.serve("admin", r.admin, r.adminLn)
	}
	log.Info("router serving", "listen", ln.Addr().String(), "api", api, "admin", cfg.adminListen, "gossip", m.GossipAddr(),
		"replicas", strings.Join(cfg.replicas, ","), "seeds", strings.Join(cfg.join, ","))
	logMeshAuth(log, &cfg)
	return r, nil
}

// advertisedHostPort turns a bound address into one peers can dial: an
// unspecified IP (":8080") becomes the host name.
func advertisedHostPort(a *net.TCPAddr) string {
	host := a.IP.String()
	if a.IP == nil || a.IP.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, fmt.Sprint(a.Port))
}

// shutdown stops the router in the order that loses no request: it
// turns /readyz to 503, leaves the mesh (peers stop forwarding here and
// route around this router's replicas), then stops accepting and drains
// in-flight requests (streams included), then stops the health checks.
// All of it fits in the drain timeout (shutdownBudget), so a router
// SIGTERMed with its peers, all at once, exits within it too; a leave no
// peer heard is no error (mesh/leave.go). Safe to call more than once.
func (r *router) shutdown() error {
	var errs []error
	start := time.Now()
	b := shutdownBudget(r.edges.drainTimeout)
	r.draining.Store(true)
	lctx, lcancel := context.WithTimeout(context.Background(), b.leave)
	if err := r.mesh.Close(lctx); err != nil {
		errs = append(errs, err)
	}
	lcancel()
	r.log.Info("left the mesh; draining in-flight requests", "timeout", r.edges.drainTimeout, "took", time.Since(start).Round(time.Millisecond))
	if r.beforeStopAccepting != nil {
		r.beforeStopAccepting()
	}
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(r.edges.drainTimeout-b.reserve))
	defer cancel()
	qctx, qcancel := context.WithTimeout(ctx, 4*b.rest)
	r.quiet.wait(qctx, b.rest)
	qcancel()
	qctx, qcancel = context.WithTimeout(ctx, b.rest)
	if err := awaitAcceptQueue(qctx, r.tcpLn); err != nil {
		r.log.Debug("closing the API listener with connections queued", "error", err)
	}
	qcancel()
	if err := r.srv.Shutdown(ctx); err != nil {
		r.log.Warn("drain timed out; closing remaining connections", "error", err)
		_ = r.srv.Close()
	}
	if r.admin != nil {
		actx, acancel := context.WithTimeout(context.Background(), b.admin)
		if r.admin.Shutdown(actx) != nil {
			_ = r.admin.Close()
		}
		acancel()
	}
	r.stopHealth()
	r.wg.Wait()
	r.kv.close()
	for done := false; !done; {
		select {
		case err := <-r.serveErr:
			errs = append(errs, err)
		default:
			done = true
		}
	}
	r.proxy.Close() // the stream loops, the own upstream pool and the net/http client's idle connections
	r.log.Info("router stopped", "took", time.Since(start).Round(time.Millisecond))
	return errors.Join(errs...)
}

// stopBudget splits the drain timeout among the steps of a shutdown.
type stopBudget struct {
	leave   time.Duration // at most, for the leave broadcast
	reserve time.Duration // kept from the drain for the steps after it
	admin   time.Duration // the admin server's own drain (a scrape), within reserve
	// rest is how long an idle keep-alive connection rests before the
	// close (quiescer); the wait for it takes at most 4× rest.
	rest time.Duration
}

// shutdownBudget bounds a shutdown by the drain timeout d: the leave
// takes at most a quarter of it (and 2 s; it needs less when peers
// listen, mesh/leave.go), the steps after the drain a tenth (and 1 s),
// and the drain the rest, counted from the SIGTERM. Idle connections
// rest a twentieth of it (and 500 ms) before the close: long next to a
// busy client's gap between two requests, short next to a rollout.
func shutdownBudget(d time.Duration) stopBudget {
	reserve := min(time.Second, d/10)
	return stopBudget{leave: max(min(2*time.Second, d/4), time.Millisecond), reserve: reserve, admin: reserve / 2, rest: min(500*time.Millisecond, d/20)}
}

// offTimeout maps a timeout flag whose 0 turns the bound off
// (--hop-dispatch-timeout, --upstream-idle-timeout) to proxy.Config's
// field, in which 0 is the default and a negative value none.
func offTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
