package kvevents

import (
	"context"
	"errors"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"go.uber.org/goleak"
)

func sample() Batch {
	return Batch{TS: 1700000000.5, Events: []Event{
		{Kind: BlockStored, Hashes: []uint64{1, 2, 1 << 63}, BlockSize: 32, Tokens: 96, Medium: "GPU"},
		{Kind: BlockStored, Hashes: []uint64{9}, Parent: 1 << 63, HasParent: true, BlockSize: 32, Tokens: 32},
		{Kind: BlockRemoved, Hashes: []uint64{2}, Medium: "GPU"},
		{Kind: AllBlocksCleared},
	}}
}

func TestRoundTripBothForms(t *testing.T) {
	for _, form := range []Form{FormMap, FormArray} {
		p, err := EncodeBatch(sample(), form)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeBatch(p)
		if err != nil {
			t.Fatalf("form %d: %v", form, err)
		}
		want := sample()
		for i := range want.Events { // nil and empty are alike here
			if len(want.Events[i].Hashes) == 0 {
				want.Events[i].Hashes, got.Events[i].Hashes = nil, nil
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("form %d:\n got %+v\nwant %+v", form, got, want)
		}
	}
}

// TestVLLMShapes decodes payloads built the way vLLM's msgspec encoder
// writes them: 0.32's tagged maps with fields the router does not read
// (lora_name, extra_keys, group_idx), bytes hashes, an unknown event kind,
// and the older array form with more trailing fields than it knows.
func TestVLLMShapes(t *testing.T) {
	enc := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	v032 := enc([]any{1.5, []any{
		map[string]any{"type": "BlockStored", "block_hashes": []any{uint64(1) << 63, int64(-5)}, "parent_block_hash": nil,
			"token_ids": []int{1, 2, 3}, "block_size": 32, "lora_id": nil, "medium": "GPU", "lora_name": nil, "extra_keys": []any{nil, []any{"x"}}},
		map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte("sha256-digest-bytes")}, "medium": "GPU", "group_idx": 0},
		map[string]any{"type": "SomethingNew", "x": 1},
		map[string]any{"type": "AllBlocksCleared"},
	}, 0})
	b, err := DecodeBatch(v032)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 3 || b.Skipped != 1 || b.Events[0].Hashes[0] != 1<<63 || b.Events[0].Hashes[1] != uint64(1<<64-5) ||
		b.Events[0].Tokens != 3 || b.Events[0].HasParent || b.Events[1].Kind != BlockRemoved || b.Events[2].Kind != AllBlocksCleared {
		t.Fatalf("0.32 form: %+v", b)
	}
	old := enc([]any{2.0, []any{
		[]any{"BlockStored", []any{7, 8}, 6, []int{1, 2}, 16, nil, "GPU", "extra", 1},
		[]any{"BlockRemoved", []any{7}, nil},
	}})
	b, err = DecodeBatch(old)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Events) != 2 || !b.Events[0].HasParent || b.Events[0].Parent != 6 || b.Events[0].BlockSize != 16 || b.Events[1].Hashes[0] != 7 {
		t.Fatalf("array form: %+v", b)
	}
	for name, p := range map[string][]byte{
		"empty": nil, "scalar": enc(1), "no events": enc([]any{1.0}), "event without type": enc([]any{1.0, []any{map[string]any{"x": 1}}}),
		"trailing": append(enc([]any{1.0, []any{}}), 0), "hash of a map": enc([]any{1.0, []any{[]any{"BlockRemoved", []any{map[string]any{}}}}}),
		"deep": func() []byte { // nested past maxDepth where a value is skipped
			v := any(1)
			for range 40 {
				v = []any{v}
			}
			return enc([]any{1.0, []any{}, v})
		}(),
	} {
		if _, err := DecodeBatch(p); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
}

// FuzzDecodeBatch: any payload decodes within the limits or is refused,
// and what decodes re-encodes to a payload that decodes the same.
func FuzzDecodeBatch(f *testing.F) {
	for _, form := range []Form{FormMap, FormArray} {
		p, _ := EncodeBatch(sample(), form)
		f.Add(p)
	}
	f.Add([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p)
		if err != nil {
			return
		}
		n := 0
		for _, e := range b.Events {
			n += len(e.Hashes)
		}
		if len(b.Events) > len(p) || n > len(p) {
			t.Fatalf("%d events, %d hashes from %d bytes", len(b.Events), n, len(p))
		}
		for _, form := range []Form{FormMap, FormArray} {
			q, err := EncodeBatch(b, form)
			if err != nil {
				t.Fatal(err)
			}
			c, err := DecodeBatch(q)
			if err != nil {
				t.Fatalf("re-encoded batch refused: %v", err)
			}
			c.Skipped = b.Skipped
			for i := range c.Events {
				if len(c.Events[i].Hashes) == 0 && len(b.Events[i].Hashes) == 0 {
					c.Events[i].Hashes = b.Events[i].Hashes
				}
			}
			if !reflect.DeepEqual(c, b) {
				t.Fatalf("re-encoded:\n%+v\n%+v", c, b)
			}
		}
	})
}

// recorder is a Handler that keeps what it was given.
type recorder struct {
	mu     sync.Mutex
	stored []uint64
	lost   []string
}

func (r *recorder) Batch(b Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range b.Events {
		r.stored = append(r.stored, e.Hashes...)
	}
}

func (r *recorder) Lost(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lost = append(r.lost, reason)
}

func (r *recorder) snapshot() ([]uint64, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint64(nil), r.stored...), len(r.lost)
}

func listen(t *testing.T) net.Listener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func stored(h uint64) Batch {
	return Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []Event{{Kind: BlockStored, Hashes: []uint64{h}, BlockSize: 16}}}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 500 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestGapReplayedThenLost: a batch lost on the way is replayed from the
// buffer, in order; once the buffer no longer reaches back, the loss is
// reported; a publisher that restarts (a new engine) is reported too; a
// dropped connection is redialled.
func TestGapReplayedThenLost(t *testing.T) {
	defer goleak.VerifyNone(t)
	ln, rl := listen(t), listen(t)
	pub := NewPublisher(ln, rl, "kv", FormMap, 2)
	var rec recorder
	sub, err := New(Config{Endpoint: "tcp://" + ln.Addr().String(), Replay: "tcp://" + rl.Addr().String(), Topic: "kv",
		MinBackoff: 10 * time.Millisecond}, &rec)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sub.Run(ctx) }()
	defer func() { cancel(); <-done; pub.Close() }()
	waitFor(t, "a subscriber", func() bool { return pub.Subscribers() == 1 })

	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(pub.Publish(stored(1)))
	must(pub.Skip(stored(2))) // lost on the way, still buffered
	must(pub.Publish(stored(3)))
	waitFor(t, "1, 2 (replayed), 3", func() bool { s, _ := rec.snapshot(); return len(s) == 3 })
	if s, lost := rec.snapshot(); !reflect.DeepEqual(s, []uint64{1, 2, 3}) || lost != 0 {
		t.Fatalf("after a replayed gap: %v, %d lost", s, lost)
	}
	for h := uint64(4); h <= 6; h++ { // the buffer of 2 keeps 5 and 6 only
		must(pub.Skip(stored(h)))
	}
	must(pub.Publish(stored(7)))
	waitFor(t, "7", func() bool { s, _ := rec.snapshot(); return len(s) >= 4 && s[len(s)-1] == 7 })
	if _, lost := rec.snapshot(); lost != 1 {
		t.Fatalf("a gap past the buffer reported %d losses, want 1", lost)
	}
	st := sub.Stats()
	if st.Gaps != 2 || st.Resyncs != 1 || st.Replayed == 0 || st.LastSeq != 6 || !st.Connected {
		t.Fatalf("stats %+v", st)
	}

	// The engine restarts: a new publisher on the same port, sequence from 0.
	addr := ln.Addr().String()
	pub.Close()
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skip("port taken meanwhile:", err)
	}
	pub = NewPublisher(ln2, nil, "kv", FormArray, 2)
	waitFor(t, "the subscriber back", func() bool { return pub.Subscribers() == 1 })
	must(pub.Publish(stored(100)))
	waitFor(t, "100", func() bool { s, _ := rec.snapshot(); return s[len(s)-1] == 100 })
	if _, lost := rec.snapshot(); lost != 2 {
		t.Fatalf("a restarted publisher reported %d losses in all, want 2", lost)
	}
	if st := sub.Stats(); st.Reconnects == 0 || st.LastSeq != 0 {
		t.Fatalf("after the restart: %+v", st)
	}
}

func TestEndpointSyntax(t *testing.T) {
	for _, ep := range []string{"", "127.0.0.1:5557", "tcp://*:5557", "ipc:///tmp/x"} {
		if _, err := New(Config{Endpoint: ep}, &recorder{}); err == nil {
			t.Errorf("%q accepted", ep)
		}
	}
	if _, err := New(Config{Endpoint: "tcp://127.0.0.1:5557", Replay: "tcp://*:5558"}, &recorder{}); err == nil {
		t.Error("a wildcard replay endpoint accepted")
	}
}
