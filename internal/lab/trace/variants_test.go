package trace

import "testing"

func TestWithoutSharedHead(t *testing.T) {
	reqs := []Request{
		{InputTokens: 1500, HashIDs: []int64{0, 1, 2}},
		{InputTokens: 2000, HashIDs: []int64{0, 1, 2, 3}},
		{InputTokens: 1000, HashIDs: []int64{0, 4}},
	}
	got := WithoutSharedHead(reqs)
	if len(got) != 3 || got[0].HashIDs[0] != 1 || got[2].HashIDs[0] != 4 || got[0].InputTokens != 1500-512 {
		t.Fatalf("got %+v", got)
	}
	if reqs[0].HashIDs[0] != 0 {
		t.Fatal("input modified")
	}
}

func TestHotPromptsShape(t *testing.T) {
	c := DefaultHotPrompts()
	reqs := HotPrompts(c)
	if len(reqs) != c.Requests {
		t.Fatalf("%d requests", len(reqs))
	}
	heads := map[int64]int{}
	for i, r := range reqs {
		if len(r.HashIDs) != c.PromptBlocks+c.SuffixBlocks {
			t.Fatalf("request %d has %d blocks", i, len(r.HashIDs))
		}
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatal("arrivals not sorted")
		}
		heads[r.HashIDs[0]]++
	}
	top := 0
	for _, n := range heads {
		top = max(top, n)
	}
	if top < c.Requests/5 {
		t.Fatalf("the hottest prompt has only %d requests", top)
	}
}
