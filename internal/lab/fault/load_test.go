//go:build fault

package fault

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// outcome of one client request.
type outcome int

const (
	// ok: 200 and the stream ended with [DONE].
	ok outcome = iota
	// cut: 200 and at least one event, then the stream broke: the request
	// had started streaming, so the suite does not count it lost.
	cut
	// lost: anything else (an error before the first event, any status
	// but 200): a request lost before it started streaming.
	lost
)

func (o outcome) String() string { return [...]string{"ok", "cut", "lost"}[o] }

// record is one client request as the load generator saw it.
type record struct {
	id         string
	router     int // the router that answered (or the last tried)
	start, end time.Time
	status     int
	out        outcome
	err        string
	code       string // the OpenAI error code of an error answer ("" for none)
	refused    int    // routers skipped because the dial failed (never sent)
	resets     int    // connections reset before any answer, retried elsewhere
}

// load is a closed-loop client: workers send streaming chat requests, each
// with a unique X-Request-Id, to the routers targets() names, in turn. A
// router that refuses the connection is skipped for the next one, as a
// client behind DNS round-robin or a load balancer does: the request never
// reached it. Keep-alives are off so a closing router cannot race a
// reused connection. A connection reset before any answer is retried once
// at the next router, as the OpenAI SDKs retry connection errors by
// default: a router closing its listener resets the connections still in
// the kernel's accept queue, which it never read (cmd/kvmesh/router.go's
// shutdown narrows that window; no portable call closes it). Should a
// router have dispatched such a request after all, the replicas log its
// generation twice and the suite fails on the duplicate.
type load struct {
	name    string
	targets func() []int
	client  *http.Client
	seq     atomic.Int64
	stopc   chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	recs    []record
}

// startLoad runs workers until stop. targets is read before each request.
func startLoad(name string, workers int, targets func() []int) *load {
	d := &net.Dialer{Timeout: 2 * time.Second}
	l := &load{name: name, targets: targets, stopc: make(chan struct{}),
		client: &http.Client{Timeout: 40 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true, DialContext: d.DialContext, MaxIdleConnsPerHost: -1,
		}}}
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stopc:
					return
				default:
				}
				r := l.one()
				l.mu.Lock()
				l.recs = append(l.recs, r)
				l.mu.Unlock()
				if r.out != ok {
					// Do not spin on a broken mesh.
					time.Sleep(100 * time.Millisecond)
				} else {
					time.Sleep(20 * time.Millisecond)
				}
			}
		}()
	}
	return l
}

// stop ends the load, waits for the requests in flight and returns all
// records.
func (l *load) stop() []record {
	close(l.stopc)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.recs
}

// sharedPrefixes are system prompts many requests share, so routing has
// cache affinity to keep or lose.
var sharedPrefixes = func() []string {
	var out []string
	for p := 0; p < 6; p++ {
		var b strings.Builder
		fmt.Fprintf(&b, "You are assistant %d of the fault suite. ", p)
		for w := 0; w < 60; w++ {
			fmt.Fprintf(&b, "rule%d-%d keeps answers short and exact. ", p, w)
		}
		out = append(out, b.String())
	}
	return out
}()

func (l *load) one() record {
	n := l.seq.Add(1)
	id := fmt.Sprintf("%s-%06d", l.name, n)
	body, _ := json.Marshal(map[string]any{
		"model": "kvmesh-sim", "stream": true, "max_tokens": 8,
		"messages": []map[string]string{
			{"role": "system", "content": sharedPrefixes[n%int64(len(sharedPrefixes))]},
			{"role": "user", "content": "request " + id},
		},
	})
	rec := record{id: id, start: time.Now()}
	defer func() { rec.end = time.Now() }()
	targets := l.targets()
	if len(targets) == 0 {
		rec.out, rec.err = lost, "no router to send to"
		rec.end = time.Now()
		return rec
	}
	for a := 0; a < len(targets); a++ {
		i := targets[(int(n)+a)%len(targets)]
		rec.router = i
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, routerAPI(i)+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(headerRequestID, id)
		resp, err := l.client.Do(req)
		if err != nil {
			if neverSent(err) {
				rec.refused++
				continue
			}
			if resetBeforeAnswer(err) && rec.resets == 0 {
				rec.resets++
				continue
			}
			rec.out, rec.err = lost, err.Error()
			rec.end = time.Now()
			return rec
		}
		rec.status = resp.StatusCode
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") != "" {
			// A router that is not ready (just restarted, models not
			// known yet) refuses with 503 + Retry-After before it routes
			// anything: a client or load balancer tries the next one.
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			rec.refused++
			continue
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			resp.Body.Close()
			var e struct {
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			rec.out, rec.err, rec.code = lost, fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b))), e.Error.Code
			rec.end = time.Now()
			return rec
		}
		events, done, code, err := readStream(resp)
		rec.code = code
		switch {
		case done:
			rec.out = ok
		case events > 0:
			rec.out, rec.err = cut, fmt.Sprintf("stream cut after %d events: %v", events, err)
		default:
			rec.out, rec.err = lost, fmt.Sprintf("200 but no event: %v", err)
		}
		rec.end = time.Now()
		return rec
	}
	rec.out, rec.err = lost, "every router refused the connection"
	rec.end = time.Now()
	return rec
}

// neverSent reports a dial failure: the request provably reached no one.
func neverSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}

// resetBeforeAnswer reports a connection the router reset or closed
// before it wrote a byte of an answer.
func resetBeforeAnswer(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// readStream reads a stream to its end and counts its events. A router
// ends a stream its upstream failed with an error event and a clean end
// (proxy/midstream.go): that event is not one of the stream's, so a
// request whose only event is the error is still lost before streaming.
// readStream reads a stream to its end: the events before it, whether
// it ended with [DONE], and the code of a router's error event.
func readStream(resp *http.Response) (events int, done bool, code string, err error) {
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if data == "[DONE]" {
			return events, true, "", nil
		}
		var e struct {
			Error *struct{ Message, Code string } `json:"error"`
		}
		if json.Unmarshal([]byte(data), &e) == nil && e.Error != nil {
			return events, false, e.Error.Code, fmt.Errorf("error event: %s", e.Error.Message)
		}
		events++
	}
	if sc.Err() != nil {
		return events, false, "", sc.Err()
	}
	return events, false, "", errors.New("EOF before [DONE]")
}

// tally summarises records against the replicas' generation counts.
type tally struct {
	requests, ok, cut, lost, refused, resets int
	dupes                                    []string // ids generated more than once
	unseen                                   []string // ok ids no replica logged (counting broken)
	// ownerGone are the lost requests answered owner_router_gone
	// (proxy/ownergone.go: a 502, or a stream with no event but the
	// error event): their owner router left the mesh and did not answer
	// after it may have dispatched them.
	ownerGone []string
	lastBad   time.Time
	samples   []string // a few failures, for the log
}

func tallyOf(recs []record, gens map[string]int) tally {
	var t tally
	for _, r := range recs {
		t.requests++
		t.refused += r.refused
		t.resets += r.resets
		switch r.out {
		case ok:
			t.ok++
			if gens[r.id] == 0 {
				t.unseen = append(t.unseen, r.id)
			}
		case cut:
			t.cut++
		case lost:
			t.lost++
			// A 502 before the stream, or a stream whose only event
			// is the router's error event.
			if (r.status == http.StatusBadGateway || r.status == http.StatusOK) && r.code == ownerGoneCode {
				t.ownerGone = append(t.ownerGone, r.id)
			}
		}
		if r.out != ok {
			if r.end.After(t.lastBad) {
				t.lastBad = r.end
			}
			if len(t.samples) < 5 {
				t.samples = append(t.samples, fmt.Sprintf("%s via r%d at %s after %.3fs: %s: %s", r.id, r.router, r.start.UTC().Format("15:04:05.000"), r.end.Sub(r.start).Seconds(), r.out, r.err))
			}
		}
		if gens[r.id] > 1 {
			t.dupes = append(t.dupes, fmt.Sprintf("%s×%d", r.id, gens[r.id]))
		}
	}
	return t
}
