// Package proxy is the OpenAI front of a kvmesh router: the endpoints,
// admission (API keys, connection and per-client caps, body limits), the
// OpenAI-shaped errors, and the request path: the routing decision of
// each request, its placement, forwarding to an owned replica or to the
// owner of a remote one, retries before the first response byte,
// unbuffered streaming, and recording what each owned replica now holds
// (request.go, then relay.go). It reads the cluster through View and never
// imports the mesh. How it reaches upstreams is package upstream's, the
// protocol between routers package hop's, and the replicas' health checks
// package health's.
package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/kvmesh/kvmesh/internal/ratelog"
	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/proxy/disagg"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/kvmesh/kvmesh/proxy/reply"
	"github.com/kvmesh/kvmesh/proxy/upstream"
	"github.com/kvmesh/kvmesh/route"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultMaxBodyBytes is the default request body limit: a 128K-token
// prompt is ~512 KB of text; JSON escaping and inline images need headroom.
const DefaultMaxBodyBytes = 16 << 20

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
	// Client reaches replicas and peer routers (default: upstream.NewClient()).
	Client *http.Client
	// MaxAttempts caps the upstream attempts of one request (default 3).
	MaxAttempts int
	// RetryBudget is the time from the first attempt within which another
	// may start (default DefaultRetryBudget). Only requests that provably
	// never reached a replica are retried (see retry.go).
	RetryBudget time.Duration
	// HopDispatchTimeout is how long a hop to an owner known to announce
	// its dispatches (hop.go) may go without a byte before it is taken
	// for a dead owner and retried (default hop.DefaultDispatchTimeout;
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
	// upstream's connection closed (upstream.IdleWatch).
	UpstreamIdleTimeout time.Duration
	// MaxInflightPerClient caps concurrent inference requests per client
	// IP address (0: no cap).
	MaxInflightPerClient int
	// HopKey authenticates the hints of forwarded requests (hop.Key of the
	// gossip key); nil leaves hints unauthenticated unless TrustPeerCerts.
	HopKey []byte
	// TrustPeerCerts accepts hints on requests that came over TLS with a
	// client certificate the server verified (the peer CA's).
	TrustPeerCerts bool
	// InsecureHops, without a HopKey, follows hints that nothing
	// authenticates (--insecure-mesh): anyone who reaches the API can
	// then steer requests. Without it, a router with neither a HopKey nor
	// a verified peer certificate on the request ignores every hint
	// (trust.go).
	InsecureHops bool
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
	// SharesQueuedPrefill says whether owned replica id's engine lets a
	// request reuse the prompt blocks of the requests it accepted before
	// it (engine.Kind.SharesQueuedPrefill of the engine the health checks
	// detected), and whether that is known; when it is not (nil, or
	// known false) each answer's timing decides (inflight.go).
	SharesQueuedPrefill func(replicaID string) (shares, known bool)
	// ReportFailure is told of passive failures of owned replicas seen on
	// the request path (health.Checker.ReportFailure); nil ignores them.
	ReportFailure func(replicaID string)
	// SlotsLearned reports that owned replica id's slots were learnt
	// from its queue (health.Checker.SlotsLearned), not published: late
	// binding treats the count as a floor (latebind.go). Nil: published.
	SlotsLearned func(replicaID string) bool
	// ProbeLoad is told, at each request sent to an owned replica, how
	// many this router now has in flight there
	// (health.Checker.ProbeLoad, which reads an engine of unknown slots
	// at once when that is more than it was seen running). Nil: none.
	ProbeLoad func(replicaID string, inFlight int)
	// Stalled judges an owned replica whose requests in flight got no
	// response byte, and none ended, since quiet for StallWindow past
	// the prefill the router expects of them (stall.go;
	// health.Checker.Stall, which ejects it); when it says stalled,
	// those requests are ended. Nil: no stall detection.
	Stalled func(replicaID string, quiet time.Time, streamed bool) bool
	// StallWindow is that silence (default DefaultStallWindow; negative:
	// no stall detection).
	StallWindow time.Duration
	// SessionHeader names the request header whose value is a client
	// routing key ("" means DefaultSessionHeader, "-" none).
	SessionHeader string
	// MaxResponses bounds the response ids remembered for
	// previous_response_id routing (default DefaultMaxResponses).
	MaxResponses int
	// NoStreamLoop turns the stream loop off (upstream.Loops): every
	// stream is relayed by its handler's goroutine.
	NoStreamLoop bool
	// Peers lists the other routers' API base URLs; a router asks them
	// about stored responses it did not relay (lookup.go). Nil: none.
	Peers func() []string
	// Admission, when set, queues and sheds requests while their model's
	// replicas are saturated (package admit; the proxy sets its Room and
	// Registerer). Nil: every request goes straight to its decision.
	Admission *admit.Config
	// Quota, when set, holds each tenant to its token budget across the
	// mesh (package quota; tenants.go): over it, a request is answered
	// 429 before it queues. Nil: no budgets.
	Quota *quota.Ledger
	// TokenRatios learns each owned replica's bytes per token from its
	// answers (tokens.go); the router shares it with its health checks.
	// Nil: the proxy's own. The proxy registers it with Registerer.
	TokenRatios *TokenRatios
	// PD splits chat and completions requests into a prefill leg and a
	// decode leg by this protocol (pd.go); disagg.None (the zero): no
	// request is split, and only whole replicas (route.RoleBoth) serve.
	PD disagg.Protocol
	// PDWarm: with PD, once a split request's answer is complete, send
	// the replica that prefilled it the prompt and the answer as a
	// prefill-only request (pdwarm.go), so that the next turn's prefill
	// finds the answer cached there.
	PDWarm bool
	// LateBind: keep the queues of the owned replicas here, and send a
	// held request to the first of them that can start it, decided
	// again (latebind.go).
	LateBind bool
	// Answers, when set, is told of every complete answer of an owned
	// replica that reported usage (relay.go's learn), from the request's
	// goroutine; it must not block. Nil: none.
	Answers func(replicaID string, a Answered)
}

// Proxy is the HTTP handler of one router. It is safe for concurrent use.
type Proxy struct {
	cfg    Config
	log    hclog.Logger
	m      *metrics
	edge   *edgeMetrics
	trust  *trustMetrics // trust.go
	client *http.Client
	// up reaches owned plain-HTTP replicas (upstream.Client); nil when
	// Config.Client is not a plain net/http Transport.
	up      *upstream.Client
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
	// their gossiped loads (hop.Book).
	hops *hop.Book
	// places makes this router's decisions serializable: each books its
	// request before the next one reads the loads (place.go).
	places placeBook
	// loadsRead, in tests, runs after a decision has read the loads and
	// before placeBook checks that no commit overlapped the read.
	loadsRead func()
	// loops relay SSE streams by their sockets (upstream.Loops); nil when
	// off or not on Linux.
	loops *upstream.Loops
	// answers bounds the answer bytes all streams hold .
	answers *reply.Budget
	// owners holds the hops in flight by owner, to end those of an owner
	// the mesh lost (hop.Owners); stopGone stops the view's events.
	owners *hop.Owners
	// probeOwner asks a lost owner whether it answers (a test's stub in
	// tests).
	probeOwner hop.Prober
	// signer signs and verifies hints and lookups (hop.Signer).
	signer *hop.Signer
	// ratios are the replicas' bytes per token (tokens.go).
	ratios *TokenRatios
	// flight: the prompt blocks in flight at each owned replica, for
	// the prediction (inflight.go).
	flight   *flightBlocks
	stopGone func()
	// admit is the admission (admission.go); nil when off.
	admit *admission
	// stalls: the requests in flight at owned replicas, for the stall
	// detection (nil: off).
	stalls *stallBook
	// pdm counts the requests split into legs (pd.go).
	pdm *pdMetrics
	// warms sends the warm requests of split requests (pdwarm.go); nil
	// when off.
	warms *warmer
	late  *lateBinder // nil: requests wait in the engines' queues
}

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
		cfg.Client = upstream.NewClient()
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.RetryBudget <= 0 {
		cfg.RetryBudget = DefaultRetryBudget
	}
	if cfg.HopDispatchTimeout == 0 {
		cfg.HopDispatchTimeout = hop.DefaultDispatchTimeout
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
	if cfg.TokenRatios == nil {
		cfg.TokenRatios = NewTokenRatios()
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(cfg.TokenRatios); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, m: newMetrics(cfg.Registerer), edge: newEdgeMetrics(cfg.Registerer), trust: newTrustMetrics(cfg.Registerer), client: cfg.Client,
		junk: junkLog{log: cfg.Logger, lim: ratelog.New(5, time.Second)}, panics: cfg.Panics, now: time.Now,
		sessionHeader: cfg.SessionHeader, responses: newResponseLRU(cfg.MaxResponses),

		ratios: cfg.TokenRatios, flight: newFlightBlocks(), load: newLoadBook(), hops: hop.NewBook(), up: upstream.New(cfg.Client), answers: reply.NewBudget(reply.BudgetBytes)}
	p.lookups = newLookups(p, cfg.Registerer)
	p.pdm = newPDMetrics(cfg.Registerer, cfg.PD)
	// Its metrics are registered either way: 0 while it is off.
	if late := newLateBinder(cfg.Registerer, cfg.SlotsLearned); cfg.LateBind {
		p.late = late
	}
	if cfg.PD != disagg.None && cfg.PDWarm {
		p.warms = newWarmer(p.pdm.warms, maxWarmBytes)
	}
	p.signer = &hop.Signer{Key: cfg.HopKey, Now: func() time.Time { return p.now() }}
	p.probeOwner = hop.ProbeHealthz(p.client)
	p.owners = hop.NewOwners(func(ctx context.Context, api string) (hop.Check, error) { return p.probeOwner(ctx, api) },
		func(end string) { p.m.ownerGone.WithLabelValues(end).Inc() }, cfg.Logger)
	p.stopGone = cfg.View.WatchGone(p.owners.Gone)
	if !cfg.NoStreamLoop {
		p.loops = upstream.NewLoops(p.m.loopStreams, p.m.loopClientWaits, p.recovered)
	}
	if cfg.StallWindow == 0 {
		cfg.StallWindow = DefaultStallWindow
	}
	p.stalls = newStallBook(cfg.StallWindow, cfg.Stalled, func() time.Time { return p.now() }, func(id string, n int) {
		p.log.Warn("replica stalled: its requests in flight ended", "replica", id, "reason", "stalled", "requests", n)
		p.m.stallCuts.Add(float64(n))
	}, func(id, outcome string, quiet time.Duration) {
		p.m.stallChecks.WithLabelValues(outcome).Inc()
		switch outcome {
		case stallPrefilling:
			p.log.Debug("replica quiet past its stall window, within the prefill it owes", "replica", id, "quiet", quiet.Round(time.Millisecond))
		case stallProgressing:
			p.log.Info("replica quiet past its stall window and the prefill it owes, but its engine progresses", "replica", id, "quiet", quiet.Round(time.Millisecond))
		}
	})
	for _, o := range [...]string{stallPrefilling, stallProgressing, stallStalled} {
		p.m.stallChecks.WithLabelValues(o) // every series from the start, at 0
	}
	if cfg.Admission != nil {
		p.admit = newAdmission(p, *cfg.Admission)
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
		p.lookups.serve(w, r)
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

// modelInfo is one model of the list; a LoRA adapter names its base
// model as Parent, as vLLM lists it (clients that pick a base model for
// an adapter, or list adapters apart, read it).
type modelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	Parent  string `json:"parent,omitempty"`
}

// modelParents is a View that knows the LoRA adapters' base models
// (mesh.Mesh.ModelParents); one that does not lists every model alike.
type modelParents interface {
	ModelParents() map[string]string
}

func (p *Proxy) models(w http.ResponseWriter) {
	names := p.cfg.View.Models()
	var parents map[string]string
	if v, ok := p.cfg.View.(modelParents); ok {
		parents = v.ModelParents()
	}
	l := modelList{Object: "list", Data: make([]modelInfo, 0, len(names))}
	for _, n := range names {
		l.Data = append(l.Data, modelInfo{ID: n, Object: "model", OwnedBy: "kvmesh", Parent: parents[n]})
	}
	b, _ := json.Marshal(l)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
	p.m.countRequest(epModels, http.StatusOK, false)
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
// router's own client (upstream.Client) and Config.Client, for a shutdown.
func (p *Proxy) CloseIdleConnections() {
	if p.up != nil {
		p.up.CloseIdle()
	}
	p.client.CloseIdleConnections()
}

// Close stops the stream loops (their streams, if any remain, finish on
// their handlers' goroutines), stops hearing of routers gone (ending the
// probes in progress) and closes idle upstream connections. The Proxy
// serves on afterwards, without the loops, its hops left to their
// timeouts.
func (p *Proxy) Close() {
	p.warms.close()
	p.admit.close()
	p.stalls.close()
	p.stopGone()
	p.owners.Close()
	if p.loops != nil {
		p.loops.Close()
	}
	p.CloseIdleConnections()
}

// setBodyDeadline bounds the time to read r's body. The deadline is on
// the connection, so it also bounds what net/http reads after a handler
// that ignored the body; clearBodyDeadline lifts it before a long
// response, whose connection net/http keeps reading in the background.
func (p *Proxy) setBodyDeadline(w http.ResponseWriter, r *http.Request) {
	if p.cfg.BodyTimeout > 0 && r.Body != nil && r.Body != http.NoBody {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(p.cfg.BodyTimeout))
	}
}
