package proxy

import (
	"testing"
	"time"
)

// TestFlightBlocks: a request's match is the leading blocks of the
// requests in flight at the same replica before it; ended requests and
// other replicas' count nothing, and a replica past the bound keeps no
// more blocks.
func TestFlightBlocks(t *testing.T) {
	f := newFlightBlocks()
	m, endA := f.begin("r1", []uint64{1, 2, 3})
	if m != 0 {
		t.Fatalf("first request matched %d, want 0", m)
	}
	if m, end := f.begin("r2", []uint64{1, 2}); m != 0 {
		t.Errorf("another replica's request matched %d, want 0", m)
	} else {
		end()
	}
	m, endB := f.begin("r1", []uint64{1, 2, 9})
	if m != 2 {
		t.Errorf("second request matched %d, want 2 (the first's leading blocks)", m)
	}
	endA()
	if m, end := f.begin("r1", []uint64{1, 2, 3}); m != 2 {
		t.Errorf("after the first ended matched %d, want 2 (the second's blocks only)", m)
	} else {
		end()
	}
	endB()
	if len(f.by) != 0 {
		t.Errorf("%d replicas kept after every request ended, want 0", len(f.by))
	}

	big := make([]uint64, maxFlightBlocks+10)
	for i := range big {
		big[i] = uint64(i + 1)
	}
	_, endBig := f.begin("r1", big)
	if n := len(f.by["r1"]); n != maxFlightBlocks {
		t.Errorf("%d blocks kept, want the bound %d", n, maxFlightBlocks)
	}
	if m, end := f.begin("r1", big); m != maxFlightBlocks {
		t.Errorf("matched %d of a prompt past the bound, want %d", m, maxFlightBlocks)
	} else {
		end()
	}
	endBig()
	if len(f.by) != 0 {
		t.Errorf("%d replicas kept after every request ended, want 0", len(f.by))
	}
}

// TestAcceptedFirst: an engine that answered the headers at once and the
// first token later accepted the request before computing it (vLLM); one
// whose headers came with the first token did not (llama.cpp).
func TestAcceptedFirst(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name          string
		headed, first time.Time
		want          bool
	}{
		{"headers at once, then the prefill", ms(3), ms(1500), true},
		{"headers with the first token", ms(1500), ms(1500), false},
		{"headers after a queue, first token just after", ms(1500), ms(1510), false},
	} {
		if got := acceptedFirst(t0, tc.headed, tc.first); got != tc.want {
			t.Errorf("%s: acceptedFirst = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestSharesInFlight: an engine known to queue and share (vLLM) shares
// even when an answer's timing looks like a slot's (headers held back
// with the first token, as behind a buffering proxy); one known to give
// each request a slot (llama.cpp) shares nothing even when its headers
// came at once; an engine not known is judged by the timing.
func TestSharesInFlight(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	known := func(shares bool) func(string) (bool, bool) {
		return func(id string) (bool, bool) {
			if id != "r1" {
				t.Errorf("asked about %q, want r1", id)
			}
			return shares, true
		}
	}
	unknown := func(string) (bool, bool) { return false, false }
	slotTiming := [2]time.Time{ms(1500), ms(1500)} // headers with the first token
	queueTiming := [2]time.Time{ms(3), ms(1500)}   // headers at once, then the prefill
	for _, tc := range []struct {
		name   string
		shares func(string) (bool, bool)
		timing [2]time.Time
		want   bool
	}{
		{"vLLM, slot-like timing", known(true), slotTiming, true},
		{"llama.cpp, queue-like timing", known(false), queueTiming, false},
		{"unknown engine, queue-like timing", unknown, queueTiming, true},
		{"unknown engine, slot-like timing", unknown, slotTiming, false},
		{"no engine facts, queue-like timing", nil, queueTiming, true},
	} {
		if got := sharesInFlight(tc.shares, "r1", t0, tc.timing[0], tc.timing[1]); got != tc.want {
			t.Errorf("%s: sharesInFlight = %v, want %v", tc.name, got, tc.want)
		}
	}
}
