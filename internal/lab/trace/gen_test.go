package trace

import (
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"sort"
	"testing"
	"time"
)

func mustSessions(t *testing.T, c SessionsConfig) []Request {
	t.Helper()
	reqs, err := Sessions(c)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// sharedBlocks is the length of the common leading run of two id lists.
func sharedBlocks(a, b []int64) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestSessionsDeterministic(t *testing.T) {
	for _, proc := range []string{ArrivalPoisson, ArrivalBursty, ArrivalBucketed} {
		c := DefaultSessions()
		c.Arrivals = Arrivals{Process: proc, Rate: 4, OnShare: 0.2, Period: 30 * time.Second, Bucket: time.Second}
		c.Question.Dist, c.Question.Shape = LengthPareto, 1.5
		a, b := mustSessions(t, c), mustSessions(t, c)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: two runs with seed %d differ", proc, c.Seed)
		}
		c.Seed++
		if reflect.DeepEqual(a, mustSessions(t, c)) {
			t.Fatalf("%s: seeds %d and %d give the same workload", proc, c.Seed-1, c.Seed)
		}
	}
}

// Every turn's prompt is the previous turn's plus its answer and a new
// question; sessions of a group share the group prefix's full blocks and
// no more; groups share only the system prompt's.
func TestSessionsPrefixSharing(t *testing.T) {
	c := DefaultSessions()
	c.Groups, c.SessionsPerGroup = 4, 6
	c.SystemTokens = 1100 // two full blocks and part of a third
	c.Prefix = Length{Dist: LengthFixed, Median: 2000}
	c.Turns = Length{Dist: LengthFixed, Median: 4}
	c.ActiveSessions = 1 // sessions play one after another: a session is a run of 4 requests
	reqs := mustSessions(t, c)
	if len(reqs) != 4*6*4 {
		t.Fatalf("%d requests, want %d", len(reqs), 4*6*4)
	}
	const sysBlocks, headBlocks = 1100 / MooncakeBlockTokens, (1100 + 2000) / MooncakeBlockTokens
	groupOf := map[int64][]int{} // first group block → sessions (by index of first turn)
	var firsts [][]int64
	for s := 0; s < len(reqs); s += 4 {
		turns := reqs[s : s+4]
		for k := 1; k < 4; k++ {
			prev, cur := turns[k-1], turns[k]
			if want := prev.InputTokens + prev.OutputTokens; cur.InputTokens <= want {
				t.Fatalf("session %d turn %d: %d input tokens, want more than %d (history and a new question)", s/4, k, cur.InputTokens, want)
			}
			if n, want := sharedBlocks(prev.HashIDs, cur.HashIDs), prev.InputTokens/MooncakeBlockTokens; n != want {
				t.Fatalf("session %d turn %d shares %d blocks with the turn before, want its %d full blocks", s/4, k, n, want)
			}
		}
		for _, r := range turns {
			if len(r.HashIDs) != (r.InputTokens+MooncakeBlockTokens-1)/MooncakeBlockTokens {
				t.Fatalf("%d ids for %d tokens", len(r.HashIDs), r.InputTokens)
			}
		}
		groupOf[turns[0].HashIDs[headBlocks-1]] = append(groupOf[turns[0].HashIDs[headBlocks-1]], len(firsts))
		firsts = append(firsts, turns[0].HashIDs)
	}
	if len(groupOf) != c.Groups {
		t.Fatalf("%d distinct group prefixes, want %d", len(groupOf), c.Groups)
	}
	for _, members := range groupOf {
		if len(members) != c.SessionsPerGroup {
			t.Fatalf("a group prefix shared by %d sessions, want %d", len(members), c.SessionsPerGroup)
		}
	}
	for i := range firsts {
		for j := i + 1; j < len(firsts); j++ {
			n := sharedBlocks(firsts[i], firsts[j])
			sameGroup := firsts[i][headBlocks-1] == firsts[j][headBlocks-1]
			switch {
			case sameGroup && n != headBlocks:
				t.Fatalf("sessions %d and %d of a group share %d blocks, want the %d of the system and group prefix", i, j, n, headBlocks)
			case !sameGroup && n != sysBlocks:
				t.Fatalf("sessions %d and %d of different groups share %d blocks, want the system prompt's %d", i, j, n, sysBlocks)
			}
		}
	}
}

// ActiveSessions sets how many conversations interleave.
func TestSessionsActive(t *testing.T) {
	c := DefaultSessions()
	c.Turns = Length{Dist: LengthFixed, Median: 3}
	// 1,500 prefix tokens and 600-token questions: a session's turns share
	// at least 4 blocks, two sessions of a group 2.
	c.Question = Length{Dist: LengthFixed, Median: 600}
	// runs counts the times the session changes between consecutive requests.
	runs := func(active int) int {
		c.ActiveSessions = active
		reqs := mustSessions(t, c)
		n := 0
		for i := 1; i < len(reqs); i++ {
			if sharedBlocks(reqs[i].HashIDs, reqs[i-1].HashIDs) < 3 {
				n++
			}
		}
		return n
	}
	total := c.Groups * c.SessionsPerGroup
	if got := runs(1); got != total-1 {
		t.Fatalf("one session open: %d switches, want %d", got, total-1)
	}
	if got := runs(0); got < total*3/2 {
		t.Fatalf("every session open: %d switches, want sessions interleaved (≥ %d)", got, total*3/2)
	}
}

func TestSessionsCaps(t *testing.T) {
	c := DefaultSessions()
	c.Question = Length{Dist: LengthPareto, Median: 800, Shape: 1.1, Min: 1, Max: 16000}
	c.Turns = Length{Dist: LengthFixed, Median: 30}
	c.MaxContextTokens = 8000
	reqs := mustSessions(t, c)
	longer := 0
	for _, r := range reqs {
		// A first turn is always sent; later ones stay under the cap.
		if r.InputTokens > c.MaxContextTokens {
			longer++
			if r.InputTokens > c.SystemTokens+1500+16000 {
				t.Fatalf("a prompt of %d tokens, beyond the question cap", r.InputTokens)
			}
		}
	}
	if longer > c.Groups*c.SessionsPerGroup {
		t.Fatalf("%d prompts over the context cap, more than one per session", longer)
	}
	if len(reqs) >= c.Groups*c.SessionsPerGroup*30 {
		t.Fatal("the context cap ended no session")
	}
	c.Requests = 100
	if n := len(mustSessions(t, c)); n != 100 {
		t.Fatalf("%d requests, want the cap of 100", n)
	}
}

func quantile(v []int, p float64) int {
	s := slices.Clone(v)
	sort.Ints(s)
	return s[int(p*float64(len(s)-1))]
}

// The length distributions have the median they are given, the heavy tail
// their shape says, and stay within bounds.
func TestLengthDraw(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	draw := func(l Length) []int {
		out := make([]int, 20000)
		for i := range out {
			out[i] = l.Draw(rng)
		}
		return out
	}
	if v := draw(Length{Dist: LengthFixed, Median: 42}); quantile(v, 0) != 42 || quantile(v, 1) != 42 {
		t.Fatal("fixed length varies")
	}
	logn := draw(Length{Dist: LengthLognormal, Median: 200, Shape: 1})
	par := draw(Length{Dist: LengthPareto, Median: 200, Shape: 1.2})
	for name, v := range map[string][]int{"lognormal": logn, "pareto": par} {
		if m := quantile(v, 0.5); math.Abs(float64(m)/200-1) > 0.05 {
			t.Errorf("%s median %d, want about 200", name, m)
		}
	}
	// Lognormal σ=1: p99/p50 = e^2.33 ≈ 10; Pareto α=1.2: 50^(1/1.2) ≈ 26.
	if r := float64(quantile(logn, 0.99)) / 200; r < 8 || r > 12.5 {
		t.Errorf("lognormal p99/p50 %.1f, want about 10", r)
	}
	if r := float64(quantile(par, 0.99)) / 200; r < 20 || r > 33 {
		t.Errorf("pareto p99/p50 %.1f, want about 26", r)
	}
	capped := draw(Length{Dist: LengthPareto, Median: 200, Shape: 1.2, Min: 150, Max: 1000})
	if quantile(capped, 0) != 150 || quantile(capped, 1) != 1000 {
		t.Errorf("bounds [150, 1000] give [%d, %d]", quantile(capped, 0), quantile(capped, 1))
	}
}

// The arrival processes have the mean rate they are given and the shape
// their name says.
func TestSessionsArrivals(t *testing.T) {
	c := DefaultSessions()
	c.Groups, c.SessionsPerGroup = 64, 16
	c.Turns = Length{Dist: LengthFixed, Median: 4}
	gaps := func(a Arrivals) (rate, cv float64, reqs []Request) {
		c.Arrivals = a
		reqs = mustSessions(t, c)
		var sum, sq float64
		for i := 1; i < len(reqs); i++ {
			g := (reqs[i].Arrival - reqs[i-1].Arrival).Seconds()
			if g < 0 {
				t.Fatalf("%s: arrivals out of order", a.Process)
			}
			sum += g
			sq += g * g
		}
		n := float64(len(reqs) - 1)
		mean := sum / n
		return 1 / mean, math.Sqrt(sq/n-mean*mean) / mean, reqs
	}
	rate, cv, _ := gaps(Arrivals{Process: ArrivalPoisson, Rate: 5})
	if math.Abs(rate/5-1) > 0.06 || math.Abs(cv-1) > 0.1 {
		t.Errorf("poisson: rate %.2f, gap cv %.2f; want 5 and 1", rate, cv)
	}
	rate, cv, _ = gaps(Arrivals{Process: ArrivalBursty, Rate: 5, OnShare: 0.2, Period: 20 * time.Second})
	if math.Abs(rate/5-1) > 0.25 || cv < 2 {
		t.Errorf("bursty: rate %.2f, gap cv %.2f; want about 5 and well over poisson's 1", rate, cv)
	}
	rate, _, reqs := gaps(Arrivals{Process: ArrivalBucketed, Rate: 5, Bucket: 2 * time.Second})
	if math.Abs(rate/5-1) > 0.06 {
		t.Errorf("bucketed: rate %.2f, want 5", rate)
	}
	ticks := map[time.Duration]int{}
	for _, r := range reqs {
		if r.Arrival%(2*time.Second) != 0 {
			t.Fatalf("bucketed: arrival %v off the 2 s ticks", r.Arrival)
		}
		ticks[r.Arrival]++
	}
	if per := float64(len(reqs)) / float64(len(ticks)); per < 8 {
		t.Errorf("bucketed: %.1f requests per tick, want about 10", per)
	}
}

func TestSessionsValidate(t *testing.T) {
	bad := []func(*SessionsConfig){
		func(c *SessionsConfig) { c.Groups = 0 },
		func(c *SessionsConfig) { c.Question.Dist = "zipf" },
		func(c *SessionsConfig) { c.Answer = Length{Dist: LengthPareto, Median: 10, Shape: 0} },
		func(c *SessionsConfig) { c.Turns.Max, c.Turns.Min = 2, 3 },
		func(c *SessionsConfig) { c.Arrivals.Rate = 0 },
		func(c *SessionsConfig) {
			c.Arrivals = Arrivals{Process: ArrivalBursty, Rate: 1, OnShare: 1.5, Period: time.Second}
		},
		func(c *SessionsConfig) { c.Arrivals = Arrivals{Process: ArrivalBucketed, Rate: 1} },
		func(c *SessionsConfig) { c.Requests = -1 },
	}
	for i, f := range bad {
		c := DefaultSessions()
		f(&c)
		if _, err := Sessions(c); err == nil {
			t.Errorf("case %d: no error for %+v", i, c)
		}
	}
}
