package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
)

// SlowConfig configures RunSlowClients: what many stalled stream readers
// make one router hold, and what the router's other clients see then.
type SlowConfig struct {
	Router    string        // the router's API base URL (127.0.0.1)
	Admin     string        // its admin base URL, for /metrics ("" skips the metrics)
	PID       int           // its process, for RSS and descriptors (0 skips)
	Model     string        // model name
	Stalled   int           // streams opened that read nothing (or ReadRate)
	ReadRate  int           // bytes per second each stalled reader reads (0: none)
	Tokens    int           // max_tokens of a stalled stream: more than buffers hold
	Normal    int           // closed-loop normal clients
	Window    time.Duration // each latency window of the normal clients
	Hold      time.Duration // how long the stalled streams are watched
	Every     time.Duration // the router is sampled this often while they are
	BodyBytes int           // request body size
	Progress  io.Writer     // progress lines (nil: none)
}

// SlowSample is the router at one moment.
type SlowSample struct {
	At         float64 `json:"at_s"` // seconds since the stalled streams began to open
	Goroutines int     `json:"goroutines"`
	RSSKB      int     `json:"rss_kb"`
	FDs        int     `json:"fds"`
	// TCPMemKB is the kernel's memory in TCP socket buffers, the whole
	// host's (/proc/net/sockstat; 0 elsewhere): on 127.0.0.1 the router's
	// sockets and the clients' and replica's alike.
	TCPMemKB      int `json:"tcp_mem_kb"`
	WriteTimeouts int `json:"write_timeouts"`
	Open          int `json:"stalled_open"` // stalled connections the router has not closed (known at the end)
}

// SlowLatency is one window of the normal clients.
type SlowLatency struct {
	Phase    string  `json:"phase"`
	Requests int     `json:"requests"`
	Errors   int     `json:"errors"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	Maxms    float64 `json:"max_ms"`
}

// SlowResult is what RunSlowClients measured.
type SlowResult struct {
	Stalled   int           `json:"stalled"`
	Opened    int           `json:"opened"`      // stalled streams that got a 200 head
	OpenErrs  int           `json:"open_errors"` // that did not
	OpenedIn  float64       `json:"opened_in_s"`
	Samples   []SlowSample  `json:"samples"`
	Latency   []SlowLatency `json:"latency"`
	CutBy     float64       `json:"cut_by_s"`   // when the router had closed every stalled stream (-1: not within Hold)
	StillOpen int           `json:"still_open"` // stalled streams the router had not closed at the end
	Closed    int           `json:"closed"`     // stalled streams the router had closed at the end
}

func (c *SlowConfig) defaults() {
	if c.Model == "" {
		c.Model = "bench"
	}
	if c.Stalled <= 0 {
		c.Stalled = 2000
	}
	if c.Tokens <= 0 {
		c.Tokens = 100000
	}
	if c.Normal <= 0 {
		c.Normal = 4
	}
	if c.Window <= 0 {
		c.Window = 3 * time.Second
	}
	if c.Hold <= 0 {
		c.Hold = 30 * time.Second
	}
	if c.Every <= 0 {
		c.Every = time.Second
	}
	if c.BodyBytes <= 0 {
		c.BodyBytes = 2048
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
}

// stalledConn is one stalled stream reader.
type stalledConn struct {
	c    net.Conn
	head bool         // a 200 head came
	end  atomic.Value // error that ended it (io.EOF: a whole response)
}

// RunSlowClients opens cfg.Stalled streaming requests to the router over
// connections with a 4 KB receive buffer that read nothing (or ReadRate
// bytes a second), while cfg.Normal closed-loop clients send small
// streaming requests; it samples the router (goroutines, RSS, open
// descriptors, write timeouts) every cfg.Every for cfg.Hold and measures
// the normal clients' latency before, while and after. Every loop it runs
// is bounded by cfg.Hold and the connections it opened.
func RunSlowClients(ctx context.Context, cfg SlowConfig) (SlowResult, error) {
	cfg.defaults()
	res := SlowResult{Stalled: cfg.Stalled, CutBy: -1}
	base := strings.TrimRight(cfg.Router, "/")
	host := strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
	client := overheadClient(cfg.Normal)
	var seq atomic.Int64
	latency := func(phase string) {
		l := normalWindow(ctx, client, base, cfg, &seq)
		l.Phase = phase
		res.Latency = append(res.Latency, l)
		fmt.Fprintf(cfg.Progress, "normal clients %s: %d requests, %d errors, p50 %.1f ms, p99 %.1f ms\n", phase, l.Requests, l.Errors, l.P50ms, l.P99ms)
	}
	start := time.Now()
	sample := func() SlowSample {
		s := SlowSample{At: time.Since(start).Seconds()}
		s.RSSKB, s.FDs = procStats(cfg.PID)
		s.TCPMemKB = tcpMemKB()
		s.Goroutines, s.WriteTimeouts = routerMetrics(client, cfg.Admin)
		return s
	}
	latency("before")
	res.Samples = append(res.Samples, sample())
	res.Samples[0].At = 0

	start = time.Now()
	conns := make([]*stalledConn, cfg.Stalled)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			conns[i] = openStalled(ctx, host, cfg, seq.Add(1))
		})
	}
	wg.Wait()
	res.OpenedIn = time.Since(start).Seconds()
	for _, s := range conns {
		if s.head {
			res.Opened++
		} else {
			res.OpenErrs++
		}
	}
	fmt.Fprintf(cfg.Progress, "%d stalled streams open in %.1fs (%d failed)\n", res.Opened, res.OpenedIn, res.OpenErrs)
	// Readers: at ReadRate, or (none) one read after Hold that finds
	// whether the router closed the connection.
	var readers sync.WaitGroup
	stop := make(chan struct{})
	for _, s := range conns {
		if s.c == nil {
			continue
		}
		readers.Go(func() { s.read(cfg.ReadRate, stop) })
	}
	deadline := start.Add(cfg.Hold)
	latencyDone := make(chan struct{})
	go func() {
		// Back to back while the stalled streams are held.
		defer close(latencyDone)
		for time.Until(deadline) > cfg.Window && ctx.Err() == nil {
			latency(fmt.Sprintf("from t=%.0fs", time.Since(start).Seconds()))
		}
	}()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		s := sample()
		res.Samples = append(res.Samples, s)
		fmt.Fprintf(cfg.Progress, "t=%5.1fs goroutines %d rss %d MB fds %d tcp mem %d MB write timeouts %d\n", s.At, s.Goroutines, s.RSSKB>>10, s.FDs, s.TCPMemKB>>10, s.WriteTimeouts)
		select {
		case <-time.After(cfg.Every):
		case <-ctx.Done():
		}
	}
	<-latencyDone
	close(stop)
	readers.Wait()
	for _, s := range conns {
		if s.c == nil {
			continue
		}
		switch err, _ := s.end.Load().(error); {
		case err == nil || errors.Is(err, os.ErrDeadlineExceeded):
			res.StillOpen++
		default: // EOF or reset: the router closed it (a whole response would keep it open)
			res.Closed++
		}
		s.c.Close()
	}
	// When the router had let go of them: its descriptors back to within
	// a tenth of the stalled streams of where they were.
	b := res.Samples[0].FDs
	for _, s := range res.Samples[1:] {
		if s.FDs > b+cfg.Stalled/10 {
			res.CutBy = -1
		} else if res.CutBy < 0 && s.At > res.OpenedIn {
			res.CutBy = s.At
		}
	}
	latency("after")
	return res, ctx.Err()
}

// openStalled opens one stalled stream and reads its head.
func openStalled(ctx context.Context, host string, cfg SlowConfig, n int64) *stalledConn {
	s := &stalledConn{}
	d := net.Dialer{Timeout: 5 * time.Second, Control: smallReceiveBuffer}
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		s.end.Store(err)
		return s
	}
	s.c = c
	body := overheadBody(cfg.Model, n, cfg.BodyBytes, true, cfg.Tokens)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", host, len(body), body); err != nil {
		s.end.Store(err)
		return s
	}
	// The head only: the status line is in the first bytes.
	line, err := bufio.NewReaderSize(c, 64).ReadSlice('\n')
	s.head = err == nil && strings.HasPrefix(string(line), "HTTP/1.1 200")
	_ = c.SetDeadline(time.Time{})
	return s
}

// read reads at rate bytes a second until the connection ends or stop;
// at rate 0 it reads only once stopped, to see whether the router closed
// the connection (a whole response ends with the last chunk, read here as
// io.EOF only when the router also closed: it is enough to tell a cut).
func (s *stalledConn) read(rate int, stop <-chan struct{}) {
	b := make([]byte, 64<<10)
	if rate > 0 {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				s.drain(b)
				return
			case <-t.C:
			}
			_ = s.c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := s.c.Read(b[:rate]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				s.end.Store(err)
				return
			}
		}
	}
	<-stop
	s.drain(b)
}

// drain reads what is buffered; a connection the router closed ends (EOF
// or reset), one it holds times out.
func (s *stalledConn) drain(b []byte) {
	end := time.Now().Add(15 * time.Second) // a stream still relayed reads on
	for {
		dl := time.Now().Add(time.Second)
		if dl.After(end) {
			dl = end
		}
		_ = s.c.SetReadDeadline(dl)
		if _, err := s.c.Read(b); err != nil {
			s.end.Store(err)
			return
		}
	}
}

// normalWindow runs cfg.Normal closed-loop clients sending small streams
// (20 tokens) for cfg.Window.
func normalWindow(ctx context.Context, client *http.Client, base string, cfg SlowConfig, seq *atomic.Int64) SlowLatency {
	ctx, cancel := context.WithTimeout(ctx, cfg.Window)
	defer cancel()
	url := base + "/v1/chat/completions"
	var mu sync.Mutex
	var lat []float64
	errs := 0
	var wg sync.WaitGroup
	for range cfg.Normal {
		wg.Go(func() {
			for ctx.Err() == nil {
				t0 := time.Now()
				ok := post(ctx, client, url, overheadBody(cfg.Model, seq.Add(1), cfg.BodyBytes, true, 20))
				mu.Lock()
				if ok {
					lat = append(lat, float64(time.Since(t0))/float64(time.Millisecond))
				} else if ctx.Err() == nil {
					errs++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	l := SlowLatency{Requests: len(lat), Errors: errs}
	if len(lat) > 0 {
		l.P50ms, l.P99ms, l.Maxms = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], lat[len(lat)-1]
	}
	return l
}

// procStats returns a process's resident set (KB) and open descriptors.
func procStats(pid int) (rssKB, fds int) {
	if pid <= 0 {
		return 0, 0
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				rssKB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			}
		}
	}
	if es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		fds = len(es)
	}
	return rssKB, fds
}

// tcpMemKB is the kernel's TCP buffer memory ("TCP: ... mem PAGES" of
// /proc/net/sockstat) in KB, 0 where there is none.
func tcpMemKB() int {
	b, err := os.ReadFile("/proc/net/sockstat")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "TCP:" {
			continue
		}
		for i := 1; i+1 < len(f); i++ {
			if f[i] == "mem" {
				pages, _ := strconv.Atoi(f[i+1])
				return pages * os.Getpagesize() >> 10
			}
		}
	}
	return 0
}

// routerMetrics reads go_goroutines and the write timeouts from the
// router's /metrics.
func routerMetrics(client *http.Client, admin string) (goroutines, writeTimeouts int) {
	if admin == "" {
		return 0, 0
	}
	resp, err := client.Get(strings.TrimRight(admin, "/") + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 8<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			goroutines = int(f)
		}
		if v, ok := strings.CutPrefix(line, `kvmesh_rejected_requests_total{reason="write_timeout"} `); ok {
			f, _ := strconv.ParseFloat(v, 64)
			writeTimeouts = int(f)
		}
	}
	return goroutines, writeTimeouts
}

// WriteSlowTable prints r as tables.
func WriteSlowTable(w io.Writer, r SlowResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "t (s)\tgoroutines\tRSS (MB)\tFDs\tTCP mem (MB)\twrite timeouts\t\n")
	for _, s := range r.Samples {
		fmt.Fprintf(tw, "%.1f\t%d\t%.1f\t%d\t%.1f\t%d\t\n", s.At, s.Goroutines, float64(s.RSSKB)/1024, s.FDs, float64(s.TCPMemKB)/1024, s.WriteTimeouts)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintf(tw, "normal clients\trequests\terrors\tp50 (ms)\tp99 (ms)\tmax (ms)\t\n")
	for _, l := range r.Latency {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t\n", l.Phase, l.Requests, l.Errors, l.P50ms, l.P99ms, l.Maxms)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	cut := "not within the hold"
	if r.CutBy >= 0 {
		cut = fmt.Sprintf("by %.1fs", r.CutBy)
	}
	_, err := fmt.Fprintf(w, "\n%d stalled streams (%d opened in %.1fs, %d failed); the router let go of them %s; at the end %d still open, %d closed by the router\n",
		r.Stalled, r.Opened, r.OpenedIn, r.OpenErrs, cut, r.StillOpen, r.Closed)
	return err
}
