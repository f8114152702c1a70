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
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// drainTimeout bounds how long a stopping router waits for in-flight
// requests (streams included) before cutting them.
const drainTimeout = 10 * time.Second

// routerConfig is the parsed command line of `kvmesh router`.
type routerConfig struct {
	name, region      string
	listen            string
	gossipBind        string
	advertise         string
	join, replicas    []string
	gossipKey         []byte
	logLevel          hclog.Level
	logJSON           bool
	maxBodyBytes      int64
	capacityBlocks    int
	loadFactor        float64
	policy            route.Policy // from the route flags (policyflags.go)
	apiAdvertise      string
	timing            mesh.Timing
	healthInterval    time.Duration
	contract          summary.Contract
	logOutput         io.Writer
	registerProcessGo bool // Go and process collectors (off in in-process tests: they are per process)
}

// parseRouterFlags parses args, then fills every flag not given on the
// command line from KVMESH_<FLAG> in the environment (getenv).
func parseRouterFlags(args []string, getenv func(string) (string, bool), stderr io.Writer) (routerConfig, error) {
	fs := flag.NewFlagSet("router", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: kvmesh router --name NAME --region REGION --listen HOST:PORT --gossip-bind HOST:PORT
       [--advertise HOST:PORT] --join SEED [--join SEED ...] --replica URL [--replica URL ...] [flags]

Serves the OpenAI API (POST /v1/chat/completions, /v1/completions, GET /v1/models)
in front of the replicas declared here, and joins the mesh of routers that
gossip which prompt prefixes every replica holds. Also serves /healthz,
/readyz, /metrics and /debug/mesh.

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
	fs.Var(&replicas, "replica", "base URL of an OpenAI-compatible replica this router fronts, e.g. http://10.0.0.5:8000 (repeatable)")
	keyFile := fs.String("gossip-key-file", "", "file holding the gossip encryption key: 16, 24 or 32 bytes, base64-encoded or raw; all routers must share it")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error or off")
	fs.BoolVar(&cfg.logJSON, "log-json", false, "log JSON lines instead of text")
	fs.Int64Var(&cfg.maxBodyBytes, "max-body-bytes", proxy.DefaultMaxBodyBytes, "largest accepted request body in bytes (larger: 413)")
	fs.IntVar(&cfg.capacityBlocks, "capacity-blocks", 16384, "cache capacity in router blocks assumed for replicas whose engine does not report one (vLLM's does)")
	pf := bindPolicyFlags(fs)
	fs.StringVar(&cfg.apiAdvertise, "api-advertise", "", "base URL peers forward requests to (default: http://<listen>)")
	profile := fs.String("gossip-profile", "lan", "gossip timings: lan (one data centre), wan (regions apart) or test (fast, for local experiments)")
	fs.DurationVar(&cfg.healthInterval, "health-interval", 2*time.Second, "interval of the replicas' health checks")
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
		u, err := url.Parse(r)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return cfg, fmt.Errorf("router: --replica %q is not an http(s) URL", r)
		}
		cfg.replicas[i] = strings.TrimRight(r, "/")
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
	if *keyFile != "" {
		key, err := readGossipKey(*keyFile)
		if err != nil {
			return cfg, err
		}
		cfg.gossipKey = key
	}
	cfg.contract = summary.DefaultContract()
	cfg.registerProcessGo = true
	return cfg, nil
}

// wanTiming is memberlist's WAN profile with a slower state period and a
// longer staleness window, for routers regions apart.
func wanTiming() mesh.Timing {
	c := memberlist.DefaultWANConfig()
	t := mesh.LANTiming()
	t.GossipInterval, t.PushPullInterval = c.GossipInterval, c.PushPullInterval
	t.ProbeInterval, t.ProbeTimeout = c.ProbeInterval, c.ProbeTimeout
	t.SuspicionMult, t.TCPTimeout = c.SuspicionMult, c.TCPTimeout
	t.StateInterval, t.StaleAfter = time.Second, 30*time.Second
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
// the mesh until ctx is cancelled, then drains and leaves.
func runRouter(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseRouterFlags(args, os.LookupEnv, stderr)
	if err != nil {
		return err
	}
	cfg.logOutput = stderr
	r, err := startRouter(ctx, cfg)
	if err != nil {
		return err
	}
	<-ctx.Done()
	return r.shutdown()
}

// router is one running kvmesh router.
type router struct {
	name   string
	log    hclog.Logger
	reg    *prometheus.Registry
	mesh   *mesh.Mesh
	health *proxy.HealthChecker
	proxy  *proxy.Proxy
	client *http.Client
	srv    *http.Server
	ln     net.Listener
	api    string

	stopHealth context.CancelFunc
	wg         sync.WaitGroup
	serveErr   chan error
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
	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return nil, fmt.Errorf("router: listen %s: %w", cfg.listen, err)
	}
	api := cfg.apiAdvertise
	if api == "" {
		api = "http://" + advertisedHostPort(ln.Addr().(*net.TCPAddr))
	}
	m, err := mesh.New(ctx, mesh.Config{
		Name: cfg.name, Region: cfg.region, APIAddr: api,
		BindAddr: cfg.gossipBind, AdvertiseAddr: cfg.advertise, Join: cfg.join, SecretKey: cfg.gossipKey,
		Contract: cfg.contract, DefaultCapacityBlocks: cfg.capacityBlocks, Timing: cfg.timing,
		Logger: log, Registerer: reg,
	})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("router: %w", err)
	}
	for _, id := range cfg.replicas {
		m.DeclareReplica(id)
	}
	client := proxy.NewClient()
	hc := proxy.NewHealthChecker(proxy.HealthConfig{Interval: cfg.healthInterval}, cfg.replicas, client,
		func(id string, models []string, healthy bool, capacityBlocks int) {
			m.UpdateReplica(id, mesh.ReplicaStatus{Models: models, Healthy: healthy, CapacityBlocks: capacityBlocks})
		}, cfg.contract.BlockBytes, log.Named("health"), reg)
	policy := cfg.policy
	if policy == (route.Policy{}) {
		policy = route.DefaultPolicy()
	}
	if cfg.loadFactor > 0 {
		policy.LoadFactor = cfg.loadFactor
	}
	p, err := proxy.New(proxy.Config{
		RouterName: cfg.name, View: m, Policy: policy, Contract: cfg.contract,
		MaxBodyBytes: cfg.maxBodyBytes, Client: client, Logger: log.Named("proxy"),
		Registerer: reg, Gatherer: reg, Debug: m.Debug, Ready: hc.Ready, ReportFailure: hc.ReportFailure,
	})
	if err != nil {
		ln.Close()
		_ = m.Close(context.Background())
		return nil, fmt.Errorf("router: %w", err)
	}
	r := &router{name: cfg.name, log: log, reg: reg, mesh: m, health: hc, proxy: p, client: client, ln: ln, api: api, serveErr: make(chan error, 1)}
	r.srv = &http.Server{
		Handler: p,
		// No WriteTimeout: a generation streams for minutes.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          log.Named("http").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.stopHealth = stop
	r.wg.Add(2)
	go func() { defer r.wg.Done(); hc.Run(hctx) }()
	go func() {
		defer r.wg.Done()
		if err := r.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			r.serveErr <- err
		}
	}()
	log.Info("router serving", "listen", ln.Addr().String(), "api", api, "gossip", m.GossipAddr(),
		"replicas", strings.Join(cfg.replicas, ","), "seeds", strings.Join(cfg.join, ","))
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

// shutdown stops accepting, drains in-flight requests for up to
// drainTimeout, stops the health checks and leaves the mesh.
func (r *router) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
	defer cancel()
	var errs []error
	if err := r.srv.Shutdown(ctx); err != nil {
		r.log.Warn("drain timed out; closing remaining connections", "error", err)
		_ = r.srv.Close()
	}
	r.stopHealth()
	r.wg.Wait()
	select {
	case err := <-r.serveErr:
		errs = append(errs, fmt.Errorf("router: serve: %w", err))
	default:
	}
	lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer lcancel()
	if err := r.mesh.Close(lctx); err != nil {
		errs = append(errs, err)
	}
	r.client.CloseIdleConnections()
	r.log.Info("router stopped")
	return errors.Join(errs...)
}
