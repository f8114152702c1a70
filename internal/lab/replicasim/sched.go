package replicasim

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// scheduler admits at most max running sequences; the rest wait in FIFO
// order, like vLLM's waiting queue. onChange reports (running, waiting) under
// the lock so the gauges never disagree with the queue.
type scheduler struct {
	mu       sync.Mutex
	max      int
	running  int
	waiting  list.List // of chan struct{}, closed when the slot is handed over
	onChange func(running, waiting int)
}

// acquire blocks until the caller holds a running slot or ctx ends.
func (s *scheduler) acquire(ctx context.Context) error {
	s.mu.Lock()
	if s.running < s.max && s.waiting.Len() == 0 {
		s.running++
		s.changedLocked()
		s.mu.Unlock()
		return nil
	}
	ch := make(chan struct{})
	e := s.waiting.PushBack(ch)
	s.changedLocked()
	s.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		select {
		case <-ch:
			// Granted while giving up: pass the slot on.
			s.releaseLocked()
		default:
			s.waiting.Remove(e)
			s.changedLocked()
		}
		s.mu.Unlock()
		return ctx.Err()
	}
}

// release gives the slot to the oldest waiter, or frees it.
func (s *scheduler) release() {
	s.mu.Lock()
	s.releaseLocked()
	s.mu.Unlock()
}

func (s *scheduler) releaseLocked() {
	if front := s.waiting.Front(); front != nil {
		close(s.waiting.Remove(front).(chan struct{})) // the slot moves; running is unchanged
	} else {
		s.running--
	}
	s.changedLocked()
}

func (s *scheduler) changedLocked() {
	if s.onChange != nil {
		s.onChange(s.running, s.waiting.Len())
	}
}

// lane is a FIFO mutex that can be given up on: the one prefill lane (the
// GPU) that serializes prefills of a replica. Blocked channel senders are
// served in arrival order.
type lane chan struct{}

func (l lane) lock(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l lane) unlock() { <-l }

// sleepUntil waits until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
