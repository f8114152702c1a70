package replicasim

import (
	"context"
	"strings"
	"testing"
)

func TestCountTokens(t *testing.T) {
	cases := []struct {
		text string
		want int
	}{{"", 0}, {"a", 1}, {"abcd", 1}, {"abcde", 2}, {"héllo", 2}, {strings.Repeat("x", 64), 16}}
	for _, c := range cases {
		if got := countTokens(c.text); got != c.want {
			t.Errorf("countTokens(%q) = %d, want %d", c.text, got, c.want)
		}
	}
}

func TestBlockHashesChainAndPrefix(t *testing.T) {
	const bs = 2 // 8 bytes per block
	a := blockHashes("0123456789abcdefXY", bs, 0)
	b := blockHashes("0123456789abcdefZZZZZZZZ", bs, 0)
	c := blockHashes("Z1234567"+"89abcdef", bs, 0)
	if len(a) != 2 || len(b) != 3 {
		t.Fatalf("full blocks = %d, %d; want 2, 3 (partial blocks are not hashed)", len(a), len(b))
	}
	if a[0] != b[0] || a[1] != b[1] {
		t.Error("equal prefixes must give equal chained hashes")
	}
	if c[1] == a[1] {
		t.Error("block 2 with equal bytes but another prefix must hash differently")
	}
}

func TestChatTemplateKeepsPrefix(t *testing.T) {
	turn1 := []chatMessage{{"system", "be brief"}, {"user", "hi"}}
	answer := " the cat"
	turn2 := append(append([]chatMessage{}, turn1...), chatMessage{"assistant", answer}, chatMessage{"user", "more"})
	r1, r2 := renderChat(turn1, true), renderChat(turn2, true)
	if !strings.HasPrefix(r2, r1+answer+imEnd) {
		t.Fatalf("turn 2 render %q does not start with turn 1 %q + answer + end", r2, r1)
	}
	if !strings.HasSuffix(r1, "<|im_start|>assistant\n") {
		t.Errorf("render %q lacks the generation prompt", r1)
	}
}

func TestFillerTokensAreOneToken(t *testing.T) {
	for i := range 200 {
		if tok := fillerToken(42, i); len(tok) != bytesPerToken {
			t.Fatalf("token %d = %q is %d bytes", i, tok, len(tok))
		}
	}
}

func TestPrefixCacheLRUAndPins(t *testing.T) {
	c := newPrefixCache(3, 16)
	c.release(c.acquire([]uint64{1, 2, 3}))
	// Released last-first: 3 is the least recently used, then 2, then 1.
	pinned := c.acquire([]uint64{1})
	c.release(c.acquire([]uint64{4, 5})) // evicts 3 and 2, not the pinned 1
	cases := []struct {
		hashes []uint64
		want   int
	}{
		{[]uint64{1}, 1},
		{[]uint64{2}, 0},
		{[]uint64{3}, 0},
		{[]uint64{4, 5}, 2},
		{[]uint64{1, 4, 5}, 3},
	}
	for _, tc := range cases {
		held := c.matchAndAcquire(tc.hashes)
		if len(held) != tc.want {
			t.Errorf("match %v = %d, want %d", tc.hashes, len(held), tc.want)
		}
		c.release(held)
	}
	// Everything pinned: a new block has no room and the chain stops there.
	all := c.acquire([]uint64{1, 4, 5})
	if got := c.acquire([]uint64{6, 7}); len(got) != 0 {
		t.Errorf("acquire with a full pinned cache placed %d blocks", len(got))
	}
	c.release(all)
	c.release(pinned)
	if c.len() != 3 {
		t.Errorf("len = %d, want 3", c.len())
	}
	// A reset forgets pinned blocks; releasing them later must not touch
	// the entries that replace them.
	old := c.acquire([]uint64{1})
	c.reset()
	if c.len() != 0 {
		t.Fatalf("len after reset = %d", c.len())
	}
	fresh := c.acquire([]uint64{1})
	c.release(old)
	c.release(c.acquire([]uint64{8, 9, 10})) // must not evict the fresh, pinned 1
	if held := c.matchAndAcquire([]uint64{1}); len(held) != 1 {
		t.Error("stale release unpinned a newer entry")
	}
	c.release(fresh)
}

func TestSchedulerFIFO(t *testing.T) {
	waiting := make(chan int, 16)
	s := &scheduler{max: 1, onChange: func(_, w int) { waiting <- w }}
	ctx := context.Background()
	if _, err := s.acquire(ctx, ""); err != nil {
		t.Fatal(err)
	}
	<-waiting
	order := make(chan int, 3)
	cancelCtx, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error, 1)
	for i := range 3 {
		go func() {
			wctx := ctx
			if i == 1 {
				wctx = cancelCtx
			}
			if _, err := s.acquire(wctx, ""); err != nil {
				gaveUp <- err
				return
			}
			order <- i
			s.release("")
		}()
		if w := <-waiting; w != i+1 {
			t.Fatalf("waiting = %d, want %d", w, i+1)
		}
	}
	cancel() // the middle waiter leaves the queue
	if err := <-gaveUp; err == nil {
		t.Fatal("cancelled waiter got a slot")
	}
	s.release("")
	if a, b := <-order, <-order; a != 0 || b != 2 {
		t.Errorf("order = %d, %d; want 0, 2", a, b)
	}
}
