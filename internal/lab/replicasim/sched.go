package replicasim

import (
	"container/list"
	"context"
	"sync"
	"time"
)

// scheduler admits at most max running sequences; the rest wait in FIFO
// order, like vLLM's waiting queue. With LoRA adapters (loras) a waiting
// request is also held while its adapter cannot run: as vLLM's scheduler
// does, it is skipped and a later request that can run goes first.
// onChange reports (running, waiting) under the lock so the gauges never
// disagree with the queue.
type scheduler struct {
	mu       sync.Mutex
	max      int
	running  int
	waiting  list.List  // of *waiter, oldest first
	loras    *loraState // nil without adapters
	onChange func(running, waiting int)
}

// waiter is one request waiting for a running slot.
type waiter struct {
	adapter string        // its LoRA adapter, "" for the base model
	granted chan struct{} // closed when it holds a slot
	done    bool          // granted (under the lock)
	ready   time.Time     // when its adapter is loaded (granted)
}

// acquire blocks until the caller holds a running slot or ctx ends. It
// returns when the request's adapter is loaded (zero without one or when
// it is already), which the caller waits for before its prefill.
func (s *scheduler) acquire(ctx context.Context, adapter string) (time.Time, error) {
	w := &waiter{adapter: adapter, granted: make(chan struct{})}
	s.mu.Lock()
	e := s.waiting.PushBack(w)
	s.loras.waitChange(adapter, 1)
	s.dispatchLocked()
	s.changedLocked()
	if w.done {
		s.mu.Unlock()
		return w.ready, nil
	}
	s.mu.Unlock()
	select {
	case <-w.granted:
		return w.ready, nil
	case <-ctx.Done():
		s.mu.Lock()
		if w.done {
			// Granted while giving up: pass the slot on.
			s.releaseLocked(adapter)
		} else {
			s.waiting.Remove(e)
			s.loras.waitChange(adapter, -1)
			s.changedLocked()
		}
		s.mu.Unlock()
		return time.Time{}, ctx.Err()
	}
}

// dispatchLocked grants free slots to the oldest waiters that can run.
func (s *scheduler) dispatchLocked() {
	for e := s.waiting.Front(); e != nil && s.running < s.max; {
		next := e.Next()
		if w := e.Value.(*waiter); s.loras.fits(w.adapter) {
			s.waiting.Remove(e)
			s.running++
			s.loras.waitChange(w.adapter, -1)
			w.ready = s.loras.start(w.adapter)
			w.done = true
			close(w.granted)
		}
		e = next
	}
}

// release frees the slot of a request of adapter and hands free slots on.
func (s *scheduler) release(adapter string) {
	s.mu.Lock()
	s.releaseLocked(adapter)
	s.mu.Unlock()
}

func (s *scheduler) releaseLocked(adapter string) {
	s.running--
	s.loras.finish(adapter)
	s.dispatchLocked()
	s.changedLocked()
}

func (s *scheduler) changedLocked() {
	if s.onChange != nil {
		s.onChange(s.running, s.waiting.Len())
	}
	s.loras.changed()
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
