// Package proxy is the HTTP front of a kvmesh router: the OpenAI
// endpoints, body limits, the routing decision of each request, forwarding
// to an owned replica or to the owner of a remote one, retries before the
// first response byte, unbuffered streaming, and recording what each owned
// replica now holds. It reads the cluster through View and never imports
// the mesh.
package proxy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/kvmesh/kvmesh/internal/ratelog"
	"github.com/kvmesh/kvmesh/proxy/reply"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Hint headers of a request forwarded to a replica's owner.
const (
	// HeaderReplica names the replica the deciding router chose.
	HeaderReplica = "X-Kvmesh-Replica"
	// HeaderHop marks a forwarded request: its receiver never forwards it
	// again.
	HeaderHop = "X-Kvmesh-Hop"
	// HeaderMatch is the deciding router's predicted prefix match in blocks.
	HeaderMatch = "X-Kvmesh-Match"
)

// DefaultMaxBodyBytes is the default request body limit: a 128K-token
// prompt is ~512 KB of text; JSON escaping and inline images need headroom.
const DefaultMaxBodyBytes = 16 << 20

// bytesPerToken converts predicted blocks into predicted tokens for the
// cached-token comparison (English text averages ~4 bytes per token).
const bytesPerToken = 4

// Config configures a Proxy.
type Config struct {
	// RouterName names this router in logs.
	RouterName string
	// View is the router's view of the mesh (required).
	View View
	// Policy makes the routing decision.
	Policy route.Policy
	// Contract is the hashing contract shared by the mesh.
	Contract summary.Contract
	// MaxBodyBytes limits request bodies (default DefaultMaxBodyBytes).
	MaxBodyBytes int64
	// Client reaches replicas and peer routers (default: NewClient()).
	Client *http.Client
	// MaxAttempts caps the upstream attempts of one request (default 3).
	MaxAttempts int
	// RetryBudget is the time from the first attempt within which another
	// may start (default DefaultRetryBudget). Only requests that provably
	// never reached a replica are retried (see retry.go).
	RetryBudget time.Duration
	// HopDispatchTimeout is how long a hop to an owner known to announce
	// its dispatches (hop.go) may go without a byte before it is taken
	// for a dead owner and retried (default DefaultHopDispatchTimeout;
	// negative: the entry's side of the protocol is off, and every hop
	// follows retry.go's conservative rule).
	HopDispatchTimeout time.Duration
	// BodyTimeout bounds reading a request body (default
	// DefaultBodyTimeout; negative: none).
	BodyTimeout time.Duration
	// WriteTimeout bounds each write of a relayed response to its client
	// (default DefaultWriteTimeout; negative: none): a client that reads
	// nothing for that long is taken for gone.
	WriteTimeout time.Duration
	// UpstreamIdleTimeout bounds the silence of an upstream (a replica,
	// or a peer router on a hop) in the middle of a response body, once
	// its headers arrived (default DefaultUpstreamIdleTimeout; negative:
	// none; a hop's is hopIdleSlack longer): the response is then ended
	// (an SSE stream with an error event, midstream.go) and the
	// upstream's connection closed (idle.go).
	UpstreamIdleTimeout time.Duration
	// MaxInflightPerClient caps concurrent inference requests per client
	// IP address (0: no cap).
	MaxInflightPerClient int
	// HopKey authenticates the hints of forwarded requests (HopKey of the
	// gossip key); nil leaves hints unauthenticated unless TrustPeerCerts.
	HopKey []byte
	// TrustPeerCerts accepts hints on requests that came over TLS with a
	// client certificate the server verified (the peer CA's).
	TrustPeerCerts bool
	// RequirePeerTLS refuses to forward to a peer whose API is not https,
	// so no prompt crosses the network in plain text.
	RequirePeerTLS bool
	// APIKeys, when set, are the bearer keys clients must present on the
	// /v1 endpoints (401 otherwise). Authenticated hops skip the check.
	APIKeys *KeySet
	// Logger logs (default: null logger).
	Logger hclog.Logger
	// Registerer registers the proxy's metrics (default: none).
	Registerer prometheus.Registerer
	// Panics counts and logs the panics the proxy recovers (default: its
	// own, registered with Registerer). A router shares one among every
	// component that recovers, so the metric is registered once.
	Panics *panics.Recorder
	// Gatherer serves GET /metrics on the admin handler (nil: 404).
	Gatherer prometheus.Gatherer
	// Debug serves GET /debug/mesh as JSON on the admin handler (nil: 404).
	Debug func() any
	// Ready answers GET /readyz (nil: always ready).
	Ready func() bool
	// ModelsKnown reports whether the models of the mesh are known (the
	// first health checks are done); until then a request for a model no
	// replica is known to serve gets 503 + Retry-After, not 404. Nil:
	// known once any model is.
	ModelsKnown func() bool
	// ReportFailure is told of passive failures of owned replicas seen on
	// the request path (HealthChecker.ReportFailure); nil ignores them.
	ReportFailure func(replicaID string)
	// SessionHeader names the request header whose value is a client
	// routing key ("" means DefaultSessionHeader, "-" none).
	SessionHeader string
	// MaxResponses bounds the response ids remembered for
	// previous_response_id routing (default DefaultMaxResponses).
	MaxResponses int
	// NoStreamLoop turns the stream loop off (streamloop.go): every
	// stream is relayed by its handler's goroutine.
	NoStreamLoop bool
	// Peers lists the other routers' API base URLs; a router asks them
	// about stored responses it did not relay (lookup.go). Nil: none.
	Peers func() []string
}

// Proxy is the HTTP handler of one router. It is safe for concurrent use.
type Proxy struct {
	cfg    Config
	log    hclog.Logger
	m      *metrics
	edge   *edgeMetrics
	client *http.Client
	// up reaches owned plain-HTTP replicas (upstream.go); nil when
	// Config.Client is not a plain net/http Transport.
	up      *upstreamClient
	metrics http.Handler
	// sessionHeader is the client routing key header ("" for none).
	sessionHeader string
	// responses maps response ids to the replicas that produced them.
	responses *responseLRU
	lookups   *lookups
	clients   *clientLimiter // nil: no per-client cap
	junk      junkLog
	panics    *panics.Recorder // recover.go
	now       func() time.Time
	// load counts this router's in-flight requests by heat key and times
	// its replicas' slots (load.go).
	load *loadBook
	// hops counts this router's requests to other routers' replicas into
	// their gossiped loads (hopload.go); clock is the view's, if it has one.
	hops  *hopBook
	clock loadClock
	// places makes this router's decisions serializable: each books its
	// request before the next one reads the loads (place.go).
	places placeBook
	// loadsRead, in tests, runs after a decision has read the loads and
	// before placeBook checks that no commit overlapped the read.
	loadsRead func()
	// loops relay SSE streams by their sockets (streamloop.go); nil when
	// off or not on Linux.
	loops *streamLoops
	// answers bounds the answer bytes all streams hold.
	answers *reply.Budget
	// owners holds the hops in flight by owner, to end those of an owner
	// the mesh lost (ownergone.go); stopGone stops the view's events.
	owners   *ownerHops
	stopGone func()
}

// NewClient returns the default client to replicas and peers: keep-alive
// connections, many idle ones per host, no overall timeout (streams are
// long) and a response-header timeout long enough for a non-streaming
// generation, whose headers only come when it is complete. Compression is
// off so that streams pass through unbuffered and answers can be read.
// Its connections remember whether a peer router announced a dispatch on
// them (hop.go), which lets a failed hop be retried safely. The write
// buffer holds a request's headers and a body of up to about 60 KB, so
// that it leaves in one write (one segment, one wake-up of the replica)
// where the default 4 KB buffer took two writes for an 8 KB prompt, the
// second through a fresh 32 KB copy buffer. Its connections' receive
// buffers are DefaultUpstreamRecvBuffer (NewClientRecvBuffer sets another).
func NewClient() *http.Client { return NewClientRecvBuffer(DefaultUpstreamRecvBuffer) }

// NewClientRecvBuffer is NewClient with the receive buffer (SO_RCVBUF) of
// every connection it dials set to bytes (0: the kernel's default,
// autotuned). The one dialer serves both the router's own upstream client
// and net/http's transport (hops, TLS), so every connection to a replica
// or a peer gets it. It is set before connect, when it still decides the
// window scale the router offers: set after, the connection would keep
// the large scale autotuning chose, only capped.
func NewClientRecvBuffer(bytes int) *http.Client {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	if bytes > 0 {
		d.Control = recvBufferControl(bytes)
	}
	return &http.Client{Transport: &http.Transport{
		WriteBufferSize:       upstreamWriteBuffer,
		DialContext:           markingDial(d.DialContext),
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: upstreamHeaderTimeout,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}}
}

// upstreamHeaderTimeout bounds the wait for a response to start: the
// headers of a non-streamed generation, which come once it is complete,
// and the first body byte of a stream, whose headers an engine sends at
// once but whose first token waits for the queue and the prefill
// (idle.go).
const upstreamHeaderTimeout = 10 * time.Minute

// DefaultUpstreamRecvBuffer is the receive buffer (SO_RCVBUF) of each
// connection to a replica or a peer router. When a client stalls a
// stream (its API connection's send buffer full, DefaultClientSendBuffer),
// the router stops reading the replica, whose bytes then fill the
// router's receive queue: Linux autotunes it up to tcp_rmem's maximum
// (6 MB by the kernel's default), and it stays until the write timeout,
// about 1 MB per stalled stream measured (docs/RELIABILITY.md). A set
// buffer is fixed (Linux doubles it for its bookkeeping, caps it at
// net.core.rmem_max and turns autotuning off), so a stalled stream pins
// at most about twice this in kernel memory. The default is safe for
// throughput: the window is a buffer per round trip, 256 KB per 1 ms is
// 256 MB/s on a local link, and an LLM stream is kilobytes per second; a
// cross-region hop at 100 ms still gets 2.5 MB/s per connection, enough
// for streams but a cap on a bulk answer (a large embeddings response)
// that far away. 0 restores the kernel's autotuning.
const DefaultUpstreamRecvBuffer = 256 << 10

// recvBufferControl returns a net.Dialer Control that sets the receive
// buffer of each socket before it connects. A failure leaves the kernel's
// buffer: not a reason to fail the dial.
func recvBufferControl(bytes int) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = setRecvBuffer(fd, bytes) })
	}
}

// upstreamWriteBuffer is the write buffer of each upstream connection.
const upstreamWriteBuffer = 64 << 10

// New returns a Proxy.
func New(cfg Config) (*Proxy, error) {
	if cfg.View == nil {
		return nil, errors.New("proxy: Config.View is required")
	}
	if err := cfg.Contract.Validate(); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if cfg.Policy.LoadFactor < 1 {
		return nil, fmt.Errorf("proxy: load factor %v must be at least 1", cfg.Policy.LoadFactor)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.Client == nil {
		cfg.Client = NewClient()
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.RetryBudget <= 0 {
		cfg.RetryBudget = DefaultRetryBudget
	}
	if cfg.HopDispatchTimeout == 0 {
		cfg.HopDispatchTimeout = DefaultHopDispatchTimeout
	}
	if cfg.BodyTimeout == 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.UpstreamIdleTimeout == 0 {
		cfg.UpstreamIdleTimeout = DefaultUpstreamIdleTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Panics == nil {
		cfg.Panics = panics.New(cfg.Registerer, cfg.Logger)
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, m: newMetrics(cfg.Registerer), edge: newEdgeMetrics(cfg.Registerer), client: cfg.Client,
		junk: junkLog{log: cfg.Logger, lim: ratelog.New(5, time.Second)}, panics: cfg.Panics, now: time.Now,
		sessionHeader: cfg.SessionHeader, responses: newResponseLRU(cfg.MaxResponses),
		lookups: newLookups(cfg.Registerer),
		load:    newLoadBook(), hops: newHopBook(), up: newUpstreamClient(cfg.Client), answers: reply.NewBudget(reply.BudgetBytes)}
	p.clock, _ = cfg.View.(loadClock)
	p.owners = newOwnerHops(p.probeOwner, func(end string) { p.m.ownerGone.WithLabelValues(end).Inc() }, cfg.Logger)
	if gw, ok := cfg.View.(goneWatcher); ok {
		p.stopGone = gw.WatchGone(p.owners.gone)
	}
	if !cfg.NoStreamLoop {
		p.loops = newStreamLoops(p.m, p.recovered)
	}
	if cfg.MaxInflightPerClient > 0 {
		p.clients = &clientLimiter{max: cfg.MaxInflightPerClient, n: map[string]int{}}
	}
	switch cfg.SessionHeader {
	case "":
		p.sessionHeader = DefaultSessionHeader
	case "-":
		p.sessionHeader = ""
	}
	if cfg.Gatherer != nil {
		p.metrics = promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{
			ErrorLog: cfg.Logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Error}),
		})
	}
	return p, nil
}

// Endpoint labels of kvmesh_requests_total.
const (
	epChat        = "chat_completions"
	epCompletions = "completions"
	epModels      = "models"
)

// ServeHTTP serves the OpenAI endpoints, /healthz and /readyz. Every
// other path is a plain 404; /metrics and /debug/mesh are on
// AdminHandler, which the router serves on its own (loopback) address.
//
// A panic in a handler is contained here (recover.go): the client gets an
// OpenAI-shaped 500, or a broken stream when the head was sent already.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := trackedWriters.Get().(*trackedWriter)
	t.ResponseWriter, t.wrote = w, false
	defer p.contain(t)
	p.serve(t, r)
}

// serve is ServeHTTP under its recovery.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	p.setBodyDeadline(w, r)
	switch r.URL.Path {
	case "/v1/chat/completions":
		p.inference(w, r, &chatAPI)
	case "/v1/completions":
		p.inference(w, r, &completionAPI)
	case "/v1/responses":
		p.serveResponses(w, r)
	case "/v1/messages":
		p.inference(w, r, &messagesAPI)
	case "/v1/embeddings":
		p.inference(w, r, &embeddingsAPI)
	case "/v1/models":
		if !allow(w, r, http.MethodGet) || !p.authorize(w, r) {
			return
		}
		p.models(w)
	case "/healthz", "/readyz":
		p.probe(w, r)
	case LookupPath:
		p.serveLookup(w, r)
	default:
		if strings.HasPrefix(r.URL.Path, responsesPrefix) {
			p.serveResponseByID(w, r)
			return
		}
		abandonBody(w, r)
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	}
}

// AdminHandler serves what operators read and strangers must not:
// /metrics, /debug/mesh, and the probes again.
func (p *Proxy) AdminHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz", "/readyz":
			p.probe(w, r)
		case "/metrics":
			if p.metrics == nil {
				writeError(w, http.StatusNotFound, "metrics are not enabled")
				return
			}
			if allow(w, r, http.MethodGet) {
				p.metrics.ServeHTTP(w, r)
			}
		case "/debug/mesh":
			if p.cfg.Debug == nil {
				writeError(w, http.StatusNotFound, "no debug view")
				return
			}
			if !allow(w, r, http.MethodGet) {
				return
			}
			b, err := json.MarshalIndent(p.cfg.Debug(), "", "  ")
			if err != nil {
				writeError(w, http.StatusInternalServerError, "debug view: "+err.Error())
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(append(b, '\n'))
		default:
			writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
		}
	})
}

// probe answers /healthz (the process serves) and /readyz (Config.Ready:
// the router can route a request now).
func (p *Proxy) probe(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	if r.URL.Path == "/healthz" {
		writeText(w, http.StatusOK, "ok")
		return
	}
	if p.cfg.Ready == nil || p.cfg.Ready() {
		writeText(w, http.StatusOK, "ready")
		return
	}
	w.Header().Set("Retry-After", "1")
	writeText(w, http.StatusServiceUnavailable, "not ready")
}

func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	abandonBody(w, r)
	w.Header().Set("Allow", method)
	writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
	return false
}

func writeText(w http.ResponseWriter, status int, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(s + "\n"))
}

// modelList is the OpenAI GET /v1/models response.
type modelList struct {
	Object string      `json:"object"`
	Data   []modelInfo `json:"data"`
}

type modelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (p *Proxy) models(w http.ResponseWriter) {
	names := p.cfg.View.Models()
	l := modelList{Object: "list", Data: make([]modelInfo, 0, len(names))}
	for _, n := range names {
		l.Data = append(l.Data, modelInfo{ID: n, Object: "model", OwnedBy: "kvmesh"})
	}
	b, _ := json.Marshal(l)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
	p.m.countRequest(epModels, http.StatusOK)
}

// modelsKnown reports whether the mesh's models are known yet.
func (p *Proxy) modelsKnown() bool {
	if p.cfg.ModelsKnown != nil {
		return p.cfg.ModelsKnown()
	}
	return len(p.cfg.View.Models()) > 0
}

// modelKnown reports whether any replica in the mesh serves model.
func (p *Proxy) modelKnown(model string) bool {
	_, ok := slices.BinarySearch(p.cfg.View.Models(), model)
	return ok
}

// CloseIdleConnections closes the idle upstream connections of both the
// router's own client (upstream.go) and Config.Client, for a shutdown.
func (p *Proxy) CloseIdleConnections() {
	if p.up != nil {
		p.up.closeIdle()
	}
	p.client.CloseIdleConnections()
}

// Close stops the stream loops (their streams, if any remain, finish on
// their handlers' goroutines), stops hearing of routers gone (ending the
// probes in progress) and closes idle upstream connections. The Proxy
// serves on afterwards, without the loops, its hops left to their
// timeouts.
func (p *Proxy) Close() {
	if p.stopGone != nil {
		p.stopGone()
	}
	p.owners.close()
	if p.loops != nil {
		p.loops.close()
	}
	p.CloseIdleConnections()
}
