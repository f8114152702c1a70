package zmtp

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"time"
)

// Server accepts ZMTP connections on one TCP listener as a socket of one
// type (a PUB, or a ROUTER answering requests) and owns the goroutines
// that serve them. It is what an engine's side looks like: the replica
// simulator publishes with it, and tests stand in for vLLM with it.
type Server struct {
	ln   net.Listener
	self string
	lim  Limits

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	close bool
	wg    sync.WaitGroup
	// answer, for a ROUTER, is the reply to each request message.
	answer func(req [][]byte) [][][]byte
}

// subscriber is one SUB connected to a PUB Server, with the topic
// prefixes it subscribed to.
type subscriber struct {
	c      *Conn
	mu     sync.Mutex
	topics []string
	out    chan [][]byte
}

// Publish starts a PUB on ln. Messages go to every subscriber whose
// subscription prefixes the first frame; a subscriber that falls 1,024
// messages behind loses the excess (a PUB's high-water mark).
func Publish(ln net.Listener, lim Limits) *Server {
	s := &Server{ln: ln, self: Pub, lim: lim, subs: map[*subscriber]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Answer starts a ROUTER on ln that answers every request message with
// the messages answer returns (each sent with the requester's envelope:
// the DEALER sees them as they are returned).
func Answer(ln net.Listener, lim Limits, answer func(req [][]byte) [][][]byte) *Server {
	s := &Server{ln: ln, self: Router, lim: lim, subs: map[*subscriber]struct{}{}, answer: answer}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Addr is the listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops accepting, closes every connection and waits for the
// server's goroutines.
func (s *Server) Close() error {
	s.mu.Lock()
	s.close = true
	for sub := range s.subs {
		sub.c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		s.wg.Add(1)
		go s.serve(nc)
	}
}

func (s *Server) serve(nc net.Conn) {
	defer s.wg.Done()
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	c, err := Handshake(ctx, nc, s.self, true, s.lim)
	cancel()
	if err != nil {
		return
	}
	sub := &subscriber{c: c, out: make(chan [][]byte, 1024)}
	s.mu.Lock()
	if s.close {
		s.mu.Unlock()
		return
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
	}()
	if s.self == Router {
		s.answerLoop(c)
		return
	}
	done := make(chan struct{})
	s.wg.Add(1)
	go func() { // the writer: one per subscriber, ends when the reader does
		defer s.wg.Done()
		for {
			select {
			case <-done:
				return
			case m := <-sub.out:
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if c.WriteMsg(m...) != nil {
					c.Close()
					return
				}
			}
		}
	}()
	defer close(done)
	for { // subscriptions: 0x01 topic subscribes, 0x00 topic unsubscribes
		frames, err := c.ReadMsg(nil)
		if err != nil {
			return
		}
		if len(frames) != 1 || len(frames[0]) == 0 {
			continue
		}
		topic := string(frames[0][1:])
		sub.mu.Lock()
		switch frames[0][0] {
		case 1:
			sub.topics = append(sub.topics, topic)
		case 0:
			for i, t := range sub.topics {
				if t == topic {
					sub.topics = append(sub.topics[:i], sub.topics[i+1:]...)
					break
				}
			}
		}
		sub.mu.Unlock()
	}
}

func (s *Server) answerLoop(c *Conn) {
	for {
		req, err := c.ReadMsg(nil)
		if err != nil {
			return
		}
		for _, m := range s.answer(req) {
			_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
			if c.WriteMsg(m...) != nil {
				return
			}
		}
	}
}

// Send publishes one message to the subscribers of its first frame.
func (s *Server) Send(frames ...[]byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	topic := ""
	if len(frames) > 0 {
		topic = string(frames[0])
	}
	for sub := range s.subs {
		sub.mu.Lock()
		want := false
		for _, t := range sub.topics {
			if strings.HasPrefix(topic, t) {
				want = true
				break
			}
		}
		sub.mu.Unlock()
		if !want {
			continue
		}
		select {
		case sub.out <- frames:
		default: // past the high-water mark: dropped, as a PUB does
		}
	}
}

// Subscribers counts the connections that subscribed to something.
func (s *Server) Subscribers() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for sub := range s.subs {
		sub.mu.Lock()
		if len(sub.topics) > 0 {
			n++
		}
		sub.mu.Unlock()
	}
	return n
}
