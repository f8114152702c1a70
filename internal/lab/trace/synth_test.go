package trace

import (
	"strings"
	"testing"
)

func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

func TestSynthesizeShape(t *testing.T) {
	tests := []struct {
		name   string
		ids    []int64
		tokens int
		bpt    int
		want   int
	}{
		{"one partial block", []int64{0}, 100, 4, 400},
		{"exact blocks", []int64{0, 1}, 1024, 4, 4096},
		{"default bpt", []int64{0, 1}, 700, 0, 2800},
		{"bpt 3", []int64{5}, 10, 3, 30},
		{"ids short of tokens are extended", []int64{9}, 2000, 4, 8000},
		{"no tokens", []int64{1}, 0, 4, 0},
		{"no ids", nil, 10, 4, 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := Synthesize(tc.ids, tc.tokens, tc.bpt)
			if len(s) != tc.want {
				t.Fatalf("len = %d, want %d", len(s), tc.want)
			}
			for i := 0; i < len(s); i++ {
				if c := s[i]; c != ' ' && (c < 'a' || c > 'z') {
					t.Fatalf("byte %d = %q, want lowercase or space", i, c)
				}
			}
			if strings.Contains(s, "   ") {
				t.Fatal("runs of spaces: not word-like")
			}
			if words := strings.Fields(s); len(s) > 100 && len(words) < len(s)/12 {
				t.Fatalf("only %d words in %d bytes", len(words), len(s))
			}
			if s != Synthesize(tc.ids, tc.tokens, tc.bpt) {
				t.Fatal("not deterministic")
			}
		})
	}
}

func TestSynthesizePrefix(t *testing.T) {
	const bpt = 4
	block := MooncakeBlockTokens * bpt
	tests := []struct {
		name   string
		a, b   []int64
		shared int // leading ids in common
	}{
		{"first block differs", []int64{1, 2, 3}, []int64{4, 2, 3}, 0},
		{"share one", []int64{0, 1, 2}, []int64{0, 5, 6}, 1},
		{"share two", []int64{0, 1, 2, 3}, []int64{0, 1, 7, 3}, 2},
		{"same later ids do not matter after a difference", []int64{0, 1, 2}, []int64{0, 9, 2}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tokens := len(tc.a) * MooncakeBlockTokens
			a := Synthesize(tc.a, tokens, bpt)
			b := Synthesize(tc.b, tokens, bpt)
			k := tc.shared * block
			if a[:k] != b[:k] {
				t.Fatalf("first %d bytes differ", k)
			}
			if a[k:k+block] == b[k:k+block] {
				t.Fatalf("block %d equal although ids differ", tc.shared)
			}
			// Word boundaries: each full block ends in a space, so a shared
			// block is also a shared run of whole words.
			if k > 0 && a[k-1] != ' ' {
				t.Fatalf("shared prefix ends mid-word")
			}
		})
	}
	// A shorter prompt over the same ids is a prefix of the longer one,
	// including a cut in the middle of a block.
	long := Synthesize([]int64{0, 1, 2}, 1500, bpt)
	short := Synthesize([]int64{0, 1, 2}, 700, bpt)
	if !strings.HasPrefix(long, short) {
		t.Fatal("short prompt is not a prefix of the long one")
	}
	if p := commonPrefix(Synthesize([]int64{3}, 512, bpt), Synthesize([]int64{4}, 512, bpt)); p > 64 {
		t.Fatalf("different ids share %d bytes", p)
	}
}

func BenchmarkSynthesize128K(b *testing.B) {
	ids := make([]int64, 256)
	for i := range ids {
		ids[i] = int64(i)
	}
	b.SetBytes(128 * 1024 * 4)
	for b.Loop() {
		_ = Synthesize(ids, 128*1024, 4)
	}
}

func BenchmarkReadEmbedded(b *testing.B) {
	b.SetBytes(int64(len(conversationSlice)))
	for b.Loop() {
		_ = EmbeddedConversationSlice()
	}
}
