package mesh

import (
	"fmt"
	"testing"
)

func TestOwnerOf(t *testing.T) {
	set := func(names ...string) map[string]bool {
		m := map[string]bool{}
		for _, n := range names {
			m[n] = true
		}
		return m
	}
	all := func(string) bool { return true }
	except := func(dead ...string) func(string) bool {
		return func(n string) bool {
			for _, d := range dead {
				if n == d {
					return false
				}
			}
			return true
		}
	}
	// The rule, stated independently: the highest weight wins.
	heaviest := func(id string, names ...string) string {
		best := ""
		for _, n := range names {
			if best == "" || ownerWeight(n, id) > ownerWeight(best, id) {
				best = n
			}
		}
		return best
	}
	id := "http://r:8000"
	w := heaviest(id, "a", "b", "c")
	var rest []string
	for _, n := range []string{"a", "b", "c"} {
		if n != w {
			rest = append(rest, n)
		}
	}
	tests := []struct {
		name      string
		declarers map[string]bool
		live      func(string) bool
		want      string
	}{
		{"no declarers", set(), all, ""},
		{"one live declarer", set("a"), all, "a"},
		{"one dead declarer", set("a"), except("a"), ""},
		{"highest weight wins", set("a", "b", "c"), all, w},
		{"winner dead: next weight", set("a", "b", "c"), except(w), heaviest(id, rest...)},
		{"all dead", set("a", "b"), except("a", "b"), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ownerOf(id, tc.declarers, tc.live); got != tc.want {
				t.Fatalf("ownerOf = %q, want %q", got, tc.want)
			}
		})
	}
}

// A router joining or leaving moves only the replicas it wins or held:
// rendezvous hashing's stability, which keeps copies warm.
func TestOwnerOfStableUnderMembershipChange(t *testing.T) {
	decl := map[string]bool{"a": true, "b": true, "c": true}
	decl4 := map[string]bool{"a": true, "b": true, "c": true, "d": true}
	all := func(string) bool { return true }
	moved := 0
	for i := range 1000 {
		id := fmt.Sprintf("http://replica-%d:8000", i)
		before, after := ownerOf(id, decl, all), ownerOf(id, decl4, all)
		if before != after {
			if after != "d" {
				t.Fatalf("%s moved from %s to %s, not to the new router", id, before, after)
			}
			moved++
		}
	}
	if moved < 150 || moved > 350 {
		t.Fatalf("%d of 1000 replicas moved to a 4th router, want about 250", moved)
	}
}
