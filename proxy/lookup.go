package proxy

// Stored responses across routers. An engine keeps the responses it
// stored (Responses API, store: true) to itself: a request naming one as
// previous_response_id, or retrieving it, must reach that replica, and any
// other answers 404. Only the router that relayed the response knows the
// replica; behind DNS round-robin the next turn usually arrives at
// another. That router asks its peers, in parallel and bounded in time,
// and remembers the answer. A lookup costs a round trip to the nearest
// peer that knows, and only on a miss; nothing is gossiped per response.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// LookupPath is the peer endpoint that answers which replica produced a
// response id this router relayed.
const LookupPath = "/kvmesh/v1/response-replica"

// Lookup bounds: how long a request waits for its peers' answers, how
// many lookups run at once (the rest route as if no peer knew), the
// longest id asked about, and the largest answer read.
const (
	lookupTimeout    = 500 * time.Millisecond
	maxLookups       = 32
	maxResponseIDLen = 256
	maxLookupAnswer  = 4 << 10
)

// Results of kvmesh_response_lookups_total.
const (
	lookupFound   = "found"
	lookupMissing = "missing"
	lookupBusy    = "busy"
)

// lookups is the peer lookup's state: a slot per running lookup.
type lookups struct {
	p       *Proxy // the router whose responses it looks up and serves
	slots   chan struct{}
	results *prometheus.CounterVec
}

func newLookups(p *Proxy, reg prometheus.Registerer) *lookups {
	l := &lookups{p: p, slots: make(chan struct{}, maxLookups),
		results: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_response_lookups_total",
			Help: "Stored-response ids this router did not know and asked its peers about, by result (found, missing, busy: too many lookups at once).",
		}, []string{"result"})}
	for _, r := range []string{lookupFound, lookupMissing, lookupBusy} {
		l.results.WithLabelValues(r) // exported from the start, so rates work
	}
	return l
}

// replicaOf returns the replica that produced response id: from
// this router's memory, else (unless the request is a peer's hop, whose
// sender already asked) from its peers.
func (l *lookups) replicaOf(ctx context.Context, r *http.Request, id string, hop bool) (string, bool) {
	p := l.p
	if rep, ok := p.responses.get(id); ok {
		return rep, true
	}
	if hop || p.cfg.Peers == nil || id == "" || len(id) > maxResponseIDLen {
		return "", false
	}
	peers := p.cfg.Peers()
	if len(peers) == 0 {
		return "", false
	}
	select {
	case p.lookups.slots <- struct{}{}:
		defer func() { <-p.lookups.slots }()
	default:
		p.lookups.results.WithLabelValues(lookupBusy).Inc()
		return "", false
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	found := make(chan string, len(peers))
	var wg sync.WaitGroup
	for _, base := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Off the request's goroutine, where no ServeHTTP recovers:
			// a panic asking one peer costs that peer's answer.
			p.panics.Guard(panicHandler, func() {
				if rep, ok := l.askPeer(ctx, r, base, id); ok {
					found <- rep
				}
			})
		}()
	}
	// The askers end by the deadline at the latest; this one closes found
	// after them, so the receive below ends too.
	go func() {
		wg.Wait()
		close(found)
	}()
	rep, ok := <-found
	if !ok {
		p.lookups.results.WithLabelValues(lookupMissing).Inc()
		return "", false
	}
	p.lookups.results.WithLabelValues(lookupFound).Inc()
	p.responses.add(id, rep)
	return rep, true
}

// askPeer asks one peer router which replica produced response id.
func (l *lookups) askPeer(ctx context.Context, client *http.Request, base, id string) (string, bool) {
	p := l.p
	if p.cfg.RequirePeerTLS && !strings.HasPrefix(strings.ToLower(base), "https://") {
		return "", false
	}
	u := strings.TrimRight(base, "/") + LookupPath + "?id=" + url.QueryEscape(id)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", false
	}
	if len(p.cfg.HopKey) > 0 {
		p.signer.SignLookup(req.Header, LookupPath, id)
	} else if a := client.Header.Get("Authorization"); a != "" {
		// An unauthenticated mesh proves nothing between routers: the
		// peer checks the client's own key, as for a hop.
		req.Header.Set("Authorization", a)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return "", false
	}
	defer resp.Body.Close()
	var a struct {
		Replica string `json:"replica"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, maxLookupAnswer)).Decode(&a) != nil || a.Replica == "" {
		return "", false
	}
	// Only a replica this router can reach is an answer.
	if _, _, ok := p.cfg.View.Locate(a.Replica); !ok {
		return "", false
	}
	return a.Replica, true
}

// serve answers a peer's lookup from this router's memory only
// (never asking further: one round, no loops). With a hop key the MAC
// must verify; over peer mutual TLS the certificate suffices; an
// unauthenticated mesh (Config.InsecureHops) needs the client's API key,
// as its hops do; a router with none of these serves no lookup.
func (l *lookups) serve(w http.ResponseWriter, r *http.Request) {
	p := l.p
	if !allow(w, r, http.MethodGet) {
		return
	}
	id := r.URL.Query().Get("id")
	switch {
	case len(p.cfg.HopKey) > 0:
		if !l.verify(r, id) {
			p.edge.rejected.WithLabelValues(rejectBadHop).Inc()
			writeError(w, http.StatusForbidden, "lookup not authenticated by a peer router")
			return
		}
	case p.cfg.TrustPeerCerts:
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			p.edge.rejected.WithLabelValues(rejectBadHop).Inc()
			writeError(w, http.StatusForbidden, "lookup needs a peer certificate")
			return
		}
	case !p.cfg.InsecureHops:
		// No peer can prove itself here, so no peer asks (trust.go).
		writeError(w, http.StatusForbidden, "lookup not served: this router has no gossip key and no peer mutual TLS to authenticate peers")
		return
	default:
		if !p.authorize(w, r) {
			return
		}
	}
	rep, ok := p.responses.get(id)
	if !ok {
		writeError(w, http.StatusNotFound, "response id not known here")
		return
	}
	b, _ := json.Marshal(struct {
		Replica string `json:"replica"`
	}{rep})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

func (l *lookups) verify(r *http.Request, id string) bool {
	p := l.p
	return id != "" && p.signer.VerifyLookup(r.Header, LookupPath, id)
}
