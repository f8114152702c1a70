// Package lb holds the standard load balancers the demo measures kvmesh
// against: round-robin and least-connections reverse proxies that know
// nothing about prompt caches.
package lb

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
)

// Policies New accepts.
const (
	RoundRobin       = "round-robin"
	LeastConnections = "least-connections"
)

// New returns an http.Handler that proxies every request to one of backends
// (base URLs), chosen by policy "round-robin" or "least-connections" (fewest
// in-flight requests, ties by order). Responses stream through unbuffered;
// a backend that cannot be reached gives a 502 OpenAI-shaped error.
func New(policy string, backends []string, logger hclog.Logger) (http.Handler, error) {
	if len(backends) == 0 {
		return nil, errors.New("lb: no backends")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	b := &balancer{logger: logger, inflight: make([]int, len(backends))}
	switch policy {
	case RoundRobin:
		b.pick = b.roundRobin
	case LeastConnections:
		b.pick = b.leastConnections
	default:
		return nil, fmt.Errorf("lb: unknown policy %q (want %q or %q)", policy, RoundRobin, LeastConnections)
	}
	// One transport for all backends, with enough idle connections per host
	// that the baseline is not throttled by connection setup.
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	for _, raw := range backends {
		u, err := url.Parse(raw)
		if err != nil {
			return nil, fmt.Errorf("lb: backend %q: %w", raw, err)
		}
		if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("lb: backend %q: want an http(s) base URL", raw)
		}
		target := u
		b.proxies = append(b.proxies, &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				pr.SetXForwarded()
			},
			Transport:     tr,
			FlushInterval: -1, // flush every write: SSE tokens pass through as they come
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if r.Context().Err() != nil {
					logger.Debug("client went away", "backend", target.String(), "error", err)
				} else {
					logger.Warn("backend failed", "backend", target.String(), "error", err)
				}
				writeError(w, http.StatusBadGateway, fmt.Sprintf("backend %s unavailable: %v", target.Host, err))
			},
		})
	}
	return b, nil
}

// balancer picks a backend per request and counts in-flight requests.
type balancer struct {
	logger  hclog.Logger
	proxies []*httputil.ReverseProxy
	pick    func() int
	next    atomic.Uint64 // round-robin cursor

	mu       sync.Mutex // guards inflight
	inflight []int
}

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	i := b.pick()
	defer b.done(i)
	b.proxies[i].ServeHTTP(w, r)
}

// roundRobin takes backends in turn; it still counts in-flight requests so
// both policies have the same bookkeeping cost.
func (b *balancer) roundRobin() int {
	i := int((b.next.Add(1) - 1) % uint64(len(b.proxies)))
	b.mu.Lock()
	b.inflight[i]++
	b.mu.Unlock()
	return i
}

// leastConnections takes the backend with the fewest in-flight requests,
// the first such in order on ties.
func (b *balancer) leastConnections() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	best := 0
	for i, n := range b.inflight {
		if n < b.inflight[best] {
			best = i
		}
	}
	b.inflight[best]++
	return best
}

func (b *balancer) done(i int) {
	b.mu.Lock()
	b.inflight[i]--
	b.mu.Unlock()
}

// writeError writes an OpenAI-shaped error body.
func writeError(w http.ResponseWriter, status int, msg string) {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "server_error"
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": nil, "code": nil}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
