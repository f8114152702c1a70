package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/kvmesh/kvmesh/route"
)

var testHopKey = hop.Key([]byte("0123456789abcdef"))

// connKey marks the per-connection request counter of a test owner.
type connKey struct{}

// hopRig is an entry router A whose view has a replica R owned by router
// B (its summary matches more, so A forwards to B) and a replica L of its
// own. B is a real Proxy that owns R, behind a handler that replaces one
// request (the first after arm, on a connection that already carried
// one, so that A has seen B's earlier answers on it) with a fault.
type hopRig struct {
	entry     *httptest.Server
	owner     *httptest.Server
	remote    *replicaServer // R, behind B
	local     *replicaServer // L, A's own
	armed     atomic.Bool
	fired     atomic.Bool
	lastHints atomic.Value // http.Header of the faulted hop
	release   chan struct{}
}

// newHopRig builds the rig; oldOwner makes B an owner of an older version
// (it never announces dispatches: with no hop key it does not
// authenticate the hop, and so sends no 103).
func newHopRig(t *testing.T, oldOwner bool, dispatchTimeout time.Duration, fault func(rig *hopRig, w http.ResponseWriter, r *http.Request)) *hopRig {
	t.Helper()
	rig := &hopRig{release: make(chan struct{})}
	rig.remote = newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from R", 0) })
	rig.local = newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from L", 0) })
	bcfg := Config{View: newFakeView([]string{"m"}, fakeReplica{id: rig.remote.URL}), Policy: route.DefaultPolicy(), Contract: testContract}
	if !oldOwner {
		bcfg.HopKey = testHopKey
	}
	pB, err := New(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	rig.owner = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := r.Context().Value(connKey{}).(*atomic.Int64).Add(1)
		if n > 1 && rig.armed.CompareAndSwap(true, false) {
			rig.lastHints.Store(r.Header.Clone())
			rig.fired.Store(true)
			fault(rig, w, r)
			return
		}
		pB.ServeHTTP(w, r)
	}))
	rig.owner.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(atomic.Int64))
	}
	rig.owner.Start()
	t.Cleanup(rig.owner.Close)
	t.Cleanup(func() { close(rig.release) }) // before Close: it waits for the handlers
	view := newFakeView([]string{"m"}, fakeReplica{id: rig.remote.URL, owner: rig.owner.URL, match: 20}, fakeReplica{id: rig.local.URL})
	_, rig.entry, _ = newEdgeProxy(t, view, func(c *Config) {
		c.HopKey = testHopKey
		c.HopDispatchTimeout = dispatchTimeout
	})
	return rig
}

// run sends requests through A until the fault has fired (the ones
// before it warm A's connections to B) and returns the faulted request's
// status and body, and how many requests B served before it.
func (rig *hopRig) run(t *testing.T) (int, string, int) {
	t.Helper()
	rig.armed.Store(true)
	// A bound for a hop that would hang (not a timing: the cases take
	// milliseconds).
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for warm := 0; warm < 50; warm++ {
		resp := post(t, ctx, rig.entry.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
		body := readAll(t, resp)
		if rig.fired.Load() {
			return resp.StatusCode, body, warm
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "from R") {
			t.Fatalf("warm-up request %d: %d %s", warm, resp.StatusCode, body)
		}
		time.Sleep(5 * time.Millisecond) // let A pool the connection again
	}
	t.Fatal("A never reused a connection to B")
	return 0, "", 0
}

// hijackClose reads the request, then closes the connection; rst makes
// it a reset rather than a FIN.
func hijackClose(w http.ResponseWriter, r *http.Request, rst bool) {
	_, _ = io.Copy(io.Discard, r.Body)
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok && rst {
		_ = tc.SetLinger(0)
	}
	conn.Close()
}

// dispatchThenDie is an owner that announces the dispatch, passes the
// request to its replica R (which runs it), and dies before answering.
func dispatchThenDie(rig *hopRig, w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set(hop.HeaderDispatched, "1")
	w.WriteHeader(http.StatusEarlyHints)
	if resp, err := http.Post(rig.remote.URL+r.URL.Path, "application/json", strings.NewReader(string(body))); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	hijackClose(w, r, true)
}

// TestHopFailures is the entry's side of the dispatch protocol: a hop
// that provably never reached a replica is retried (here on A's own
// replica L), one whose owner announced the dispatch never is, and an
// owner that never announces (an older version) keeps the conservative
// rule.
func TestHopFailures(t *testing.T) {
	tests := []struct {
		name     string
		oldOwner bool
		timeout  time.Duration
		fault    func(rig *hopRig, w http.ResponseWriter, r *http.Request)
		want     int
		wantR    int // requests R got for the faulted one
		wantL    int
		wantMsg  string // in the 502's message
	}{
		{name: "reset before dispatch", timeout: time.Minute,
			fault: func(_ *hopRig, w http.ResponseWriter, r *http.Request) { hijackClose(w, r, true) }, want: 200, wantL: 1},
		{name: "closed before dispatch", timeout: time.Minute,
			fault: func(_ *hopRig, w http.ResponseWriter, r *http.Request) { hijackClose(w, r, false) }, want: 200, wantL: 1},
		{name: "reset after the dispatch 103", timeout: time.Minute, fault: dispatchThenDie,
			want: 502, wantR: 1, wantMsg: "after it had dispatched"},
		{name: "silent owner past the dispatch timeout", timeout: 200 * time.Millisecond,
			fault: func(rig *hopRig, w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				select {
				case <-r.Context().Done():
				case <-rig.release:
				}
			}, want: 200, wantL: 1},
		{name: "older owner reset after reading", oldOwner: true, timeout: time.Minute,
			fault: func(_ *hopRig, w http.ResponseWriter, r *http.Request) { hijackClose(w, r, true) },
			want:  502, wantMsg: "failed after the request was sent"},
		{name: "older owner slower than the dispatch timeout is waited for", oldOwner: true, timeout: 50 * time.Millisecond,
			fault: func(rig *hopRig, w http.ResponseWriter, r *http.Request) {
				time.Sleep(300 * time.Millisecond)
				w.Header().Set("Content-Type", "application/json")
				jsonChat(w, "slow B", 0)
			}, want: 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rig := newHopRig(t, tc.oldOwner, tc.timeout, tc.fault)
			status, body, warm := rig.run(t)
			if status != tc.want {
				t.Fatalf("status %d, want %d: %s", status, tc.want, body)
			}
			if status == http.StatusBadGateway {
				typ, _, msg := openAIError(t, body)
				if typ != "server_error" || !strings.Contains(msg, tc.wantMsg) {
					t.Errorf("502 %s %q, want server_error with %q", typ, msg, tc.wantMsg)
				}
			}
			if got := rig.remote.count() - warm; got != tc.wantR {
				t.Errorf("R got %d requests for the faulted one, want %d", got, tc.wantR)
			}
			if got := rig.local.count(); got != tc.wantL {
				t.Errorf("L got %d requests, want %d (a retry)", got, tc.wantL)
			}
			h, _ := rig.lastHints.Load().(http.Header)
			by, err := strconv.ParseInt(h.Get(hop.HeaderDispatchBy), 10, 64)
			if err != nil || time.UnixMilli(by).After(time.Now().Add(tc.timeout)) {
				t.Errorf("the hop's dispatch deadline %q is not before A's own timeout", h.Get(hop.HeaderDispatchBy))
			}
		})
	}
}

// ownerHop sends one request straight to an owner, signed as a peer's hop
// when signed, and returns the status, body, and the 1xx responses seen.
func ownerHop(t *testing.T, url, replica string, signed bool, extra map[string]string) (int, string, []textproto.MIMEHeader, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody("m", false, longPrompt)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if signed {
		q := &Proxy{cfg: Config{HopKey: testHopKey}, now: time.Now}
		(&hop.Signer{Key: q.cfg.HopKey, Now: q.now}).Sign(req, replica, 3, 0, 0)
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	var mu sync.Mutex
	var infos []textproto.MIMEHeader
	trace := &httptrace.ClientTrace{Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
		mu.Lock()
		defer mu.Unlock()
		h = textproto.MIMEHeader(http.Header(h).Clone())
		h.Set(":status", strconv.Itoa(code))
		infos = append(infos, h)
		return nil
	}}
	req = req.WithContext(httptrace.WithClientTrace(t.Context(), trace))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	mu.Lock()
	defer mu.Unlock()
	return resp.StatusCode, body, infos, resp.Header
}

// TestOwnerAnnouncesDispatch is the owner's side: the dispatch 103 goes
// only to an authenticated hop, once, before the replica gets the
// request; a hop past its dispatch deadline is refused unsent; client
// requests, with or without the protocol's headers, never see a 103, and
// those headers never reach a replica.
func TestOwnerAnnouncesDispatch(t *testing.T) {
	past := strconv.FormatInt(time.Now().Add(-time.Minute).UnixMilli(), 10)
	future := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	tests := []struct {
		name      string
		key       []byte // the owner's hop key
		signed    bool
		extra     map[string]string
		want      int
		want103   int
		wantReach int
	}{
		{"authenticated hop", testHopKey, true, nil, 200, 1, 1},
		{"authenticated hop within its deadline", testHopKey, true, map[string]string{hop.HeaderDispatchBy: future}, 200, 1, 1},
		{"authenticated hop past its deadline", testHopKey, true, map[string]string{hop.HeaderDispatchBy: past}, 503, 0, 0},
		{"client request", testHopKey, false, nil, 200, 0, 1},
		{"client sending the protocol's headers", testHopKey, false, map[string]string{hop.HeaderDispatched: "1", hop.HeaderDispatchBy: past}, 200, 0, 1},
		{"forged hop", testHopKey, false, map[string]string{hop.HeaderHop: "1", hop.HeaderHopMAC: strings.Repeat("A", 43), hop.HeaderHopTime: "1", hop.HeaderDispatchBy: past}, 200, 0, 1},
		{"hop in a mesh without a key", nil, true, map[string]string{hop.HeaderDispatchBy: past}, 200, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "from R", 0) })
			_, srv, _ := newEdgeProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.HopKey = tc.key })
			status, body, got1xx, hdr := ownerHop(t, srv.URL, rep.URL, tc.signed, tc.extra)
			if status != tc.want {
				t.Fatalf("status %d, want %d: %s", status, tc.want, body)
			}
			if status == http.StatusServiceUnavailable && hdr.Get("Retry-After") == "" {
				t.Error("refused hop without Retry-After")
			}
			if len(got1xx) != tc.want103 {
				t.Fatalf("%d informational responses (%v), want %d", len(got1xx), got1xx, tc.want103)
			}
			for _, h := range got1xx {
				if h.Get(":status") != "103" || h.Get(hop.HeaderDispatched) != "1" {
					t.Errorf("informational response %v, want 103 with %s: 1", h, hop.HeaderDispatched)
				}
			}
			if hdr.Get(hop.HeaderDispatched) != "" {
				t.Errorf("the final response carries %s", hop.HeaderDispatched)
			}
			if rep.count() != tc.wantReach {
				t.Errorf("replica got %d requests, want %d", rep.count(), tc.wantReach)
			}
			for _, h := range rep.headers {
				for k := range h {
					if strings.HasPrefix(k, "X-Kvmesh-") {
						t.Errorf("header %s reached the replica", k)
					}
				}
			}
		})
	}
}

// TestAvoidOwner: after a hop to an owner failed before dispatch, its
// replicas are skipped and this router's own are preferred.
func TestAvoidOwner(t *testing.T) {
	const ownerX, ownerY = "http://x", "http://y"
	view := newFakeView([]string{"m"},
		fakeReplica{id: "x1", owner: ownerX}, fakeReplica{id: "x2", owner: ownerX},
		fakeReplica{id: "y1", owner: ownerY}, fakeReplica{id: "l1"})
	p := &Proxy{cfg: Config{View: view}}
	cands := func(ids ...string) []route.Candidate {
		out := make([]route.Candidate, 0, len(ids))
		for _, id := range ids {
			out = append(out, route.Candidate{Detail: &route.Detail{ID: id}})
		}
		return out
	}
	tests := []struct {
		name string
		in   []string
		down string
		want []string
	}{
		{"own replicas preferred", []string{"x2", "y1", "l1"}, ownerX, []string{"l1"}},
		{"another owner's when none is own", []string{"x2", "y1"}, ownerX, []string{"y1"}},
		{"nothing left", []string{"x1", "x2"}, ownerX, nil},
		{"only own left", []string{"x1", "l1"}, ownerX, []string{"l1"}},
		{"unknown replicas dropped", []string{"gone", "y1"}, ownerX, []string{"y1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, c := range p.avoidOwner(cands(tc.in...), tc.down, time.Time{}) {
				got = append(got, c.ID())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// heardView is a fake view that also tells when each replica's owner was
// last heard (the mesh's LoadHeard).
type heardView struct {
	*fakeView
	heard map[string]time.Time
}

func (v heardView) LoadHeard(id string) (time.Time, bool) {
	t, ok := v.heard[id]
	return t, ok
}

// TestAvoidOwnerPrefersOwnersHeardSince: with no replica of its own, the
// retry after a failed hop skips owners silent since that hop began (cut
// off as the failed one may be, by a partition), unless every other
// owner is.
func TestAvoidOwnerPrefersOwnersHeardSince(t *testing.T) {
	const ownerX, ownerY, ownerZ = "http://x", "http://y", "http://z"
	since := time.Unix(1000, 0)
	view := heardView{newFakeView([]string{"m"},
		fakeReplica{id: "x1", owner: ownerX}, fakeReplica{id: "y1", owner: ownerY},
		fakeReplica{id: "y2", owner: ownerY}, fakeReplica{id: "z1", owner: ownerZ}, fakeReplica{id: "l1"}),
		map[string]time.Time{"x1": since.Add(-time.Second), "y1": since.Add(-time.Second), "y2": since.Add(-time.Second),
			"z1": since.Add(200 * time.Millisecond)}}
	p := &Proxy{cfg: Config{View: view}}
	ids := func(cs []route.Candidate) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.ID())
		}
		return strings.Join(out, ",")
	}
	cands := func(ids ...string) []route.Candidate {
		out := make([]route.Candidate, 0, len(ids))
		for _, id := range ids {
			out = append(out, route.Candidate{Detail: &route.Detail{ID: id}})
		}
		return out
	}
	for _, tc := range []struct {
		name string
		in   []string
		want string
	}{
		{"silent owner skipped", []string{"x1", "y1", "y2", "z1"}, "z1"},
		{"own replica still first", []string{"x1", "y1", "z1", "l1"}, "l1"},
		{"every other owner silent: all kept", []string{"x1", "y1", "y2"}, "y1,y2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(p.avoidOwner(cands(tc.in...), ownerX, since)); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}
