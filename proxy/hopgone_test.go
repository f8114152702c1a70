package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/hop"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestProbeOwner probes a live router, a closed port and a router that
// accepts and never answers.
func TestProbeOwner(t *testing.T) {
	p, _, _ := newEdgeProxy(t, newFakeView([]string{"m"}), nil)
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			t.Errorf("probe of %s", r.URL.Path)
		}
		w.WriteHeader(http.StatusServiceUnavailable) // any answer is an answer
	}))
	defer live.Close()
	if got, _ := p.probeOwner(t.Context(), live.URL); got != hop.Answered {
		t.Errorf("live owner: %d, want answered", got)
	}
	if got, _ := p.probeOwner(t.Context(), deadAddr(t)); got != hop.Refused {
		t.Errorf("closed port: %d, want refused", got)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // accepted by the kernel, never answered: a stopped router
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // past its bound at once: the outcome, not the wait, is tested
	if got, _ := p.probeOwner(ctx, "http://"+ln.Addr().String()); got != hop.Silent {
		t.Errorf("silent owner: %d, want silent", got)
	}
}

// goneView is a fake view that tells the proxy of routers gone.
type goneView struct {
	*fakeView
	mu  sync.Mutex
	fns []func(string)
}

func (v *goneView) WatchGone(fn func(string)) func() {
	v.mu.Lock()
	v.fns = append(v.fns, fn)
	v.mu.Unlock()
	return func() {}
}

func (v *goneView) gone(api string) {
	v.mu.Lock()
	fns := v.fns
	v.mu.Unlock()
	for _, fn := range fns {
		fn(api)
	}
}

// goneRig is an entry A whose one replica R is owned by a stub owner B
// that runs fault for every hop.
type goneRig struct {
	p       *Proxy
	entry   *httptest.Server
	owner   *httptest.Server
	view    *goneView
	release chan struct{}
}

func newGoneRig(t *testing.T, fault func(rig *goneRig, w http.ResponseWriter, r *http.Request)) *goneRig {
	t.Helper()
	rig := &goneRig{release: make(chan struct{})}
	rig.owner = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fault(rig, w, r) }))
	t.Cleanup(rig.owner.Close)
	t.Cleanup(func() { close(rig.release) }) // before Close: it waits for the handlers
	rig.view = &goneView{fakeView: newFakeView([]string{"m"}, fakeReplica{id: "http://replica-r.test", owner: rig.owner.URL, match: 20})}
	rig.p, rig.entry, _ = newEdgeProxy(t, rig.view, func(c *Config) { c.HopKey = testHopKey })
	t.Cleanup(rig.p.Close)
	return rig
}

// clientAnswer is a client's answer, or the error that prevented it.
type clientAnswer struct {
	status int
	body   string
	err    error
}

// postAsync sends a chat request from another goroutine (which must not
// call t.Fatal) and delivers its answer.
func postAsync(ctx context.Context, url, body string) <-chan clientAnswer {
	done := make(chan clientAnswer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			done <- clientAnswer{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- clientAnswer{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- clientAnswer{resp.StatusCode, string(b), err}
	}()
	return done
}

// waitPhase waits until A has one hop to B in phase ph.
func (rig *goneRig) waitPhase(t *testing.T, ph hop.Phase) {
	t.Helper()
	waitFor(t, fmt.Sprintf("a hop in phase %d", ph), func() bool { return rig.p.owners.HasPhase(rig.owner.URL, ph) })
}

// dispatchAndHang is a stub owner that announces the dispatch, then
// sends nothing more (a partition or a stopped router after the 103);
// its /healthz hangs too. stream makes it send a stream's head and one
// event first.
func dispatchAndHang(stream bool) func(rig *goneRig, w http.ResponseWriter, r *http.Request) {
	return func(rig *goneRig, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set(hop.HeaderDispatched, "1")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del(hop.HeaderDispatched)
			if stream {
				w.Header().Set("Content-Type", "text/event-stream")
				w.WriteHeader(http.StatusOK)
				fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"one\"}}]}\n\n")
				w.(http.Flusher).Flush()
			}
		}
		select {
		case <-r.Context().Done():
		case <-rig.release:
		}
	}
}

// TestOwnerGoneAnswersDispatchedHop: a hop whose owner announced the
// dispatch and then went silent is answered 502 owner_router_gone as
// soon as the mesh says the owner is gone and it does not answer its
// probe; without that the client waits for the response-header timeout.
func TestOwnerGoneAnswersDispatchedHop(t *testing.T) {
	rig := newGoneRig(t, dispatchAndHang(false))
	rig.p.probeOwner = func(ctx context.Context, api string) (hop.Check, error) { return hop.Silent, nil }
	done := postAsync(t.Context(), rig.entry.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	rig.waitPhase(t, hop.PhaseDispatched)
	rig.view.gone(rig.owner.URL)
	res := recv(t, done, "the client's answer after its owner was gone")
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.status != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", res.status, res.body)
	}
	typ, code, msg := openAIError(t, res.body)
	if typ != "server_error" || code == nil || *code != hop.CodeOwnerGone || !strings.Contains(msg, "not retried") {
		t.Errorf("error %s %v %q, want server_error %s", typ, code, msg, hop.CodeOwnerGone)
	}
	if got := testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(hop.GoneError)); got != 1 {
		t.Errorf("kvmesh_hops_owner_gone_total{end=error} = %v, want 1", got)
	}
}

// TestOwnerGoneCutsRelayedHop: a stream relayed from an owner that went
// silent ends when the owner is gone, through the mid-stream failure
// path: the client has the events before, that path's error event (with
// the code owner_router_gone), and no [DONE].
func TestOwnerGoneCutsRelayedHop(t *testing.T) {
	rig := newGoneRig(t, dispatchAndHang(true))
	rig.p.probeOwner = func(ctx context.Context, api string) (hop.Check, error) { return hop.Silent, nil }
	resp := post(t, t.Context(), rig.entry.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, `"one"`) {
		t.Fatalf("first event %q, %v", first, err)
	}
	rig.waitPhase(t, hop.PhaseRelaying)
	rig.view.gone(rig.owner.URL)
	ended := make(chan string, 1)
	go func() {
		rest, _ := io.ReadAll(br) // an error event, or a broken body: either ends it
		ended <- string(rest)
	}()
	rest := recv(t, ended, "the relay's end after its owner was gone")
	if strings.Contains(rest, "[DONE]") || !strings.Contains(rest, `"code":"`+hop.CodeOwnerGone+`"`) {
		t.Errorf("a cut stream ended with %q, want the mid-stream error event (%s) and no [DONE]", rest, hop.CodeOwnerGone)
	}
	waitFor(t, "the cut counted, as owner_gone's error event", func() bool {
		return testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(hop.GoneCut)) == 1 &&
			testutil.ToFloat64(rig.p.m.midstream.WithLabelValues(midstreamOwnerGone, endErrorEvent)) == 1
	})
}

// TestOwnerGoneButAnsweringKeepsHop: an owner the mesh took for gone but
// that answers its probe (it is leaving and draining, or the verdict was
// wrong) keeps its hops: the request completes.
func TestOwnerGoneButAnsweringKeepsHop(t *testing.T) {
	answer := make(chan struct{})
	rig := newGoneRig(t, func(rig *goneRig, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			w.WriteHeader(http.StatusOK)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set(hop.HeaderDispatched, "1")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del(hop.HeaderDispatched)
		select {
		case <-answer:
			jsonChat(w, "finished", 0)
		case <-rig.release:
		}
	})
	done := postAsync(t.Context(), rig.entry.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	rig.waitPhase(t, hop.PhaseDispatched)
	rig.view.gone(rig.owner.URL)
	waitFor(t, "the probe's verdict", func() bool {
		return testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(hop.GoneKept)) == 1
	})
	close(answer)
	res := recv(t, done, "the kept hop's answer")
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.status != http.StatusOK || !strings.Contains(res.body, "finished") {
		t.Fatalf("status %d %s, want the owner's answer", res.status, res.body)
	}
}

// TestOwnerGoneButStreamingKeepsHop: a relayed stream whose owner the
// mesh took for gone, and whose probe met silence (a lossy path, a wrong
// verdict), runs on while the owner still sends it bytes: the hop's own
// traffic after the event proves the owner alive on that path.
func TestOwnerGoneButStreamingKeepsHop(t *testing.T) {
	finish := make(chan struct{})
	rig := newGoneRig(t, func(rig *goneRig, w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := 0; ; i++ {
			select {
			case <-finish:
				fmt.Fprint(w, "data: [DONE]\n\n")
				return
			case <-rig.release:
				return
			case <-r.Context().Done():
				return
			default:
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
			time.Sleep(time.Millisecond) // a token stream, not a busy loop
		}
	})
	probed := make(chan struct{})
	proceed := make(chan struct{})
	rig.p.probeOwner = func(ctx context.Context, api string) (hop.Check, error) {
		close(probed)
		<-proceed
		return hop.Silent, nil
	}
	resp := post(t, t.Context(), rig.entry.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	rig.waitPhase(t, hop.PhaseRelaying)
	rest := make(chan string, 1)
	go func() { b, _ := io.ReadAll(br); rest <- string(b) }() // the client reads on
	rig.view.gone(rig.owner.URL)
	mark := rig.p.owners.Stamp() // not before the event
	recv(t, probed, "the probe")
	waitFor(t, "a byte from the owner after the event", func() bool { return rig.p.owners.HeardSince(rig.owner.URL, mark) })
	close(proceed)
	waitFor(t, "the probe's verdict", func() bool {
		return testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(hop.GoneKept)) == 1
	})
	close(finish)
	got := recv(t, rest, "the kept stream's end")
	if !strings.HasSuffix(got, "data: [DONE]\n\n") || strings.Contains(got, `"error"`) {
		t.Fatalf("the kept stream ended %q; want [DONE] and no error event", got[max(len(got)-200, 0):])
	}
}
