package summary

import (
	"bytes"
	"testing"
)

// cutFixture is an owner with an old prefix in its older generation, a
// prefix recorded early in its newer generation (no longer among the
// recent adds) and a fresh one, and a copy kept by deltas.
type cutFixture struct {
	owner, cp          *Summary
	old, early, recent []uint64
	from               uint64
}

const cutCapacity = 4096 // perGen 3072, recent adds remembered 768

func newCutFixture(t *testing.T) *cutFixture {
	t.Helper()
	c := DefaultContract().Fingerprint()
	owner, err := New(Params{CapacityBlocks: cutCapacity, FalsePositiveRate: 0.01}, 3)
	if err != nil {
		t.Fatal(err)
	}
	f := &cutFixture{owner: owner, old: chain(40, 1), early: chain(40, 2), recent: chain(40, 3)}
	owner.Add(f.old)
	for i, n := uint64(0), 0; owner.Stats().NewerInserts >= n; i++ {
		n = owner.Stats().NewerInserts
		owner.Add(chain(10, 1000+i)) // fill until the generation rotates
	}
	owner.Add(f.early)
	for i := uint64(0); i < 100; i++ {
		owner.Add(chain(10, 5000+i)) // 1000 adds: early leaves the recent adds
	}
	owner.Add(f.recent)
	f.cp, err = Decode(owner.AppendEncode(nil, c), c)
	if err != nil {
		t.Fatal(err)
	}
	f.from = owner.Version()
	return f
}

// sync sends the owner's delta since the last sync to the copy and checks
// that the copy is bit-identical and matches as the owner does.
func (f *cutFixture) sync(t *testing.T) {
	t.Helper()
	c := DefaultContract().Fingerprint()
	enc, to, ok := f.owner.AppendDelta(nil, f.from)
	if !ok {
		t.Fatal("owner lost its log")
	}
	d, err := DecodeDelta(enc)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.cp.ApplyDelta(d); err != nil {
		t.Fatal(err)
	}
	f.from = to
	if !bytes.Equal(f.owner.AppendEncode(nil, c), f.cp.AppendEncode(nil, c)) {
		t.Fatal("copy differs from the owner")
	}
	for _, h := range [][]uint64{f.old, f.early, f.recent} {
		p := MakeProbes(nil, h)
		if a, b := f.owner.Match(p), f.cp.Match(p); a != b {
			t.Fatalf("owner matches %d, copy %d", a, b)
		}
	}
}

func TestCorrectCutsWhatTheMissShows(t *testing.T) {
	cases := []struct {
		name string
		// miss returns the blocks the engine did not have; twice repeats
		// the miss (after recording the prefix again, as the proxy does).
		miss func(f *cutFixture) []uint64
		// second, when set, is a second miss after the first was
		// synced and the prefix recorded again (as the proxy does).
		second func(t *testing.T, f *cutFixture) []uint64
		cut    Cut // of the last correction
		// held: which prefixes the copy still matches in full afterwards.
		old, early, recent bool
		lowered            bool // the rotation threshold was lowered
	}{
		{name: "older generation only: expected of a well-sized summary, no cut",
			miss: func(f *cutFixture) []uint64 { return f.old[20:] },
			cut:  CutNone, old: false, early: true, recent: true},
		{name: "recorded after the prediction: no evidence",
			miss: func(f *cutFixture) []uint64 { return f.recent[10:] },
			cut:  CutNone, old: true, early: true, recent: false},
		{name: "scattered claims (false positives): no evidence",
			miss: func(f *cutFixture) []uint64 { return append(chain(30, 77), f.early[39]) },
			cut:  CutNone, old: true, early: false, recent: true},
		{name: "newer generation: drop the older, lower the threshold",
			miss: func(f *cutFixture) []uint64 { return f.early[10:] },
			cut:  CutOlder, old: false, early: false, recent: true, lowered: true},
		{name: "newer generation, then the first miss's generation (now older): no second cut",
			miss: func(f *cutFixture) []uint64 { return f.early[10:] },
			second: func(_ *testing.T, f *cutFixture) []uint64 {
				f.owner.Add(f.early)
				return chain(10, 5050)
			},
			cut: CutNone, old: false, early: true, recent: true, lowered: true},
		{name: "newer generation twice: the threshold goes lower, the older drops again",
			miss: func(f *cutFixture) []uint64 { return f.early[10:] },
			second: func(t *testing.T, f *cutFixture) []uint64 {
				for i := uint64(0); i < 78; i++ { // the first leaves the recent adds
					f.owner.Add(chain(10, 7000+i))
				}
				if f.owner.Stats().NewerInserts != 780 {
					t.Fatalf("rotated: %d in the newer generation", f.owner.Stats().NewerInserts)
				}
				return chain(10, 7000)
			},
			cut: CutOlder, old: false, early: false, recent: false, lowered: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newCutFixture(t)
			for _, h := range [][]uint64{f.old, f.early, f.recent} {
				if got := f.cp.Match(MakeProbes(nil, h)); got != len(h) {
					t.Fatalf("before: copy matches %d of %d", got, len(h))
				}
			}
			c := f.owner.Correct(tc.miss(f))
			if tc.second != nil {
				f.sync(t)
				c = f.owner.Correct(tc.second(t, f))
			}
			if c.Cut != tc.cut {
				t.Fatalf("cut %v (found %+v), want %v", c.Cut, c.Found, tc.cut)
			}
			if lowered := c.RotateAt < cutCapacity*3/4; lowered != tc.lowered {
				t.Fatalf("rotate at %d, lowered=%v want %v", c.RotateAt, lowered, tc.lowered)
			}
			f.sync(t)
			for _, p := range []struct {
				name string
				h    []uint64
				want bool
			}{{"old", f.old, tc.old}, {"early", f.early, tc.early}, {"recent", f.recent, tc.recent}} {
				if got := f.cp.Match(MakeProbes(nil, p.h)) == len(p.h); got != p.want {
					t.Errorf("copy matches all of %s: %v, want %v", p.name, got, p.want)
				}
			}
		})
	}
}

func TestLearnedThresholdRotatesEarlierAndGrowsBack(t *testing.T) {
	f := newCutFixture(t)
	c := f.owner.Correct(f.early[10:])
	if c.Cut != CutOlder {
		t.Fatalf("cut %v", c.Cut)
	}
	limit := f.owner.cut.rotateAt(f.owner.geo)
	if limit >= cutCapacity*3/4 || limit < minRotateAtOf(f.owner.geo) {
		t.Fatalf("rotate at %d", limit)
	}
	// The owner rotates at the lowered threshold; the copy follows the
	// rotation entries (it never rotates by itself).
	fill := func(seed uint64) int {
		v := f.owner.Version()
		for i, n := uint64(0), 0; f.owner.Stats().NewerInserts >= n; i++ {
			n = f.owner.Stats().NewerInserts
			f.owner.Add(chain(1, seed+i))
		}
		f.sync(t)
		return int(f.owner.Version() - v - 1) // adds before the rotation
	}
	grown := limit + f.owner.geo.perGen/16
	if n := fill(9000); n != limit || f.owner.cut.rotateAt(f.owner.geo) != grown {
		t.Fatalf("after a generation without misses: rotated after %d, rotate at %d, want %d then %d", n, f.owner.cut.rotateAt(f.owner.geo), limit, grown)
	}
	// Bounded below, whatever the misses.
	for i := range 50 {
		f.owner.Add(chain(5, uint64(30000+i)))
		f.owner.Correct(chain(5, uint64(30000+i)))
	}
	if got := f.owner.cut.rotateAt(f.owner.geo); got < minRotateAtOf(f.owner.geo) {
		t.Fatalf("rotate at %d, below the floor %d", got, minRotateAtOf(f.owner.geo))
	}
}

func TestCutLogsRotationsCopiesReplay(t *testing.T) {
	f := newCutFixture(t)
	v := f.owner.Version()
	if n := f.owner.Cut(CutBoth); n != 2 || f.owner.Version() != v+2 {
		t.Fatalf("cut both logged %d entries, version %d -> %d", n, v, f.owner.Version())
	}
	f.sync(t)
	for _, h := range [][]uint64{f.old, f.early, f.recent} {
		if got := f.cp.Match(MakeProbes(nil, h)); got != 0 {
			t.Fatalf("after cutting both the copy matches %d", got)
		}
	}
	if f.owner.Cut(CutNone) != 0 {
		t.Fatal("cut none logged entries")
	}
}

// TestForgetToTheLimitThenRebase: what the owner of a replica with KV
// events does (mesh.Evicted, mesh.Rebase): forgets evicted blocks until
// the negative record nears ForgetLimit, then cuts both generations and
// adds what the engine holds; a copy follows through one delta.
func TestForgetToTheLimitThenRebase(t *testing.T) {
	s, err := New(Params{CapacityBlocks: 1024, FalsePositiveRate: 0.01}, 1)
	if err != nil {
		t.Fatal(err)
	}
	cp, _ := New(s.Params(), 1)
	hashes := make([]uint64, 600)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
	}
	s.Add(hashes)
	limit := s.Stats().ForgetLimit
	if limit != maxNegOf(s.geo) || limit >= 500 {
		t.Fatalf("limit %d", limit)
	}
	if n := s.Forget(hashes[:500]); n != limit || s.Stats().Forgotten != limit {
		t.Fatalf("forgot %d of 500, record %d, limit %d", n, s.Stats().Forgotten, limit)
	}
	held := hashes[300:400]
	s.Cut(CutBoth)
	s.Add(held)
	d, _, ok := s.AppendDelta(nil, 0)
	if !ok {
		t.Fatal("no delta")
	}
	dd, err := DecodeDelta(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.ApplyDelta(dd); err != nil {
		t.Fatal(err)
	}
	for _, sum := range []*Summary{s, cp} {
		if st := sum.Stats(); st.Forgotten != 0 {
			t.Fatalf("record of %d after a rebase", st.Forgotten)
		}
		n := 0
		for i, h := range hashes {
			if sum.Has(h) != (i >= 300 && i < 400) {
				n++
			}
		}
		if n > 6 { // false positives among 500 absent blocks, at 1%
			t.Fatalf("%d blocks disagree with the rebase", n)
		}
	}
	if dc, _ := cp.Digest(0); func() uint64 { d, _ := s.Digest(0); return d }() != dc {
		t.Fatal("the copy diverged")
	}
}

// TestHeld: the owner counts the adds of its two generations; a copy
// decoded mid-generation estimates the older one from its bits (within
// a few percent), follows the newer one exactly through deltas, and
// agrees exactly once a rotation made the newer one older; a cut of
// both generations leaves both at zero.
func TestHeld(t *testing.T) {
	f := newCutFixture(t)
	own, cp := f.owner.Held(), f.cp.Held()
	if own <= f.owner.Stats().NewerInserts {
		t.Fatalf("owner holds %d, no more than its newer generation's %d adds after a rotation", own, f.owner.Stats().NewerInserts)
	}
	if d := float64(cp-own) / float64(own); d > 0.05 || d < -0.05 {
		t.Errorf("decoded copy holds %d, owner %d: off by %.1f%%", cp, own, 100*d)
	}
	before := f.owner.Stats().NewerInserts
	for i := uint64(0); f.owner.Stats().NewerInserts >= before; i++ {
		before = f.owner.Stats().NewerInserts
		f.owner.Add(chain(10, 9000+i))
		if i%20 == 0 {
			f.sync(t) // within the owner's log
		}
	}
	f.sync(t)
	if own, cp := f.owner.Held(), f.cp.Held(); own != cp {
		t.Errorf("after a rotation the copy holds %d, the owner %d", cp, own)
	}
	f.owner.Cut(CutBoth)
	f.sync(t)
	if own, cp := f.owner.Held(), f.cp.Held(); own != 0 || cp != 0 {
		t.Errorf("after cutting both generations: owner %d, copy %d", own, cp)
	}
}
