package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestGoneAction is the rule: only a silent owner's hops are ended, and
// how depends on how far each got.
func TestGoneAction(t *testing.T) {
	phases := []hopPhase{phaseUnsent, phaseMaybe, phaseDispatched, phaseRelaying}
	want := map[ownerCheck][4]hopAction{
		ownerAnswered: {hopLeave, hopLeave, hopLeave, hopLeave},
		ownerRefused:  {hopLeave, hopLeave, hopLeave, hopLeave},
		ownerSilent:   {hopLeave, hopAnswer, hopAnswer, hopCut},
	}
	for check, acts := range want {
		for i, ph := range phases {
			if got := goneAction(check, ph, false); got != acts[i] {
				t.Errorf("goneAction(check %d, phase %d) = %d, want %d", check, ph, got, acts[i])
			}
			// An owner that spoke on the hop since the event is alive
			// on that path: never ended.
			if got := goneAction(check, ph, true); got != hopLeave {
				t.Errorf("goneAction(check %d, phase %d, spoke) = %d, want leave", check, ph, got)
			}
		}
	}
}

// TestCheckOf: an answer or a refusal says the owner's host is there; any
// other failure is silence.
func TestCheckOf(t *testing.T) {
	opErr := func(op string, err error) error {
		return &net.OpError{Op: op, Net: "tcp", Err: os.NewSyscallError(op, err)}
	}
	for _, tc := range []struct {
		name string
		err  error
		want ownerCheck
	}{
		{"answered", nil, ownerAnswered},
		{"refused", fmt.Errorf("Get: %w", opErr("dial", syscall.ECONNREFUSED)), ownerRefused},
		{"reset", fmt.Errorf("Get: %w", opErr("read", syscall.ECONNRESET)), ownerRefused},
		{"timeout", fmt.Errorf("Get: %w", context.DeadlineExceeded), ownerSilent},
		{"host unreachable", fmt.Errorf("Get: %w", opErr("dial", syscall.EHOSTUNREACH)), ownerSilent},
		{"no such host", &net.DNSError{Err: "no such host", Name: "r3", IsNotFound: true}, ownerSilent},
		{"EOF", io.ErrUnexpectedEOF, ownerSilent},
	} {
		if got := checkOf(tc.err); got != tc.want {
			t.Errorf("%s: checkOf = %d, want %d", tc.name, got, tc.want)
		}
	}
}

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
	if got, _ := p.probeOwner(t.Context(), live.URL); got != ownerAnswered {
		t.Errorf("live owner: %d, want answered", got)
	}
	if got, _ := p.probeOwner(t.Context(), deadAddr(t)); got != ownerRefused {
		t.Errorf("closed port: %d, want refused", got)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // accepted by the kernel, never answered: a stopped router
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // past its bound at once: the outcome, not the wait, is tested
	if got, _ := p.probeOwner(ctx, "http://"+ln.Addr().String()); got != ownerSilent {
		t.Errorf("silent owner: %d, want silent", got)
	}
}

// TestOwnerHopsBounded: the registry holds a hop from add to remove and
// nothing after; an event for an owner with no hops probes nothing, one
// for an owner being probed starts no second probe, a hop sent after the
// event is not judged by its probe, and after close nothing is probed.
func TestOwnerHopsBounded(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	probes := 0
	counts := map[string]int{}
	o := newOwnerHops(func(ctx context.Context, api string) (ownerCheck, error) {
		mu.Lock()
		probes++
		mu.Unlock()
		<-release
		return ownerSilent, nil
	}, func(end string) { mu.Lock(); counts[end]++; mu.Unlock() }, hclog.NewNullLogger())
	o.gone("http://b") // no hops there
	var ended []error
	end := func(err error) { mu.Lock(); ended = append(ended, err); mu.Unlock() }
	h1 := o.add("http://b", nil, end) // no watch: may be running
	h2 := o.add("http://b", nil, end)
	h2.relaying.Store(true)
	h3 := o.add("http://c", nil, end)
	o.gone("http://b")
	o.gone("http://b") // being probed: no second probe
	// Sent after the event, to a router the view took for alive again:
	// the probe of the one gone does not judge it.
	h4 := o.add("http://b", nil, end)
	close(release)
	o.wg.Wait()
	if h4.gone() {
		t.Error("a hop sent after the event was ended")
	}
	o.remove(h1)
	o.remove(h2)
	o.remove(h3)
	o.remove(h4)
	mu.Lock()
	if probes != 1 || len(ended) != 2 || !errors.Is(ended[0], errOwnerGone) || counts[goneCut] != 1 {
		t.Errorf("probes %d, ended %v, counts %v; want 1 probe, 2 ended by errOwnerGone, 1 cut", probes, ended, counts)
	}
	mu.Unlock()
	if !h1.gone() || !h2.gone() || h3.gone() {
		t.Errorf("gone: b's %v %v, c's %v; want b's only", h1.gone(), h2.gone(), h3.gone())
	}
	o.mu.Lock()
	left := len(o.hops) + len(o.probing)
	o.mu.Unlock()
	if left != 0 {
		t.Errorf("%d owners still held after every hop ended", left)
	}
	o.close()
	o.add("http://b", nil, end)
	o.gone("http://b")
	o.wg.Wait()
	if probes != 1 {
		t.Errorf("probed after close")
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
func (rig *goneRig) waitPhase(t *testing.T, ph hopPhase) {
	t.Helper()
	waitFor(t, fmt.Sprintf("a hop in phase %d", ph), func() bool {
		o := rig.p.owners
		o.mu.Lock()
		defer o.mu.Unlock()
		for h := range o.hops[rig.owner.URL] {
			if h.phase() == ph {
				return true
			}
		}
		return false
	})
}

// dispatchAndHang is a stub owner that announces the dispatch, then
// sends nothing more (a partition or a stopped router after the 103);
// its /healthz hangs too. stream makes it send a stream's head and one
// event first.
func dispatchAndHang(stream bool) func(rig *goneRig, w http.ResponseWriter, r *http.Request) {
	return func(rig *goneRig, w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set(HeaderDispatched, "1")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del(HeaderDispatched)
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
	rig.p.owners.probe = func(ctx context.Context, api string) (ownerCheck, error) { return ownerSilent, nil }
	done := postAsync(t.Context(), rig.entry.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	rig.waitPhase(t, phaseDispatched)
	rig.view.gone(rig.owner.URL)
	res := recv(t, done, "the client's answer after its owner was gone")
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.status != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", res.status, res.body)
	}
	typ, code, msg := openAIError(t, res.body)
	if typ != "server_error" || code == nil || *code != codeOwnerGone || !strings.Contains(msg, "not retried") {
		t.Errorf("error %s %v %q, want server_error %s", typ, code, msg, codeOwnerGone)
	}
	if got := testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(goneError)); got != 1 {
		t.Errorf("kvmesh_hops_owner_gone_total{end=error} = %v, want 1", got)
	}
}

// TestOwnerGoneCutsRelayedHop: a stream relayed from an owner that went
// silent ends when the owner is gone, through the mid-stream failure
// path: the client has the events before, that path's error event (with
// the code owner_router_gone), and no [DONE].
func TestOwnerGoneCutsRelayedHop(t *testing.T) {
	rig := newGoneRig(t, dispatchAndHang(true))
	rig.p.owners.probe = func(ctx context.Context, api string) (ownerCheck, error) { return ownerSilent, nil }
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
	rig.waitPhase(t, phaseRelaying)
	rig.view.gone(rig.owner.URL)
	ended := make(chan string, 1)
	go func() {
		rest, _ := io.ReadAll(br) // an error event, or a broken body: either ends it
		ended <- string(rest)
	}()
	rest := recv(t, ended, "the relay's end after its owner was gone")
	if strings.Contains(rest, "[DONE]") || !strings.Contains(rest, `"code":"`+codeOwnerGone+`"`) {
		t.Errorf("a cut stream ended with %q, want the mid-stream error event (%s) and no [DONE]", rest, codeOwnerGone)
	}
	waitFor(t, "the cut counted, as owner_gone's error event", func() bool {
		return testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(goneCut)) == 1 &&
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
		w.Header().Set(HeaderDispatched, "1")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del(HeaderDispatched)
		select {
		case <-answer:
			jsonChat(w, "finished", 0)
		case <-rig.release:
		}
	})
	done := postAsync(t.Context(), rig.entry.URL+"/v1/chat/completions", chatBody("m", false, longPrompt))
	rig.waitPhase(t, phaseDispatched)
	rig.view.gone(rig.owner.URL)
	waitFor(t, "the probe's verdict", func() bool {
		return testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(goneKept)) == 1
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
	rig.p.owners.probe = func(ctx context.Context, api string) (ownerCheck, error) {
		close(probed)
		<-proceed
		return ownerSilent, nil
	}
	resp := post(t, t.Context(), rig.entry.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	rig.waitPhase(t, phaseRelaying)
	rest := make(chan string, 1)
	go func() { b, _ := io.ReadAll(br); rest <- string(b) }() // the client reads on
	rig.view.gone(rig.owner.URL)
	mark := int64(time.Since(rig.p.owners.base)) // not before the event
	recv(t, probed, "the probe")
	waitFor(t, "a byte from the owner after the event", func() bool {
		o := rig.p.owners
		o.mu.Lock()
		defer o.mu.Unlock()
		for h := range o.hops[rig.owner.URL] {
			if h.heard.Load() > mark {
				return true
			}
		}
		return false
	})
	close(proceed)
	waitFor(t, "the probe's verdict", func() bool {
		return testutil.ToFloat64(rig.p.m.ownerGone.WithLabelValues(goneKept)) == 1
	})
	close(finish)
	got := recv(t, rest, "the kept stream's end")
	if !strings.HasSuffix(got, "data: [DONE]\n\n") || strings.Contains(got, `"error"`) {
		t.Fatalf("the kept stream ended %q; want [DONE] and no error event", got[max(len(got)-200, 0):])
	}
}
