package hop

import (
	"strings"
	"testing"
)

// TestHopValue: the deciding router's counts ride the hop header and
// read back; junk reads as unknown; an earlier version's "1" is plain.
func TestHopValue(t *testing.T) {
	for _, tc := range []struct {
		c, f         int
		want         string
		backC, backF int
	}{
		{0, 0, "1", 0, 0},
		{1, 0, "1", 0, 0},
		{3, 0, "1;c=3", 3, 0},
		{0, 24, "1;f=24", 0, 24},
		{5, 7, "1;c=5;f=7", 5, 7},
		{1 << 30, 0, "1;c=1048576", 1 << 20, 0},
	} {
		if got := Value(tc.c, tc.f); got != tc.want {
			t.Errorf("hopValue(%d, %d) = %q, want %q", tc.c, tc.f, got, tc.want)
		}
		if c, f := Parse(tc.want); c != tc.backC || f != tc.backF {
			t.Errorf("parseHop(%q) = %d, %d", tc.want, c, f)
		}
	}
	for _, junk := range []string{"", "1;", "1;c=", "1;c=-4", "1;f=x", "1;c=99999999999", ";;;", "1;z=3",
		"1;c=+5", "1;c=05", "1;c= 5", "1;c=5 ", "1;c=1048577", "1;c=3;c=3", "1;f=2;f=9", "2;c=3", "x;c=3", "c=3",
		"1;c=3;" + strings.Repeat("z", maxHopValue)} {
		if c, f := Parse(junk); c != 0 || f != 0 {
			t.Errorf("parseHop(%q) = %d, %d, want 0, 0", junk, c, f)
		}
	}
	// A later version's field is skipped; a bad count leaves the other.
	for v, want := range map[string][2]int{"1;z=3;c=4": {4, 0}, "1;c=4;f=0x1": {4, 0}, "1;c=7;c=8;f=2": {0, 2}} {
		if c, f := Parse(v); c != want[0] || f != want[1] {
			t.Errorf("parseHop(%q) = %d, %d, want %v", v, c, f, want)
		}
	}
}

// FuzzParseHop: whatever a stranger puts in the header, the counts are
// in range and stable: written back by Value they read the same.
func FuzzParseHop(f *testing.F) {
	for _, s := range []string{"1", "1;c=3", "1;f=24", "1;c=5;f=7", "1;c=1048576;f=1048576", "1;c=05", "1;c=3;c=4",
		"1;z=9;f=2", "2;c=3", "1;c=-1", ";", "1;c=" + strings.Repeat("9", 70)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c, fk := Parse(v)
		if c < 0 || c > maxHopCount || fk < 0 || fk > maxHopCount {
			t.Fatalf("parseHop(%q) = %d, %d: out of range", v, c, fk)
		}
		wc := c
		if wc == 1 {
			wc = 0 // Value leaves out what says nothing
		}
		if c2, f2 := Parse(Value(c, fk)); c2 != wc || f2 != fk {
			t.Fatalf("parseHop(%q) = %d, %d; written back as %q, read %d, %d", v, c, fk, Value(c, fk), c2, f2)
		}
	})
}
