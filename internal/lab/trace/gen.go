package trace

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// The shapes a Length can take.
const (
	LengthFixed     = "fixed"     // always Median
	LengthLognormal = "lognormal" // exp(ln Median + Shape × N(0,1)): Shape is σ
	LengthPareto    = "pareto"    // Pareto with tail index Shape (α) and median Median: heavier tail as α falls
)

// The arrival processes of Sessions.
const (
	ArrivalPoisson  = "poisson"  // exponential gaps at Rate
	ArrivalBursty   = "bursty"   // on/off: Poisson at Rate/OnShare during on periods, nothing during off ones
	ArrivalBucketed = "bucketed" // Poisson at Rate, each timestamp floored to its Bucket: batches at fixed ticks
)

// Length is a distribution of token counts, clamped to [Min, Max].
type Length struct {
	Dist   string  // LengthFixed, LengthLognormal or LengthPareto
	Median float64 // the distribution's median before clamping
	Shape  float64 // σ of a lognormal, α of a Pareto; unused when fixed
	Min    int     // smallest value (≥ 0)
	Max    int     // largest value; 0 for no cap
}

// Arrivals shapes the request timestamps of Sessions.
type Arrivals struct {
	Process string  // ArrivalPoisson, ArrivalBursty or ArrivalBucketed
	Rate    float64 // mean requests per second
	// OnShare is the share of time a bursty process is on (0, 1]; 1 is
	// Poisson.
	OnShare float64
	// Period is a bursty process's mean on+off cycle: on and off spells
	// are exponential with means OnShare × Period and (1−OnShare) × Period.
	Period time.Duration
	// Bucket is a bucketed process's tick: every arrival in a tick is
	// stamped with the tick's start, as a benchmark that sends a batch per
	// tick, or a log with coarse timestamps, would.
	Bucket time.Duration
}

// SessionsConfig shapes a synthetic multi-turn chat workload: Groups groups
// of SessionsPerGroup sessions (conversations). Every prompt starts with
// SystemTokens shared by all requests, then its group's prefix (a system
// prompt, document or few-shot template shared by the group's sessions),
// then the session's history — every earlier question and answer — and the
// new question. A session runs Turns turns, fewer if its next prompt would
// exceed MaxContextTokens. Lengths are drawn per group (prefix) and per
// session and turn (turns, questions, answers) from the session's own
// random stream, so a session's content does not depend on the arrival or
// scheduling knobs.
//
// Requests arrive by Arrivals; each arrival advances one of
// ActiveSessions open sessions chosen at random (a new session, in a
// random order over all groups, replaces one that ends), so ActiveSessions
// sets how many conversations interleave: 1 plays them one after another,
// all of them interleaves every conversation as a benchmark sending each
// session's next turn at random does.
type SessionsConfig struct {
	Groups           int
	SessionsPerGroup int
	SystemTokens     int    // global prompt every request starts with (0: none)
	Prefix           Length // tokens of each group's shared prefix, drawn once per group
	Turns            Length // turns of each session (at least 1)
	Question         Length // new user tokens per turn (at least 1)
	Answer           Length // output tokens per turn; they join the history of the next turn
	// MaxContextTokens ends a session before a prompt longer than this
	// (0: no cap). A session's first prompt is always sent.
	MaxContextTokens int
	// ActiveSessions is how many sessions are open at once (0: all).
	ActiveSessions int
	// Requests caps the number of requests (0: every turn of every session).
	Requests int
	Arrivals Arrivals
	// Seed drives every draw: the same config gives the same requests.
	Seed uint64
}

// DefaultSessions is a moderate chat workload in the shape of
// inference-perf's shared_prefix multi-turn data: 16 groups × 8 sessions,
// 1,500-token group prompts, lognormal questions (median 200 tokens) and
// answers (median 50), about 5 turns per session, Poisson arrivals at
// 4 requests/s, every session open at once.
func DefaultSessions() SessionsConfig {
	return SessionsConfig{
		Groups: 16, SessionsPerGroup: 8,
		Prefix:           Length{Dist: LengthFixed, Median: 1500},
		Turns:            Length{Dist: LengthLognormal, Median: 5, Shape: 0.5, Min: 1, Max: 20},
		Question:         Length{Dist: LengthLognormal, Median: 200, Shape: 0.7, Min: 1, Max: 8192},
		Answer:           Length{Dist: LengthLognormal, Median: 50, Shape: 0.7, Min: 1, Max: 4096},
		MaxContextTokens: 32768,
		Arrivals:         Arrivals{Process: ArrivalPoisson, Rate: 4},
		Seed:             1,
	}
}

// Validate reports whether the config can generate a workload.
func (c SessionsConfig) Validate() error {
	switch {
	case c.Groups < 1 || c.SessionsPerGroup < 1:
		return fmt.Errorf("sessions: %d groups × %d sessions, want at least 1 × 1", c.Groups, c.SessionsPerGroup)
	case c.Groups*c.SessionsPerGroup > 1<<20:
		return fmt.Errorf("sessions: %d sessions, want at most %d", c.Groups*c.SessionsPerGroup, 1<<20)
	case c.SystemTokens < 0 || c.MaxContextTokens < 0 || c.ActiveSessions < 0 || c.Requests < 0:
		return errors.New("sessions: negative system tokens, context cap, active sessions or request cap")
	}
	for _, l := range []struct {
		name string
		l    Length
	}{{"prefix", c.Prefix}, {"turns", c.Turns}, {"question", c.Question}, {"answer", c.Answer}} {
		if err := l.l.validate(); err != nil {
			return fmt.Errorf("sessions: %s: %w", l.name, err)
		}
	}
	return c.Arrivals.validate()
}

func (l Length) validate() error {
	switch {
	case l.Min < 0 || (l.Max > 0 && l.Max < l.Min):
		return fmt.Errorf("bounds [%d, %d]", l.Min, l.Max)
	case !(l.Median >= 0) || math.IsInf(l.Median, 0):
		return fmt.Errorf("median %v", l.Median)
	}
	switch l.Dist {
	case LengthFixed:
		return nil
	case LengthLognormal:
		if !(l.Shape >= 0) || l.Shape > 10 || l.Median <= 0 {
			return fmt.Errorf("lognormal median %v σ %v, want median > 0 and 0 ≤ σ ≤ 10", l.Median, l.Shape)
		}
		return nil
	case LengthPareto:
		if !(l.Shape >= 0.1) || l.Shape > 100 || l.Median <= 0 {
			return fmt.Errorf("pareto median %v α %v, want median > 0 and 0.1 ≤ α ≤ 100", l.Median, l.Shape)
		}
		return nil
	}
	return fmt.Errorf("unknown distribution %q (%s, %s, %s)", l.Dist, LengthFixed, LengthLognormal, LengthPareto)
}

func (a Arrivals) validate() error {
	if !(a.Rate > 0) || math.IsInf(a.Rate, 0) {
		return fmt.Errorf("sessions: arrival rate %v, want > 0", a.Rate)
	}
	switch a.Process {
	case ArrivalPoisson:
		return nil
	case ArrivalBursty:
		if !(a.OnShare > 0 && a.OnShare <= 1) || a.Period <= 0 {
			return fmt.Errorf("sessions: bursty on-share %v period %v, want (0, 1] and > 0", a.OnShare, a.Period)
		}
		return nil
	case ArrivalBucketed:
		if a.Bucket <= 0 {
			return fmt.Errorf("sessions: bucket %v, want > 0", a.Bucket)
		}
		return nil
	}
	return fmt.Errorf("sessions: unknown arrival process %q (%s, %s, %s)", a.Process, ArrivalPoisson, ArrivalBursty, ArrivalBucketed)
}

// Draw returns one value of the distribution.
func (l Length) Draw(rng *rand.Rand) int {
	var v float64
	switch l.Dist {
	case LengthLognormal:
		v = math.Exp(math.Log(l.Median) + l.Shape*rng.NormFloat64())
	case LengthPareto:
		// The scale x_m puts the median at Median: P(X > m) = (x_m/m)^α = 1/2.
		xm := l.Median / math.Pow(2, 1/l.Shape)
		v = xm / math.Pow(1-rng.Float64(), 1/l.Shape) // 1−U is in (0, 1]
	default:
		v = l.Median
	}
	n := l.Min
	if v > float64(n) {
		n = int(math.Min(math.Round(v), math.MaxInt32))
	}
	if l.Max > 0 {
		n = min(n, l.Max)
	}
	return max(n, l.Min)
}

// Sessions generates the workload c describes, sorted by arrival. Block ids
// follow the Mooncake convention (one per MooncakeBlockTokens tokens,
// ceil(input/512) of them, equal ids for equal prefixes): a full block
// inside the system prompt is shared by every request, one inside a group's
// prefix by the group's requests, one inside a session's history by that
// session's later turns; a prompt's last, partial block is its own.
func Sessions(c SessionsConfig) ([]Request, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	total := c.Groups * c.SessionsPerGroup
	order := rand.New(rand.NewPCG(c.Seed, 0x6f72646572)) // "order"
	perm := order.Perm(total)
	active := c.ActiveSessions
	if active <= 0 || active > total {
		active = total
	}
	prefix := make([]int, c.Groups)
	for g := range prefix {
		prefix[g] = c.Prefix.Draw(rand.New(rand.NewPCG(c.Seed, 0x67726f7570<<20|uint64(g)))) // "group"
	}
	open := make([]*session, 0, active)
	next := 0
	for ; next < active; next++ {
		open = append(open, c.newSession(perm[next], prefix))
	}
	arrivals := newArrivalClock(c.Arrivals, c.Seed)
	var out []Request
	for len(open) > 0 && (c.Requests == 0 || len(out) < c.Requests) {
		k := order.IntN(len(open))
		s := open[k]
		out = append(out, s.turn(c, arrivals.next()))
		if s.done(c) {
			if next < total {
				open[k] = c.newSession(perm[next], prefix)
				next++
			} else {
				open[k] = open[len(open)-1]
				open = open[:len(open)-1]
			}
		}
	}
	return out, nil
}

// session is one conversation's state while Sessions runs.
type session struct {
	group, id  int
	rng        *rand.Rand
	turns      int // turns to run
	sent       int // turns sent
	head       int // system + group prefix tokens
	history    int // tokens of the earlier turns' questions and answers
	question   int // the next turn's question, drawn ahead so done can see the next prompt
	idSeed     uint64
	groupSeed  uint64
	systemSeed uint64
}

func (c SessionsConfig) newSession(n int, prefix []int) *session {
	g, id := n/c.SessionsPerGroup, n%c.SessionsPerGroup
	s := &session{group: g, id: id, head: c.SystemTokens + prefix[g],
		rng:        rand.New(rand.NewPCG(c.Seed^0x73657373696f6e, uint64(g)<<32|uint64(id))), // "session"
		systemSeed: mix(c.Seed ^ 0x73797374656d),                                             // "system"
	}
	s.groupSeed = mix(s.systemSeed ^ mix(uint64(g)+1))
	s.idSeed = mix(s.groupSeed ^ mix(uint64(id)+1))
	s.turns = max(c.Turns.Draw(s.rng), 1)
	s.question = max(c.Question.Draw(s.rng), 1)
	return s
}

// turn sends the session's next turn at arrival.
func (s *session) turn(c SessionsConfig, arrival time.Duration) Request {
	input := s.head + s.history + s.question
	answer := c.Answer.Draw(s.rng)
	ids := make([]int64, (input+MooncakeBlockTokens-1)/MooncakeBlockTokens)
	for b := range ids {
		end := (b + 1) * MooncakeBlockTokens
		var h uint64
		switch {
		case end > input: // the partial last block: this turn's alone
			h = mix(s.idSeed ^ mix(uint64(b)<<32^uint64(s.sent)) ^ 0x70617274) // "part"
		case end <= c.SystemTokens:
			h = mix(s.systemSeed ^ uint64(b))
		case end <= s.head:
			h = mix(s.groupSeed ^ uint64(b))
		default:
			h = mix(s.idSeed ^ uint64(b))
		}
		ids[b] = int64(h >> 1) // non-negative, as trace ids are
	}
	s.history += s.question + answer
	s.sent++
	s.question = max(c.Question.Draw(s.rng), 1)
	return Request{Arrival: arrival, InputTokens: input, OutputTokens: answer, HashIDs: ids}
}

// done reports whether the session has sent its last turn.
func (s *session) done(c SessionsConfig) bool {
	if s.sent >= s.turns {
		return true
	}
	return c.MaxContextTokens > 0 && s.head+s.history+s.question > c.MaxContextTokens
}

// arrivalClock hands out the timestamps of an arrival process in order.
type arrivalClock struct {
	a        Arrivals
	rng      *rand.Rand
	t        float64 // seconds
	onUntil  float64 // bursty: end of the current on spell
	perSec   float64 // rate while on
	meanOn   float64 // seconds
	meanOff  float64 // seconds
	bucketSz float64 // seconds
}

func newArrivalClock(a Arrivals, seed uint64) *arrivalClock {
	c := &arrivalClock{a: a, rng: rand.New(rand.NewPCG(seed, 0x617272697665)), perSec: a.Rate} // "arrive"
	if a.Process == ArrivalBursty {
		c.perSec = a.Rate / a.OnShare
		c.meanOn = a.OnShare * a.Period.Seconds()
		c.meanOff = (1 - a.OnShare) * a.Period.Seconds()
		c.onUntil = c.rng.ExpFloat64() * c.meanOn
	}
	c.bucketSz = a.Bucket.Seconds()
	return c
}

// next returns the next arrival time.
func (c *arrivalClock) next() time.Duration {
	gap := c.rng.ExpFloat64() / c.perSec
	if c.a.Process == ArrivalBursty {
		// The gap is measured in on-time: skip every off spell it crosses
		// (memorylessness makes this the on/off process exactly).
		for c.t+gap > c.onUntil {
			gap -= c.onUntil - c.t
			off := c.rng.ExpFloat64() * c.meanOff
			c.t = c.onUntil + off
			c.onUntil = c.t + c.rng.ExpFloat64()*c.meanOn
		}
	}
	c.t += gap
	t := c.t
	if c.a.Process == ArrivalBucketed {
		t = math.Floor(t/c.bucketSz) * c.bucketSz
	}
	return time.Duration(t * float64(time.Second))
}
