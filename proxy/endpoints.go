package proxy

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/route"
)

// DefaultSessionHeader is the request header whose value is a client
// routing key unless Config.SessionHeader names another.
const DefaultSessionHeader = "X-Session-ID"

// DefaultMaxResponses bounds how many response ids a router remembers
// with the replica that produced them (previous_response_id routing). An
// entry is about 100 bytes.
const DefaultMaxResponses = 1 << 16

// Decision labels of kvmesh_route_decisions_total that route does not make.
const (
	// ReasonPreviousResponse is a Responses request sent to the replica
	// that produced its previous_response_id, which holds the conversation.
	ReasonPreviousResponse route.Reason = "previous-response"
	// ReasonLoad is a request placed by load alone (embeddings).
	ReasonLoad route.Reason = "load"
	// ReasonPolicyFault is a request placed by load because the routing
	// policy failed (panicked or chose no candidate): a bug to report.
	ReasonPolicyFault route.Reason = "policy-fault"
)

// Endpoint labels of kvmesh_requests_total for the newer APIs.
const (
	epResponses  = "responses"
	epMessages   = "messages"
	epEmbeddings = "embeddings"
)

// endpoint is one inference API: how its body renders, and how its
// requests are placed.
type endpoint struct {
	// label is the endpoint label of kvmesh_requests_total.
	label string
	// render parses a body and renders its canonical prompt.
	render func([]byte) (prompt.Prompt, error)
	// renderTo, when set, is render into a lent buffer (inference lends
	// one from textBufs for the request's life).
	renderTo func(buf, body []byte) (prompt.Prompt, error)
	// byLoad places requests on the least loaded replica, without prefix
	// matching, and does not read their responses (embeddings: there is
	// no prompt cache to model, and the answers are large).
	byLoad bool
}

// The inference endpoints. They are read-only after initialisation.
var (
	chatAPI       = endpoint{label: epChat, render: prompt.RenderChat, renderTo: prompt.RenderChatTo}
	completionAPI = endpoint{label: epCompletions, render: prompt.RenderCompletion}
	responsesAPI  = endpoint{label: epResponses, render: prompt.RenderResponses}
	messagesAPI   = endpoint{label: epMessages, render: prompt.RenderMessages}
	embeddingsAPI = endpoint{label: epEmbeddings, render: prompt.RenderEmbeddings, byLoad: true}
)

// serveResponses serves POST /v1/responses: routed like chat, and the id
// of each successful response is remembered with its replica, so that a
// later request naming it as previous_response_id goes where the engine
// stored the conversation.
func (p *Proxy) serveResponses(w http.ResponseWriter, r *http.Request) {
	p.inference(&responseIDSniffer{ResponseWriter: w}, r, &responsesAPI)
}

// served is called by inference once a replica has answered the request.
func (st *reqState) served(replicaID string) {
	p := st.p
	s, ok := st.w.(*responseIDSniffer)
	if !ok || st.code != http.StatusOK || s.id == "" {
		return
	}
	p.responses.add(s.id, replicaID)
}

// maxSniff bounds how much of a Responses answer is searched for its id;
// engines put it first.
const maxSniff = 4 << 10

// responseIDSniffer passes a response through unchanged and finds its
// response id on the way: the first "id" member, which is the response's
// own both in a JSON body ({"id":"resp_...",...}) and in the first event of
// a stream (response.created, whose response object starts with its id).
type responseIDSniffer struct {
	http.ResponseWriter
	head []byte
	id   string
	done bool
}

// Write implements http.ResponseWriter.
func (s *responseIDSniffer) Write(b []byte) (int, error) {
	if !s.done {
		s.head = append(s.head, b[:min(len(b), maxSniff-len(s.head))]...)
		if id, ok := findID(s.head); ok {
			s.id, s.done, s.head = id, true, nil
		} else if len(s.head) >= maxSniff {
			s.done, s.head = true, nil
		}
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush).
func (s *responseIDSniffer) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// findID returns the response id in b, the head of a Responses answer:
// the "id" member of the top-level object, or of its "response" object
// (a stream's response.created event), once b holds all of it. The head
// may stop anywhere, so a scan that runs out of text is "not yet". An id
// with escapes is not one an engine makes and is ignored.
func findID(b []byte) (string, bool) {
	i := bytes.IndexByte(b, '{')
	if i < 0 {
		return "", false
	}
	s := jsonscan.New(b[i+1:], jsonscan.MaxDepth)
	return idIn(&s, 1)
}

// idIn reads the members of an object whose '{' has been consumed, at
// nesting depth, for findID.
func idIn(s *jsonscan.Scanner, depth int) (string, bool) {
	for first := true; ; first = false {
		key, esc, done, ok := s.Key(first)
		if done || !ok || esc {
			return "", false
		}
		switch string(key) {
		case "id":
			if s.Peek() != '"' {
				return "", false
			}
			v, esc, ok := s.RawString()
			if !ok || esc || len(v) == 0 {
				return "", false
			}
			return string(v), true
		case "response":
			if depth == 1 && s.Eat('{') {
				return idIn(s, depth+1)
			}
		}
		if !s.Skip(depth) {
			return "", false
		}
	}
}

// responseLRU remembers which replica produced each recent response id,
// up to a bound, forgetting the least recently used first.
type responseLRU struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *responseEntry, most recent first
	byID  map[string]*list.Element
}

type responseEntry struct{ id, replica string }

func newResponseLRU(max int) *responseLRU {
	if max <= 0 {
		max = DefaultMaxResponses
	}
	return &responseLRU{max: max, order: list.New(), byID: make(map[string]*list.Element)}
}

func (l *responseLRU) add(id, replica string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.byID[id]; ok {
		e.Value.(*responseEntry).replica = replica
		l.order.MoveToFront(e)
		return
	}
	l.byID[id] = l.order.PushFront(&responseEntry{id: id, replica: replica})
	for l.order.Len() > l.max {
		e := l.order.Back()
		l.order.Remove(e)
		delete(l.byID, e.Value.(*responseEntry).id)
	}
}

func (l *responseLRU) get(id string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byID[id]
	if !ok {
		return "", false
	}
	l.order.MoveToFront(e)
	return e.Value.(*responseEntry).replica, true
}

func (l *responseLRU) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}

// responsesPrefix starts the paths of one stored response: GET
// /v1/responses/{id} (retrieve, or ?stream=true to resume a background
// response), GET .../input_items, DELETE, and POST .../cancel.
const responsesPrefix = "/v1/responses/"

// serveResponseByID forwards a request about one stored response to the
// replica that produced it: only its engine has it. An id this router has
// not seen (or has forgotten) is answered 404, as an engine that does not
// hold it would.
func (p *Proxy) serveResponseByID(w http.ResponseWriter, r *http.Request) {
	st := &reqState{p: p, w: w, r: r, path: r.URL.Path, byLoad: true}
	defer func() { p.m.countRequest(epResponses, st.code, st.hop) }()
	rest := strings.TrimPrefix(r.URL.Path, responsesPrefix)
	id, sub, _ := strings.Cut(rest, "/")
	method := http.MethodGet
	switch {
	case sub == "" && r.Method == http.MethodDelete:
		method = http.MethodDelete
	case sub == "cancel":
		method = http.MethodPost
	case sub != "" && sub != "input_items":
		st.code = writeError(w, http.StatusNotFound, fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path))
		return
	}
	if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
		w.Header().Set("Allow", method)
		st.code = writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	isHop, authenticated := p.hopOf(r)
	st.hop = isHop
	if !authenticated && !p.authorize(w, r) {
		st.code = http.StatusUnauthorized
		return
	}
	replica, ok := "", false
	if h := r.Header.Get(hop.HeaderReplica); isHop && h != "" {
		replica, ok = h, true // the deciding router knew it
	} else {
		replica, ok = p.lookups.replicaOf(r.Context(), r, id, isHop)
	}
	if !ok || id == "" {
		st.code = writeError(w, http.StatusNotFound, fmt.Sprintf("Response with id '%s' not found.", id))
		return
	}
	ownerAPI, local, known := p.cfg.View.Locate(replica)
	if !known || (!local && isHop) {
		st.code = writeError(w, http.StatusNotFound, fmt.Sprintf("Response with id '%s' not found: its replica is gone.", id))
		return
	}
	body, status, err := st.readBody(nil)
	if err != nil {
		st.code = writeError(w, status, err.Error())
		return
	}
	base := replica
	if !local {
		base = ownerAPI
		if p.cfg.RequirePeerTLS && !strings.HasPrefix(strings.ToLower(ownerAPI), "https://") {
			st.code = writeError(w, http.StatusBadGateway, fmt.Sprintf("the router holding response '%s' is not reachable over TLS", id))
			return
		}
	}
	url := strings.TrimRight(base, "/") + r.URL.Path
	if r.URL.RawQuery != "" {
		url += "?" + r.URL.RawQuery
	}
	// The attempt's own cancellation ends an upstream silent mid-body.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, r.Method, url, bytes.NewReader(body))
	if err != nil {
		st.code = writeError(w, http.StatusBadGateway, fmt.Sprintf("bad upstream URL %s: %v", url, err))
		return
	}
	copyRequestHeader(out.Header, r.Header)
	if !local {
		p.signer.Sign(out, replica, 0, 0, 0)
	}
	start := time.Now()
	resp, err := p.client.Do(out)
	if err != nil {
		if r.Context().Err() != nil {
			st.code = statusClientGone
			return
		}
		st.code = writeError(w, http.StatusBadGateway, fmt.Sprintf("the replica holding response '%s' failed: %v", id, err))
		return
	}
	defer resp.Body.Close()
	st.code = resp.StatusCode
	st.relay(resp, upstreamAnswer{id: replica, local: local, start: start, cancel: cancel, firstByte: func() {}})
}
