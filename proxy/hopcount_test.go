package proxy

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestForwardedRequestCounts: a request this router forwards to another
// router's replica is in its hop book until it ends.
func TestForwardedRequestCounts(t *testing.T) {
	release := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		jsonChat(w, "ok", 0)
	})
	_, owner, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), nil)
	p, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL, owner: owner.URL}), nil)
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the servers close, which wait for the handler
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false, longPrompt)))
		if err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.hops.InFlight(rep.URL) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the forwarded request never counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	free()
	recv(t, done, "the client's response")
	for p.hops.InFlight(rep.URL) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the forwarded request still counts after it ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestSignedHopCarriesCounts: the counts are under the hop's MAC: the
// owner verifies a hop that carries them, and refuses one whose counts
// were changed on the way.
func TestSignedHopCarriesCounts(t *testing.T) {
	key := hop.Key([]byte("0123456789abcdef0123456789abcdef"))
	p, _, _ := newTestProxy(t, newFakeView([]string{"m"}), func(c *Config) { c.HopKey = key })
	out, _ := http.NewRequest(http.MethodPost, "http://owner/v1/chat/completions", nil)
	p.signer.Sign(out, "http://replica", 3, 4, 9)
	if isHop, auth := p.hopOf(out.Clone(out.Context())); !isHop || !auth {
		t.Fatalf("a signed hop with counts is not accepted (hop %v, authenticated %v)", isHop, auth)
	}
	if c, f := hop.Parse(out.Header.Get(hop.HeaderHop)); c != 4 || f != 9 {
		t.Errorf("the hop carries %d, %d", c, f)
	}
	forged := out.Clone(out.Context())
	forged.Header.Set(hop.HeaderHop, "1;c=400")
	if _, auth := p.hopOf(forged); auth {
		t.Error("a hop whose counts were changed is authenticated")
	}
}

// TestDispatchNamesTheReplica: when the owner decides again (it does not
// have the hinted replica among its own), the entry's hop book counts the
// request at the replica the owner's 103 names.
func TestDispatchNamesTheReplica(t *testing.T) {
	release := make(chan struct{})
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		<-release
		jsonChat(w, "ok", 0)
	})
	_, owner, _ := newEdgeProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.HopKey = testHopKey })
	const hinted = "http://gone:8000"
	p, entry, _ := newEdgeProxy(t, newFakeView([]string{"m"}, fakeReplica{id: hinted, owner: owner.URL, match: 20}, fakeReplica{id: rep.URL, owner: owner.URL}),
		func(c *Config) { c.HopKey = testHopKey })
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := http.Post(entry.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", false, longPrompt)))
		if err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.hops.InFlight(rep.URL) != 1 || p.hops.InFlight(hinted) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("hop book: %d at the hint, %d where it runs, want 0 and 1", p.hops.InFlight(hinted), p.hops.InFlight(rep.URL))
		}
		time.Sleep(5 * time.Millisecond)
	}
	free()
	recv(t, done, "the client's response")
}

// TestOwnerRedecidesWithTheHopsCounts: an owner that cannot keep the
// hint (its replica holds the prefix but has no free slot) decides again
// with the deciding router's Concurrent and ForkBlocks from the hop, as
// the simulator's owner does: one request alone waits at the holder; one
// of several concurrent ones for the prefix, or one forking from a stem
// it shares, starts at once on another replica of the owner's.
func TestOwnerRedecidesWithTheHopsCounts(t *testing.T) {
	prompt := chatBody("m", false, longPrompt)
	for _, tc := range []struct {
		name, hop string
		holder    bool
	}{
		{"no counts: the holder", "1", true},
		{"alone: the holder", "1;c=1", true},
		{"several for the prefix: another replica", "1;c=3", false},
		{"a stem's fork: another replica", "1;f=1000", false},
		{"the largest count acts as any over the holders", "1;c=1048576", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chat := func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "hi", 0) }
			holder := newReplica(t, chat)
			others := []*replicaServer{newReplica(t, chat), newReplica(t, chat), newReplica(t, chat)}
			// The holder: two requests ahead for its 4 slots (2 s of
			// wait at 4 s a sequence); the others idle, holding nothing.
			rs := []fakeReplica{{id: holder.URL, match: 1 << 20, slots: 4, inFlight: 5, seqMs: 4000}}
			for _, o := range others {
				rs = append(rs, fakeReplica{id: o.URL, slots: 4, seqMs: 4000})
			}
			// The test sends the hop itself: an insecure mesh's owner.
			_, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, rs...), func(c *Config) { c.InsecureHops = true })
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(prompt))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(hop.HeaderHop, tc.hop)
			req.Header.Set(hop.HeaderReplica, holder.URL)
			req.Header.Set(hop.HeaderMatch, "1000")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := holder.count() == 1; got != tc.holder {
				t.Fatalf("served at the holder %v, want %v", got, tc.holder)
			}
		})
	}
}

// TestForwardedRequestCountedOnce: a client's request that one router
// forwards to another's replica is one request in kvmesh_requests_total,
// at the router the client reached; the owner counts the hop in
// kvmesh_hop_requests_total.
func TestForwardedRequestCountedOnce(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { jsonChat(w, "ok", 0) })
	owner, ownerSrv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.HopKey = testHopKey })
	entry, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL, owner: ownerSrv.URL}), func(c *Config) { c.HopKey = testHopKey })
	resp := post(t, t.Context(), srv.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	if readAll(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	waitCounted(t, entry, epChat, 1)
	waitCounted(t, owner, epChat, 1)
	if got := testutil.ToFloat64(entry.m.requests.WithLabelValues(epChat, "200")); got != 1 {
		t.Errorf("the entry router counted %v client requests, want 1", got)
	}
	if got := testutil.ToFloat64(owner.m.requests.WithLabelValues(epChat, "200")); got != 0 {
		t.Errorf("the owner router counted the hop as %v client requests, want 0", got)
	}
	if got := testutil.ToFloat64(owner.m.hopRequests.WithLabelValues(epChat, "200")); got != 1 {
		t.Errorf("the owner router counted %v hops, want 1", got)
	}
	if got := testutil.ToFloat64(entry.m.hopRequests.WithLabelValues(epChat, "200")); got != 0 {
		t.Errorf("the entry router counted %v hops, want 0", got)
	}
}

// TestRequestTTFTByRoute: kvmesh_request_ttft_seconds counts a client's
// request at its entry router by where it went (peer: through the owner;
// local: an owned replica) and the hop at the owner, and the entry's time
// holds the upstream leg it contains.
func TestRequestTTFTByRoute(t *testing.T) {
	rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) { sseChat(w, []string{"a", "b"}, 0) })
	owner, ownerSrv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL}), func(c *Config) { c.HopKey = testHopKey })
	entry, srv, _ := newTestProxy(t, newFakeView([]string{"m"}, fakeReplica{id: rep.URL, owner: ownerSrv.URL}), func(c *Config) { c.HopKey = testHopKey })
	for _, u := range []string{srv.URL, ownerSrv.URL} {
		resp := post(t, t.Context(), u+"/v1/chat/completions", chatBody("m", true, longPrompt))
		if readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	waitCounted(t, entry, epChat, 1)
	waitCounted(t, owner, epChat, 1)
	count := func(o prometheus.Observer) (uint64, float64) {
		t.Helper()
		var m dto.Metric
		if err := o.(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
	}
	for _, c := range []struct {
		name string
		p    *Proxy
		i    int
		want uint64
	}{
		{"entry local", entry, 0, 0}, {"entry peer", entry, 1, 1}, {"entry hop", entry, 2, 0},
		{"owner local", owner, 0, 1}, {"owner peer", owner, 1, 0}, {"owner hop", owner, 2, 1},
	} {
		if n, _ := count(c.p.m.firstByte[c.i]); n != c.want {
			t.Errorf("%s: %d observations, want %d", c.name, n, c.want)
		}
	}
	_, whole := count(entry.m.firstByte[1])
	_, leg := count(entry.m.upstream[1].ttft)
	if whole < leg {
		t.Errorf("the entry's time to first byte %v s is shorter than its upstream leg's %v s", whole, leg)
	}
}
