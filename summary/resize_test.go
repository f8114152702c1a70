package summary

import "testing"

// TestResizedKeepsWhatItHolds: a summary resized larger or smaller
// matches the prefixes the old one did, as far as the new capacity
// reaches (a smaller one keeps the most recent), not the blocks found not
// held, in a new epoch.
func TestResizedKeepsWhatItHolds(t *testing.T) {
	const capBlocks = 400
	s, _ := New(Params{CapacityBlocks: capBlocks, FalsePositiveRate: 0.01}, 1)
	// 70 prompts of 10 blocks; a generation takes 300 adds, so the
	// summary holds about the last 40.
	prompts := make([][]uint64, 70)
	for i := range prompts {
		prompts[i] = chain(10, uint64(i+1))
		s.Add(prompts[i])
	}
	forgotten := prompts[69]
	s.Forget(forgotten[6:])
	match := func(s *Summary, p []uint64) int { return s.Match(MakeProbes(nil, p)) }
	before := make([]int, len(prompts))
	held := 0
	for i, p := range prompts {
		if before[i] = match(s, p); before[i] == 10 {
			held++
		}
	}
	if held < 35 || before[0] != 0 || before[69] != 6 {
		t.Fatalf("before: %v", before)
	}
	for _, tc := range []struct {
		name     string
		capacity int
		// smaller: generations of 75, the last 75 to 150 blocks
		smaller bool
	}{{"larger", 1000, false}, {"same", capBlocks, false}, {"smaller", 100, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r, kept, err := Resized(s, Params{CapacityBlocks: tc.capacity, FalsePositiveRate: 0.01}, 2)
			if err != nil {
				t.Fatal(err)
			}
			if r.Epoch() != 2 || r.Params().CapacityBlocks != tc.capacity {
				t.Fatalf("epoch %d capacity %d", r.Epoch(), r.Params().CapacityBlocks)
			}
			// Every add since the rotation before last: the blocks of
			// the prompts held whole, the last prompt's 6 not
			// forgotten, and a few of the prompt split by that rotation.
			if kept < 10*held+6 || kept > 10*held+6+9 {
				t.Fatalf("replayed %d hashes (held %d prompts)", kept, held)
			}
			lost := 0
			for i, p := range prompts {
				m := match(r, p)
				switch {
				case !tc.smaller && m != before[i]:
					t.Errorf("prompt %d: match %d, the old summary's %d", i, m, before[i])
				case tc.smaller && i >= 63 && m != before[i]:
					t.Errorf("recent prompt %d: match %d, the old summary's %d", i, m, before[i])
				case before[i] == 0 && m != 0:
					t.Errorf("prompt %d (aged out of the old summary): match %d", i, m)
				case before[i] == 10 && m == 0:
					lost++
				}
			}
			if tc.smaller && lost < held-16 {
				t.Errorf("a quarter the size kept %d of the %d prompts the old one held", held-lost, held)
			}
		})
	}
}

// TestResizedCopyKeepsNothing: a copy (decoded, or fed by deltas) has
// no hashes to replay; it resizes empty.
func TestResizedCopyKeepsNothing(t *testing.T) {
	s, _ := New(Params{CapacityBlocks: 400, FalsePositiveRate: 0.01}, 1)
	p := chain(10, 1)
	s.Add(p)
	c := mustDecode(t, s)
	if c.Match(MakeProbes(nil, p)) != 10 {
		t.Fatal("the copy does not match")
	}
	r, kept, err := Resized(c, Params{CapacityBlocks: 800, FalsePositiveRate: 0.01}, 2)
	if err != nil || kept != 0 || r.Match(MakeProbes(nil, p)) != 0 {
		t.Fatalf("resized copy: kept %d, match %d, error %v", kept, r.Match(MakeProbes(nil, p)), err)
	}
}

// TestKeptHashesBounded: each generation keeps at most its limit of
// hashes, the most recent once full.
func TestKeptHashesBounded(t *testing.T) {
	var k keptHashes
	for i := range uint64(10) {
		k.add(i, 4)
	}
	if got := k.ordered(nil); len(got) != 4 || got[0] != 6 || got[3] != 9 {
		t.Fatalf("kept %v, want [6 7 8 9]", got)
	}
	k.clear()
	k.add(42, 4)
	if got := k.ordered(nil); len(got) != 1 || got[0] != 42 {
		t.Fatalf("after clear: %v", got)
	}
}
