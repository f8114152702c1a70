package hop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestGoneAction is the rule: only a silent owner's hops are ended, and
// how depends on how far each got.
func TestGoneAction(t *testing.T) {
	phases := []Phase{PhaseUnsent, PhaseMaybe, PhaseDispatched, PhaseRelaying}
	want := map[Check][4]hopAction{
		Answered: {hopLeave, hopLeave, hopLeave, hopLeave},
		Refused:  {hopLeave, hopLeave, hopLeave, hopLeave},
		Silent:   {hopLeave, hopAnswer, hopAnswer, hopCut},
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
		want Check
	}{
		{"answered", nil, Answered},
		{"refused", fmt.Errorf("Get: %w", opErr("dial", syscall.ECONNREFUSED)), Refused},
		{"reset", fmt.Errorf("Get: %w", opErr("read", syscall.ECONNRESET)), Refused},
		{"timeout", fmt.Errorf("Get: %w", context.DeadlineExceeded), Silent},
		{"host unreachable", fmt.Errorf("Get: %w", opErr("dial", syscall.EHOSTUNREACH)), Silent},
		{"no such host", &net.DNSError{Err: "no such host", Name: "r3", IsNotFound: true}, Silent},
		{"EOF", io.ErrUnexpectedEOF, Silent},
	} {
		if got := checkOf(tc.err); got != tc.want {
			t.Errorf("%s: checkOf = %d, want %d", tc.name, got, tc.want)
		}
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
	o := NewOwners(func(ctx context.Context, api string) (Check, error) {
		mu.Lock()
		probes++
		mu.Unlock()
		<-release
		return Silent, nil
	}, func(end string) { mu.Lock(); counts[end]++; mu.Unlock() }, hclog.NewNullLogger())
	o.Gone("http://b") // no hops there
	var ended []error
	end := func(err error) { mu.Lock(); ended = append(ended, err); mu.Unlock() }
	h1 := o.Add("http://b", nil, end) // no watch: may be running
	h2 := o.Add("http://b", nil, end)
	h2.relaying.Store(true)
	h3 := o.Add("http://c", nil, end)
	o.Gone("http://b")
	o.Gone("http://b") // being probed: no second probe
	// Sent after the event, to a router the view took for alive again:
	// the probe of the one gone does not judge it.
	h4 := o.Add("http://b", nil, end)
	close(release)
	o.wg.Wait()
	if h4.Gone() {
		t.Error("a hop sent after the event was ended")
	}
	o.Remove(h1)
	o.Remove(h2)
	o.Remove(h3)
	o.Remove(h4)
	mu.Lock()
	if probes != 1 || len(ended) != 2 || !errors.Is(ended[0], errOwnerGone) || counts[GoneCut] != 1 {
		t.Errorf("probes %d, ended %v, counts %v; want 1 probe, 2 ended by errOwnerGone, 1 cut", probes, ended, counts)
	}
	mu.Unlock()
	if !h1.Gone() || !h2.Gone() || h3.Gone() {
		t.Errorf("gone: b's %v %v, c's %v; want b's only", h1.Gone(), h2.Gone(), h3.Gone())
	}
	o.mu.Lock()
	left := len(o.hops) + len(o.probing)
	o.mu.Unlock()
	if left != 0 {
		t.Errorf("%d owners still held after every hop ended", left)
	}
	o.Close()
	o.Add("http://b", nil, end)
	o.Gone("http://b")
	o.wg.Wait()
	if probes != 1 {
		t.Errorf("probed after close")
	}
}
