package reply

import (
	"strings"
	"testing"
)

// TestAnswerBudgetBoundsAllSinks: what sinks hold beyond their free share
// comes from one budget; a sink that finds it spent keeps the prefix it
// has, and what it reserved goes back on release.
func TestAnswerBudgetBoundsAllSinks(t *testing.T) {
	budget := NewBudget(2 * freeAnswerBytes)
	chunk := func(s string) []byte {
		return []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"" + s + "\"}}]}\n\n")
	}
	word := strings.Repeat("x", 1000)
	fill := func(s *Sink, n int) {
		for range n {
			s.Feed(chunk(word))
		}
	}
	a, b := NewSink(true, budget), NewSink(true, budget)
	fill(a, 200) // 200 KB: its free 64 KB and the budget's 128 KB
	if len(a.answer) >= 200*len(word) || len(a.answer) < 3*freeAnswerBytes-len(word) {
		t.Fatalf("first sink holds %d bytes, want about %d", len(a.answer), 3*freeAnswerBytes)
	}
	fill(b, 200)
	if len(b.answer) > freeAnswerBytes {
		t.Fatalf("second sink holds %d bytes with the budget spent, want at most %d", len(b.answer), freeAnswerBytes)
	}
	if !strings.HasPrefix(strings.Repeat(word, 200), string(a.answer)) {
		t.Fatal("the answer kept is not a prefix")
	}
	a.Release()
	b.Release()
	if n := budget.left.Load(); n != 2*freeAnswerBytes {
		t.Fatalf("budget %d after release, want %d", n, 2*freeAnswerBytes)
	}
}
