package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/internal/zmtp"
)

// Handler consumes one engine's events, in sequence order, from the one
// goroutine that runs the Subscriber.
type Handler interface {
	// Batch is one published batch, in order.
	Batch(b Batch)
	// Lost says events were lost: a gap that no replay filled, or a
	// publisher that restarted its sequence (an engine restart). What was
	// derived from earlier events can no longer be trusted.
	Lost(reason string)
}

// Config is one subscription.
type Config struct {
	// Endpoint is the publisher, "tcp://host:port" (the engine binds it).
	Endpoint string
	// Replay is the engine's replay endpoint ("": gaps are not replayed).
	Replay string
	// Topic is the subscription prefix ("": every topic).
	Topic string
	// Limits bound a message (default: 16 MiB frames, 16 frames).
	Limits zmtp.Limits
	// MinBackoff and MaxBackoff bound the wait before reconnecting
	// (defaults 100 ms and 5 s; doubled per failure, with jitter).
	MinBackoff, MaxBackoff time.Duration
	// Now is the clock the lag is measured with (default time.Now).
	Now func() time.Time
}

// Stats is where a subscription stands.
type Stats struct {
	Connected bool `json:"connected"`
	// Batches and Events delivered; Skipped events of unknown kinds.
	Batches uint64 `json:"batches"`
	Events  uint64 `json:"events"`
	Skipped uint64 `json:"skipped"`
	// Gaps are jumps in the sequence; Replayed the batches a replay
	// brought back; Resyncs the losses reported to the handler (gaps not
	// filled, restarts); Reconnects the connections lost.
	Gaps       uint64 `json:"gaps"`
	Replayed   uint64 `json:"replayed"`
	Resyncs    uint64 `json:"resyncs"`
	Reconnects uint64 `json:"reconnects"`
	Malformed  uint64 `json:"malformed"`
	// LastSeq is the last sequence delivered (-1: none).
	LastSeq int64 `json:"last_seq"`
	// LagSeconds is the age of the last batch when it was delivered (the
	// router's clock against the engine's timestamp; clock skew adds).
	LagSeconds float64 `json:"lag_seconds"`
	// LastBatch is when the last batch was delivered.
	LastBatch time.Time `json:"last_batch"`
	LastError string    `json:"last_error,omitempty"`
}

// Subscriber keeps one subscription going: it connects, reads batches,
// replays gaps, reconnects with backoff. It is safe to read Stats from
// any goroutine while Run runs.
type Subscriber struct {
	cfg       Config
	addr      string
	replay    string
	h         Handler
	mu        sync.Mutex
	st        Stats
	last      int64 // last sequence delivered, -1 none
	replayLow int64 // sequences at or above it may come again after a replay
}

// endSeq is the replay's end marker: -1 as 8 big-endian bytes.
const endSeq = ^uint64(0)

// hostPort turns "tcp://host:port" into "host:port".
func hostPort(ep string) (string, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok || rest == "" || strings.HasPrefix(rest, "*") {
		return "", fmt.Errorf("kvevents: endpoint %q: want tcp://host:port", ep)
	}
	return rest, nil
}

// New checks cfg and returns a Subscriber for h.
func New(cfg Config, h Handler) (*Subscriber, error) {
	addr, err := hostPort(cfg.Endpoint)
	if err != nil {
		return nil, err
	}
	s := &Subscriber{cfg: cfg, addr: addr, h: h, last: -1, replayLow: -1}
	if cfg.Replay != "" {
		if s.replay, err = hostPort(cfg.Replay); err != nil {
			return nil, err
		}
	}
	if s.cfg.MinBackoff <= 0 {
		s.cfg.MinBackoff = 100 * time.Millisecond
	}
	if s.cfg.MaxBackoff < s.cfg.MinBackoff {
		s.cfg.MaxBackoff = max(5*time.Second, s.cfg.MinBackoff)
	}
	if s.cfg.Now == nil {
		s.cfg.Now = time.Now
	}
	s.st.LastSeq = -1
	return s, nil
}

// Stats returns the subscription's counters.
func (s *Subscriber) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// Run subscribes until ctx ends, reconnecting with backoff.
func (s *Subscriber) Run(ctx context.Context) {
	wait := s.cfg.MinBackoff
	for ctx.Err() == nil {
		delivered, err := s.session(ctx)
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		s.st.Connected = false
		s.st.Reconnects++
		if err != nil {
			s.st.LastError = err.Error()
		}
		s.mu.Unlock()
		if delivered {
			wait = s.cfg.MinBackoff
		}
		jitter := time.Duration(rand.Int64N(int64(wait)/2 + 1))
		t := time.NewTimer(wait/2 + jitter)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, s.cfg.MaxBackoff)
	}
}

// session is one connection: it returns when the connection fails or
// ctx ends, and reports whether it delivered anything.
func (s *Subscriber) session(ctx context.Context) (delivered bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	c, err := zmtp.Dial(dctx, s.addr, zmtp.Sub, s.cfg.Limits)
	cancel()
	if err != nil {
		return false, err
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	if err := c.Subscribe(s.cfg.Topic); err != nil {
		return false, err
	}
	s.mu.Lock()
	s.st.Connected = true
	s.st.LastError = ""
	s.mu.Unlock()
	var frames [][]byte
	for {
		frames, err = c.ReadMsg(frames)
		if err != nil {
			return delivered, err
		}
		seq, payload, ok := split(frames)
		if !ok {
			s.count(func(st *Stats) { st.Malformed++ })
			continue
		}
		s.receive(ctx, seq, payload)
		delivered = true
	}
}

// split reads [topic, seq, payload] (a publisher without a topic sends
// [seq, payload]).
func split(frames [][]byte) (seq uint64, payload []byte, ok bool) {
	switch len(frames) {
	case 3:
		frames = frames[1:]
	case 2:
	default:
		return 0, nil, false
	}
	if len(frames[0]) != 8 {
		return 0, nil, false
	}
	return binary.BigEndian.Uint64(frames[0]), frames[1], true
}

func (s *Subscriber) count(f func(*Stats)) {
	s.mu.Lock()
	f(&s.st)
	s.mu.Unlock()
}

// receive orders one live batch against what was delivered: the next one
// is delivered, a duplicate (after a replay) dropped, a jump replayed or
// reported lost, a sequence that went back (a restarted publisher)
// reported lost and then followed.
func (s *Subscriber) receive(ctx context.Context, seq uint64, payload []byte) {
	sq := int64(seq)
	switch {
	case s.last < 0 || sq == s.last+1:
	case sq <= s.last && s.replayLow >= 0 && sq >= s.replayLow:
		return // already delivered by a replay
	case sq <= s.last:
		s.lost(fmt.Sprintf("publisher restarted its sequence (%d after %d)", sq, s.last))
	default:
		s.count(func(st *Stats) { st.Gaps++ })
		s.fill(ctx, sq)
		if sq <= s.last {
			return // the replay brought it
		}
		if sq != s.last+1 {
			s.lost(fmt.Sprintf("sequence gap %d..%d not replayed", s.last+1, sq-1))
		}
	}
	s.deliver(sq, payload)
}

func (s *Subscriber) lost(reason string) {
	s.count(func(st *Stats) { st.Resyncs++ })
	s.replayLow = -1
	s.h.Lost(reason)
}

func (s *Subscriber) deliver(seq int64, payload []byte) {
	b, err := DecodeBatch(payload)
	s.last = seq
	if err != nil {
		s.count(func(st *Stats) { st.Malformed++; st.LastSeq = seq; st.LastError = err.Error() })
		s.h.Lost("malformed batch")
		return
	}
	now := s.cfg.Now()
	lag := now.Sub(time.Unix(0, int64(b.TS*1e9))).Seconds()
	s.count(func(st *Stats) {
		st.Batches++
		st.Events += uint64(len(b.Events))
		st.Skipped += uint64(b.Skipped)
		st.LastSeq = seq
		st.LagSeconds = lag
		st.LastBatch = now
	})
	s.h.Batch(b)
}

// fill asks the replay endpoint for the batches from s.last+1 on and
// delivers those that follow in order; it stops at the end marker, an
// error, or 2 s.
func (s *Subscriber) fill(ctx context.Context, upTo int64) {
	if s.replay == "" {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := zmtp.Dial(rctx, s.replay, zmtp.Dealer, s.cfg.Limits)
	if err != nil {
		s.count(func(st *Stats) { st.LastError = "replay: " + err.Error() })
		return
	}
	defer c.Close()
	stop := context.AfterFunc(rctx, func() { c.Close() })
	defer stop()
	from := s.last + 1
	if err := c.WriteMsg([]byte{}, binary.BigEndian.AppendUint64(nil, uint64(from))); err != nil {
		return
	}
	s.replayLow = from
	var frames [][]byte
	for range upTo - from + 1 + 1024 { // bounded: the gap, and what came since
		frames, err = c.ReadMsg(frames)
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				s.count(func(st *Stats) { st.LastError = "replay: " + err.Error() })
			}
			return
		}
		// [empty delimiter, seq, payload]
		if len(frames) == 3 && len(frames[0]) == 0 {
			frames = frames[1:]
		}
		seq, payload, ok := split(frames)
		if !ok || seq == endSeq {
			return
		}
		sq := int64(seq)
		if sq != s.last+1 {
			if sq <= s.last {
				continue
			}
			return // the replay's buffer does not reach back
		}
		s.count(func(st *Stats) { st.Replayed++ })
		s.deliver(sq, payload)
	}
}
