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

// TestHopLeg: a leg rides the hop value beside the counts, which read
// as before; an owner of an earlier version skips it; junk is no leg.
func TestHopLeg(t *testing.T) {
	for _, tc := range []struct {
		c, f int
		leg  Leg
		want string
	}{
		{0, 0, LegPrefill, "1;l=p"},
		{3, 2, LegDecode, "1;c=3;f=2;l=d"},
		{0, 0, LegPinned, "1;l=x"},
		{0, 0, LegNone, "1"},
		{0, 0, Leg('q'), "1"},
	} {
		v := ValueLeg(tc.c, tc.f, tc.leg)
		if v != tc.want {
			t.Errorf("ValueLeg(%d, %d, %q) = %q, want %q", tc.c, tc.f, tc.leg, v, tc.want)
		}
		want := tc.leg
		if want == Leg('q') {
			want = LegNone
		}
		if got := ParseLeg(v); got != want {
			t.Errorf("ParseLeg(%q) = %q", v, got)
		}
		if c, f := Parse(v); c != tc.c || f != tc.f {
			t.Errorf("Parse(%q) = %d, %d", v, c, f)
		}
	}
	for _, junk := range []string{"1;l=p;l=p", "1;l=", "1;l=pp", "2;l=p", "l=p", "1;l=P", "1;l=d;" + strings.Repeat("z", maxHopValue)} {
		if got := ParseLeg(junk); got != LegNone {
			t.Errorf("ParseLeg(%q) = %q", junk, got)
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
	f.Add("1;c=3;l=p")
	f.Add("1;l=x;l=x")
	f.Fuzz(func(t *testing.T, v string) {
		leg := ParseLeg(v)
		if leg != LegNone && leg != LegPrefill && leg != LegDecode && leg != LegPinned {
			t.Fatalf("ParseLeg(%q) = %q", v, leg)
		}
		c, fk := Parse(v)
		if c < 0 || c > maxHopCount || fk < 0 || fk > maxHopCount {
			t.Fatalf("parseHop(%q) = %d, %d: out of range", v, c, fk)
		}
		wc := c
		if wc == 1 {
			wc = 0 // Value leaves out what says nothing
		}
		if leg2 := ParseLeg(ValueLeg(c, fk, leg)); leg2 != leg {
			t.Fatalf("ParseLeg(%q) = %q; written back as %q, read %q", v, leg, ValueLeg(c, fk, leg), leg2)
		}
		if c2, f2 := Parse(Value(c, fk)); c2 != wc || f2 != fk {
			t.Fatalf("parseHop(%q) = %d, %d; written back as %q, read %d, %d", v, c, fk, Value(c, fk), c2, f2)
		}
	})
}
