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
	"time"

	"github.com/hashicorp/go-hclog"
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
	// MaxAttempts is how many candidates are tried before the first byte
	// of a response (default 3).
	MaxAttempts int
	// Logger logs (default: null logger).
	Logger hclog.Logger
	// Registerer registers the proxy's metrics (default: none).
	Registerer prometheus.Registerer
	// Gatherer serves GET /metrics (nil: 404).
	Gatherer prometheus.Gatherer
	// Debug serves GET /debug/mesh as JSON (nil: 404).
	Debug func() any
	// Ready answers GET /readyz (nil: always ready).
	Ready func() bool
	// ReportFailure is told of passive failures of owned replicas seen on
	// the request path (HealthChecker.ReportFailure); nil ignores them.
	ReportFailure func(replicaID string)
	// SessionHeader names the request header whose value is a client
	// routing key ("" means DefaultSessionHeader, "-" none).
	SessionHeader string
	// MaxResponses bounds the response ids remembered for
	// previous_response_id routing (default DefaultMaxResponses).
	MaxResponses int
}

// Proxy is the HTTP handler of one router. It is safe for concurrent use.
type Proxy struct {
	cfg     Config
	log     hclog.Logger
	m       *metrics
	client  *http.Client
	metrics http.Handler
	// sessionHeader is the client routing key header ("" for none).
	sessionHeader string
	// responses maps response ids to the replicas that produced them.
	responses *responseLRU
}

// NewClient returns the default client to replicas and peers: keep-alive
// connections, many idle ones per host, no overall timeout (streams are
// long) and a response-header timeout long enough for a non-streaming
// generation, whose headers only come when it is complete. Compression is
// off so that streams pass through unbuffered and answers can be read.
func NewClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 10 * time.Minute,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}}
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
		cfg.Client = NewClient()
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 3
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, m: newMetrics(cfg.Registerer), client: cfg.Client,
		sessionHeader: cfg.SessionHeader, responses: newResponseLRU(cfg.MaxResponses)}
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

// ServeHTTP serves the OpenAI endpoints and the router's own ones.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
		if !allow(w, r, http.MethodGet) {
			return
		}
		p.models(w)
	case "/healthz":
		if allow(w, r, http.MethodGet) {
			writeText(w, http.StatusOK, "ok")
		}
	case "/readyz":
		if !allow(w, r, http.MethodGet) {
			return
		}
		if p.cfg.Ready == nil || p.cfg.Ready() {
			writeText(w, http.StatusOK, "ready")
		} else {
			writeText(w, http.StatusServiceUnavailable, "not ready")
		}
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
		if strings.HasPrefix(r.URL.Path, responsesPrefix) {
			p.serveResponseByID(w, r)
			return
		}
		writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
	}
}

func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method || (method == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
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
	p.m.requests.WithLabelValues(epModels, "200").Inc()
}

// modelKnown reports whether any replica in the mesh serves model.
func (p *Proxy) modelKnown(model string) bool {
	_, ok := slices.BinarySearch(p.cfg.View.Models(), model)
	return ok
}
