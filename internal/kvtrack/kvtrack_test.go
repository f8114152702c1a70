package kvtrack

import (
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/kvevents"
)

// fakeSums records what the tracker tells the summary.
type fakeSums struct {
	mu       sync.Mutex
	evicted  []uint64
	rebases  [][]uint64
	recorded []uint64
	refuse   bool
}

func (f *fakeSums) Evicted(_ string, h []uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.evicted = append(f.evicted, h...)
	return !f.refuse
}

func (f *fakeSums) Rebase(_ string, held []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rebases = append(f.rebases, slices.Sorted(slices.Values(held)))
}

func (f *fakeSums) Record(_ string, h []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recorded = append(f.recorded, h...)
}

func (f *fakeSums) take() []uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.evicted
	f.evicted = nil
	slices.Sort(e)
	return e
}

// clock is a test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }
func (c *clock) tick()          { c.t = c.t.Add(10 * time.Millisecond) }

// send is when a request is sent: now, and the clock ticks on, so that
// what the engine stores for it comes after.
func (c *clock) send() time.Time {
	sent := c.t
	c.tick()
	return sent
}

// tracked is a tracker of replica "r" over fake summaries, on a test
// clock (cfg.Now is set to it).
func tracked(cfg Config) (*Tracker, *fakeSums, *clock) {
	var sums fakeSums
	c := &clock{t: time.Unix(1000, 0)}
	cfg.Now = c.now
	return New("r", &sums, cfg), &sums, c
}

func stored(parent uint64, has bool, hashes ...uint64) kvevents.Batch {
	return kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockStored, Hashes: hashes, Parent: parent, HasParent: has, BlockSize: 4}}}
}

func removed(hashes ...uint64) kvevents.Batch {
	return kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, Hashes: hashes}}}
}

// With 4 tokens per engine block, 16 bytes per text block and 4 bytes
// per token, text block i ends in engine block i.
func answer(sent time.Time, cached int64, texts ...uint64) Answer {
	n := len(texts)
	return Answer{Hashes: texts, PromptBytes: 16 * n, TextBytes: 16 * n, BlockBytes: 16,
		PromptTokens: int64(4 * n), CompletionTokens: 1, CachedTokens: cached, Sent: sent}
}

func TestEvictionForgetsExactlyTheTextBlocksBelow(t *testing.T) {
	tr, sums, c := tracked(Config{})
	sent := c.send()
	tr.Batch(stored(0, false, 10, 11, 12, 13))
	tr.Answered(answer(sent, 0, 100, 101, 102, 103))
	if st := tr.Stats(); st.Attributed != 1 || st.TextBlocks != 4 {
		t.Fatalf("after one answer: %+v", st)
	}
	if !reflect.DeepEqual(sums.recorded, []uint64{100, 101, 102, 103}) {
		t.Fatalf("related text blocks recorded as held: %v", sums.recorded)
	}
	// A second request shares the first two blocks and adds two.
	c.tick()
	sent = c.send()
	tr.Batch(stored(11, true, 22, 23))
	tr.Answered(answer(sent, 8, 100, 101, 202, 203))
	if st := tr.Stats(); st.Attributed != 2 || st.TextBlocks != 6 {
		t.Fatalf("after the second: %+v", st)
	}
	tr.Batch(removed(13))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{103}) {
		t.Fatalf("evicting the tail forgot %v", got)
	}
	// The shared block goes: both continuations below it go with it.
	tr.Batch(removed(11))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{101, 102, 202, 203}) {
		t.Fatalf("evicting a shared block forgot %v", got)
	}
	tr.Batch(removed(23, 99)) // already gone, and never known
	if got := sums.take(); len(got) != 0 {
		t.Fatalf("unknown blocks forgot %v", got)
	}
	tr.Batch(kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
	if st := tr.Stats(); st.Blocks != 0 || st.TextBlocks != 0 || len(sums.rebases) != 1 || len(sums.rebases[0]) != 0 {
		t.Fatalf("after a clear: %+v, rebases %v", st, sums.rebases)
	}
}

// TestAnswerWaitsForItsBlocks: the answer may come before the engine's
// events; it is related when they arrive.
func TestAnswerWaitsForItsBlocks(t *testing.T) {
	tr, _, c := tracked(Config{})
	sent := c.now()
	tr.Answered(answer(sent, 0, 100, 101))
	if st := tr.Stats(); st.Pending != 1 {
		t.Fatalf("%+v", st)
	}
	c.tick()
	tr.Batch(stored(0, false, 10, 11))
	if st := tr.Stats(); st.Pending != 0 || st.Attributed != 1 {
		t.Fatalf("%+v", st)
	}
	// One whose blocks never come is given up after a while.
	tr.Answered(answer(c.now(), 0, 300, 301, 302))
	c.t = c.t.Add(pendingFor + time.Second)
	tr.Batch(stored(0, false, 50))
	if st := tr.Stats(); st.Pending != 0 || st.Unattributed != 1 {
		t.Fatalf("%+v", st)
	}
}

// TestConcurrentRequestsOfOneLength: two chains of the same depth stored
// after both requests were sent go to them in the order stored; a chain
// stored before a request was sent is never its.
func TestConcurrentRequestsOfOneLength(t *testing.T) {
	tr, sums, c := tracked(Config{})
	old := c.now()
	tr.Batch(stored(0, false, 1, 2))
	tr.Answered(answer(old, 0, 500, 501))
	c.t = c.t.Add(time.Second)
	sent := c.send()
	tr.Batch(stored(0, false, 10, 11))
	c.tick()
	tr.Batch(stored(0, false, 20, 21))
	tr.Answered(answer(sent, 0, 100, 101))
	tr.Answered(answer(sent, 0, 200, 201))
	tr.Batch(removed(11))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{101}) {
		t.Fatalf("the first chain held %v, want the first request's", got)
	}
	tr.Batch(removed(21, 2))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{201, 501}) {
		t.Fatalf("got %v", got)
	}
}

// TestChainStartedBeforeTheSubscription: a prompt whose cached prefix was
// stored before the tracker saw any event is placed by its cached tokens.
func TestChainStartedBeforeTheSubscription(t *testing.T) {
	tr, sums, c := tracked(Config{})
	sent := c.send()
	tr.Batch(stored(7, true, 12, 13)) // 7 (depth 1) was never seen
	tr.Answered(answer(sent, 8, 100, 101, 102, 103))
	tr.Batch(removed(12))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{102, 103}) {
		t.Fatalf("got %v", got)
	}
}

func TestBoundsAndRebase(t *testing.T) {
	tr, sums, c := tracked(Config{MaxBlocks: 64})
	sums.refuse = true
	for i := range uint64(100) {
		tr.Batch(stored(0, false, 1000+i))
	}
	if st := tr.Stats(); st.Blocks != 64 {
		t.Fatalf("%d blocks held, limit 64", st.Blocks)
	}
	sent := c.send()
	tr.Batch(stored(0, false, 10, 11, 12))
	tr.Answered(answer(sent, 0, 100, 101, 102))
	tr.Batch(removed(12))
	if st := tr.Stats(); st.Rebases != 1 || len(sums.rebases) != 1 || !reflect.DeepEqual(sums.rebases[0], []uint64{100, 101}) {
		t.Fatalf("a refused eviction: %+v, rebases %v", st, sums.rebases)
	}
	tr.Lost("gap")
	if st := tr.Stats(); st.Blocks != 0 || st.Losses != 1 {
		t.Fatalf("after a loss: %+v", st)
	}
}

// TestSameTurnOfTwoConversations: the second turns of two conversations
// have equal depths and are stored in one order but answered in the
// other; each is related to the chain under its own first turn, so an
// eviction of one conversation's blocks forgets only its text blocks.
func TestSameTurnOfTwoConversations(t *testing.T) {
	tr, sums, c := tracked(Config{})
	sent := c.send()
	tr.Batch(stored(0, false, 10, 11, 12))
	tr.Batch(stored(0, false, 20, 21, 22))
	tr.Answered(answer(sent, 0, 100, 101, 102))
	tr.Answered(answer(sent, 0, 200, 201, 202))
	c.tick()
	sent = c.send()
	tr.Batch(stored(12, true, 13, 14))
	tr.Batch(stored(22, true, 23, 24))
	tr.Answered(answer(sent, 12, 200, 201, 202, 203, 204)) // answered first, stored second
	tr.Answered(answer(sent, 12, 100, 101, 102, 103, 104))
	if st := tr.Stats(); st.Attributed != 4 || st.Pending != 0 {
		t.Fatalf("%+v", st)
	}
	tr.Batch(removed(14))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{104}) {
		t.Fatalf("evicting the first conversation's tail forgot %v, want [104]", got)
	}
	tr.Batch(removed(23))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{203, 204}) {
		t.Fatalf("evicting the second conversation's second turn forgot %v, want [203 204]", got)
	}
}

// TestAnchoredAnswerWaitsForItsChain: an answer whose cached prefix is
// mapped does not take another conversation's chain of its depth while
// its own has not arrived; it takes its own when it comes.
func TestAnchoredAnswerWaitsForItsChain(t *testing.T) {
	tr, sums, c := tracked(Config{})
	sent := c.send()
	tr.Batch(stored(0, false, 10, 11, 12))
	tr.Answered(answer(sent, 0, 100, 101, 102))
	c.tick()
	sent = c.send()
	tr.Batch(stored(0, false, 30, 31, 32, 33, 34)) // another conversation's, unanswered yet
	tr.Answered(answer(sent, 12, 100, 101, 102, 103, 104))
	if st := tr.Stats(); st.Pending != 1 {
		t.Fatalf("the anchored answer did not wait: %+v", st)
	}
	tr.Batch(stored(12, true, 13, 14))
	if st := tr.Stats(); st.Pending != 0 || st.Attributed != 2 {
		t.Fatalf("%+v", st)
	}
	tr.Batch(removed(33))
	if got := sums.take(); len(got) != 0 {
		t.Fatalf("evicting the other conversation's blocks forgot %v", got)
	}
}

// TestLeafBeforeABlockInsideALongerChain: a block inside another
// request's longer chain may sit at the depth the usage names; the
// answer's own chain ends at a leaf one block off, and is taken.
func TestLeafBeforeABlockInsideALongerChain(t *testing.T) {
	tr, sums, c := tracked(Config{})
	sent := c.send()
	tr.Batch(stored(0, false, 10, 11, 12))         // this answer's: one block short of the usage
	tr.Batch(stored(0, false, 20, 21, 22, 23, 24)) // another request's, unanswered: 23 is at the depth named
	a := answer(sent, 0, 100, 101, 102)
	a.CompletionTokens = 5 // the usage names depth 3
	tr.Answered(a)
	tr.Batch(removed(12))
	if got := sums.take(); !reflect.DeepEqual(got, []uint64{102}) {
		t.Fatalf("evicting the answer's own tail forgot %v, want [102]", got)
	}
}
