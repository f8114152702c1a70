//go:build fault

package fault

import (
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// flood holds many attacker connections open against one address.
type flood struct {
	mu     sync.Mutex
	conns  []net.Conn
	failed atomic.Int64 // dials or first writes that failed
	closed atomic.Int64 // connections the server closed (a write or read failed)
	stopc  chan struct{}
	wg     sync.WaitGroup
}

// openFlood dials n connections to addr (64 at a time) from attackerIP and sends each
// prefix; trickle, when positive, then writes one byte to every open
// connection that often, as a slow-body client does.
func openFlood(addr string, n int, prefix func(i int) []byte, trickle time.Duration) *flood {
	f := &flood{stopc: make(chan struct{})}
	sem := make(chan struct{}, 64)
	var dial sync.WaitGroup
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(attackerIP)}}
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		dial.Add(1)
		go func(i int) {
			defer func() { <-sem; dial.Done() }()
			c, err := d.Dial("tcp", addr)
			if err != nil {
				f.failed.Add(1)
				return
			}
			_ = c.SetWriteDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.Write(prefix(i)); err != nil {
				f.failed.Add(1)
				c.Close()
				return
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
		}(i)
	}
	dial.Wait()
	if trickle > 0 {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			t := time.NewTicker(trickle)
			defer t.Stop()
			for {
				select {
				case <-f.stopc:
					return
				case <-t.C:
				}
				f.mu.Lock()
				live := f.conns[:0]
				for _, c := range f.conns {
					_ = c.SetWriteDeadline(time.Now().Add(time.Second))
					if _, err := c.Write([]byte{'x'}); err != nil {
						f.closed.Add(1)
						c.Close()
						continue
					}
					live = append(live, c)
				}
				f.conns = live
				f.mu.Unlock()
			}
		}()
	}
	return f
}

func (f *flood) open() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.conns)
}

// stillOpen probes every connection with a short read: a connection the
// server closed reads EOF or an error; an open one times out.
func (f *flood) stillOpen() int {
	f.mu.Lock()
	conns := append([]net.Conn(nil), f.conns...)
	f.mu.Unlock()
	var open atomic.Int64
	var wg sync.WaitGroup
	sem := make(chan struct{}, 256)
	for _, c := range conns {
		sem <- struct{}{}
		wg.Add(1)
		go func(c net.Conn) {
			defer func() { <-sem; wg.Done() }()
			_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			var b [4096]byte
			for {
				_, err := c.Read(b[:])
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					open.Add(1)
					return
				}
				if err != nil {
					return
				}
			}
		}(c)
	}
	wg.Wait()
	return int(open.Load())
}

func (f *flood) close() {
	close(f.stopc)
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
}

// slowBodyPrefix is a request whose body then arrives a byte at a time.
func slowBodyPrefix(host string) func(int) []byte {
	return func(int) []byte {
		return []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{", host))
	}
}

// bigLengthPrefix announces a 16 MB body (the default --max-body-bytes)
// and sends 4 KB of it.
func bigLengthPrefix(host string) func(int) []byte {
	return func(int) []byte {
		b := []byte(fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"kvmesh-sim\",\"messages\":[{\"role\":\"user\",\"content\":\"", host, 16<<20))
		for len(b) < 4096 {
			b = append(b, 'a')
		}
		return b
	}
}

// gossipFrameBytes is memberlist's limit on remote state (maxPushStateBytes).
const gossipFrameBytes = 20 << 20

// gossipFrame is an unauthenticated memberlist stream: the encryptMsg type
// byte (10), a 4-byte length of 20 MB, then all of the "ciphertext" but
// its last 64 KB, which never comes: memberlist buffers it all before it
// can try the key.
var gossipFrame = func() []byte {
	b := make([]byte, 5+gossipFrameBytes-(64<<10))
	b[0] = 10
	binary.BigEndian.PutUint32(b[1:5], gossipFrameBytes-1)
	return b
}()
