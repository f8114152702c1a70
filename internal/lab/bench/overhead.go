package bench

import (
	"bytes"
	"context"
	"encoding/json"
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
	"time"
)

// InstantReplica is an OpenAI-compatible replica that does no work: a
// non-streaming request gets a short chat completion at once, a streaming
// one gets max_tokens one-token chunks (each flushed, tokenGap apart) and
// a usage chunk. It serves /health, /v1/models and an empty /metrics, so
// a kvmesh router takes it as a healthy replica. It is the upstream of
// the router-overhead benchmark: whatever time or CPU a front end adds on
// top of it is the front end's.
func InstantReplica(model string, tokenGap time.Duration) http.Handler {
	models := fmt.Sprintf(`{"object":"list","data":[{"id":%q,"object":"model","owned_by":"bench"}]}`, model)
	completion := []byte(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":2048,"completion_tokens":1,"total_tokens":2049,"prompt_tokens_details":{"cached_tokens":0}}}`, model))
	chunk := []byte(fmt.Sprintf(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{"content":" tok"},"logprobs":null,"finish_reason":null}]}`+"\n\n", model))
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, models)
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		var req struct {
			Stream    bool `json:"stream"`
			MaxTokens int  `json:"max_tokens"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(completion)))
			_, _ = w.Write(completion)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range max(req.MaxTokens, 1) {
			if i > 0 && tokenGap > 0 {
				time.Sleep(tokenGap)
			}
			if _, err := w.Write(chunk); err != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
		fmt.Fprintf(w, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":%q,\"choices\":[],\"usage\":{\"prompt_tokens\":2048,\"completion_tokens\":%d,\"total_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n", model, req.MaxTokens, 2048+req.MaxTokens)
	})
	return mux
}

// Target is one front end of the overhead benchmark.
type Target struct {
	Name string
	URL  string // base URL
	PID  int    // process whose CPU time is measured over the streams; 0: not measured
}

// OverheadConfig says what the overhead benchmark measures.
type OverheadConfig struct {
	Direct            string        // base URL of the instant replica itself
	Targets           []Target      // front ends in front of it
	Model             string        // model name
	BodyBytes         int           // request body size, default 8192
	Concurrency       []int         // closed-loop clients per step, default 16 and 1
	Round             time.Duration // one target at one concurrency, default 3 s
	Rounds            int           // interleaved rounds, default 3
	Streams           int           // streams per target for the CPU step, default 200 (0: skip with Streams < 0)
	StreamTokens      int           // tokens per stream, default 1000
	StreamConcurrency int           // streams in flight, default 16
	Progress          io.Writer     // nil: none
}

// OverheadRow is one target at one concurrency.
type OverheadRow struct {
	Name        string    `json:"name"`
	Concurrency int       `json:"concurrency"`
	RPS         float64   `json:"rps"` // median over rounds
	RPSRounds   []float64 `json:"rps_rounds"`
	P50Ms       float64   `json:"p50_ms"`
	P99Ms       float64   `json:"p99_ms"`
	AddedP50Ms  float64   `json:"added_p50_ms"` // minus the direct call's, same concurrency
	AddedP99Ms  float64   `json:"added_p99_ms"`
	Errors      int       `json:"errors"`
	// CPUUsPerReq is the target's process CPU (user + system) over all
	// its rounds at this concurrency, per completed request; 0 when its
	// PID is not known. On a shared machine it is steadier than req/s,
	// which also moves with what the other processes leave.
	CPUUsPerReq float64 `json:"cpu_us_per_request,omitempty"`
}

// StreamCPU is one target's process CPU over the stream step.
type StreamCPU struct {
	Name          string  `json:"name"`
	Streams       int     `json:"streams"`
	Errors        int     `json:"errors"`
	CPUMsPerStrm  float64 `json:"cpu_ms_per_stream"`
	WallSeconds   float64 `json:"wall_seconds"`
	TokensPerStrm int     `json:"tokens_per_stream"`
}

// OverheadResult is the whole benchmark.
type OverheadResult struct {
	Rows    []OverheadRow `json:"rows"`
	Streams []StreamCPU   `json:"streams"`
}

func (c *OverheadConfig) defaults() {
	if c.BodyBytes <= 0 {
		c.BodyBytes = 8192
	}
	if len(c.Concurrency) == 0 {
		c.Concurrency = []int{16, 1}
	}
	if c.Round <= 0 {
		c.Round = 3 * time.Second
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.Streams == 0 {
		c.Streams = 200
	}
	if c.StreamTokens <= 0 {
		c.StreamTokens = 1000
	}
	if c.StreamConcurrency <= 0 {
		c.StreamConcurrency = 16
	}
}

// RunOverhead measures requests per second and latency through each
// target and straight to the replica, interleaved round by round so that
// all see the same machine, then each target's process CPU per relayed
// stream.
func RunOverhead(ctx context.Context, cfg OverheadConfig) (OverheadResult, error) {
	cfg.defaults()
	var res OverheadResult
	if cfg.Direct == "" || len(cfg.Targets) == 0 {
		return res, errors.New("bench: overhead needs the direct replica URL and at least one target")
	}
	all := append([]Target{{Name: "direct", URL: cfg.Direct}}, cfg.Targets...)
	clients := make([]*http.Client, len(all))
	for i := range all {
		clients[i] = overheadClient(64)
	}
	type acc struct {
		rps  []float64
		lat  []float64
		errs int
		cpu  time.Duration
	}
	accs := make(map[[2]int]*acc) // [target, concurrency index]
	var seq atomic.Int64
	for r := range cfg.Rounds {
		for ci, c := range cfg.Concurrency {
			for k := range all {
				i := (k + r) % len(all) // rotate who goes first
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				var cpu0 time.Duration
				if all[i].PID > 0 {
					var err error
					if cpu0, err = ProcessCPU(all[i].PID); err != nil {
						return res, err
					}
				}
				rps, lat, errs := closedLoop(ctx, clients[i], all[i].URL, cfg, c, &seq)
				a := accs[[2]int{i, ci}]
				if a == nil {
					a = &acc{}
					accs[[2]int{i, ci}] = a
				}
				if all[i].PID > 0 {
					cpu1, err := ProcessCPU(all[i].PID)
					if err != nil {
						return res, err
					}
					a.cpu += cpu1 - cpu0
				}
				a.rps = append(a.rps, rps)
				a.lat = append(a.lat, lat...)
				a.errs += errs
				if cfg.Progress != nil {
					fmt.Fprintf(cfg.Progress, "round %d/%d  c=%-3d %-13s %8.0f req/s\n", r+1, cfg.Rounds, c, all[i].Name, rps)
				}
			}
		}
	}
	for ci, c := range cfg.Concurrency {
		d := accs[[2]int{0, ci}]
		slices.Sort(d.lat)
		dp50, dp99 := percentile(d.lat, 0.5), percentile(d.lat, 0.99)
		for i, t := range all {
			a := accs[[2]int{i, ci}]
			slices.Sort(a.lat)
			rs := slices.Clone(a.rps)
			slices.Sort(rs)
			row := OverheadRow{Name: t.Name, Concurrency: c, RPS: rs[len(rs)/2], RPSRounds: a.rps,
				P50Ms: percentile(a.lat, 0.5), P99Ms: percentile(a.lat, 0.99), Errors: a.errs}
			row.AddedP50Ms, row.AddedP99Ms = row.P50Ms-dp50, row.P99Ms-dp99
			if t.PID > 0 && len(a.lat) > 0 {
				row.CPUUsPerReq = float64(a.cpu) / float64(time.Microsecond) / float64(len(a.lat))
			}
			res.Rows = append(res.Rows, row)
		}
	}
	if cfg.Streams > 0 {
		// The streams run in rounds too, each target's share of a round
		// back to back with the others' and the order rotated, so a
		// change in the machine's load falls on every target alike
		// instead of on whichever ran last.
		res.Streams = make([]StreamCPU, len(cfg.Targets))
		rounds := max(min(cfg.Rounds, cfg.Streams), 1)
		for r := range rounds {
			n := cfg.Streams / rounds
			if r < cfg.Streams%rounds {
				n++
			}
			for k := range cfg.Targets {
				i := (k + r) % len(cfg.Targets)
				if ctx.Err() != nil {
					return res, ctx.Err()
				}
				s, err := streamCPU(ctx, overheadClient(cfg.StreamConcurrency), cfg.Targets[i], n, cfg)
				if err != nil {
					return res, err
				}
				res.Streams[i].add(s)
			}
		}
		for _, s := range res.Streams {
			if cfg.Progress != nil {
				fmt.Fprintf(cfg.Progress, "streams %-13s %.2f ms CPU per %d-token stream\n", s.Name, s.CPUMsPerStrm, s.TokensPerStrm)
			}
		}
	}
	return res, nil
}

func overheadClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: conns,
		DisableCompression:  true,
	}}
}

// overheadBody is a chat request of about size bytes whose prompt starts
// with n, so that every request carries a new prompt.
func overheadBody(model string, n int64, size int, stream bool, maxTokens int) []byte {
	const filler = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
	head := fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":%v,"messages":[{"role":"user","content":"%016d `, model, maxTokens, stream, n)
	tail := `"}]}`
	var b bytes.Buffer
	b.Grow(size)
	b.WriteString(head)
	for b.Len()+len(tail) < size {
		b.WriteString(filler[:min(len(filler), size-len(tail)-b.Len())])
	}
	b.WriteString(tail)
	return b.Bytes()
}

// closedLoop runs c clients against url for cfg.Round and returns the
// completed requests per second and their latencies in ms.
func closedLoop(ctx context.Context, client *http.Client, base string, cfg OverheadConfig, c int, seq *atomic.Int64) (float64, []float64, int) {
	url := strings.TrimRight(base, "/") + "/v1/chat/completions"
	ctx, cancel := context.WithTimeout(ctx, cfg.Round)
	defer cancel()
	var mu sync.Mutex
	var lat []float64
	errs := 0
	var wg sync.WaitGroup
	start := time.Now()
	for range c {
		wg.Go(func() {
			var mine []float64
			bad := 0
			for ctx.Err() == nil {
				body := overheadBody(cfg.Model, seq.Add(1), cfg.BodyBytes, false, 1)
				t0 := time.Now()
				if !post(ctx, client, url, body) {
					if ctx.Err() == nil {
						bad++
					}
					continue
				}
				mine = append(mine, float64(time.Since(t0))/float64(time.Millisecond))
			}
			mu.Lock()
			lat = append(lat, mine...)
			errs += bad
			mu.Unlock()
		})
	}
	wg.Wait()
	return float64(len(lat)) / time.Since(start).Seconds(), lat, errs
}

// post sends one request and reads the whole answer; false on any error.
func post(ctx context.Context, client *http.Client, url string, body []byte) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err == nil && resp.StatusCode == http.StatusOK
}

// streamCPU relays cfg.Streams streams through t and reads t's process
// CPU time (utime + stime) before and after.
func streamCPU(ctx context.Context, client *http.Client, t Target, streams int, cfg OverheadConfig) (StreamCPU, error) {
	s := StreamCPU{Name: t.Name, TokensPerStrm: cfg.StreamTokens}
	url := strings.TrimRight(t.URL, "/") + "/v1/chat/completions"
	// Warm the connections first, outside the measurement.
	for range cfg.StreamConcurrency {
		post(ctx, client, url, overheadBody(cfg.Model, 0, cfg.BodyBytes, true, 4))
	}
	var before time.Duration
	if t.PID > 0 {
		var err error
		if before, err = ProcessCPU(t.PID); err != nil {
			return s, err
		}
	}
	start := time.Now()
	var next atomic.Int64
	var bad atomic.Int64
	var wg sync.WaitGroup
	for range cfg.StreamConcurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				n := next.Add(1)
				if n > int64(streams) {
					return
				}
				if !post(ctx, client, url, overheadBody(cfg.Model, n, cfg.BodyBytes, true, cfg.StreamTokens)) {
					bad.Add(1)
				}
			}
		})
	}
	wg.Wait()
	s.WallSeconds = time.Since(start).Seconds()
	s.Streams = streams
	s.Errors = int(bad.Load())
	if t.PID > 0 {
		after, err := ProcessCPU(t.PID)
		if err != nil {
			return s, err
		}
		s.CPUMsPerStrm = float64(after-before) / float64(time.Millisecond) / float64(streams)
	}
	return s, nil
}

// add folds one round's streams into s: CPU per stream weighted by the
// round's streams, wall time and errors summed.
func (s *StreamCPU) add(r StreamCPU) {
	if total := s.Streams + r.Streams; total > 0 {
		s.CPUMsPerStrm = (s.CPUMsPerStrm*float64(s.Streams) + r.CPUMsPerStrm*float64(r.Streams)) / float64(total)
	}
	s.Name, s.TokensPerStrm = r.Name, r.TokensPerStrm
	s.Streams += r.Streams
	s.Errors += r.Errors
	s.WallSeconds += r.WallSeconds
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times; 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// ProcessCPU returns the user + system CPU time a process (all its
// threads) has used, from /proc/<pid>/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("process cpu: %w", err)
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line; the command name (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStatCPU(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("process cpu: malformed stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, f[11].
	if len(f) < 13 {
		return 0, errors.New("process cpu: short stat")
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("process cpu: bad utime/stime")
	}
	return time.Duration(u+s) * time.Second / clockTicks, nil
}

// WriteOverheadTable prints the rows, the ratios against the target named
// base (requests per second) and the stream CPU.
func WriteOverheadTable(w io.Writer, r OverheadResult, base string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%-13s %4s %10s %8s %9s %9s %10s %10s %6s %11s %8s\n", "front end", "c", "req/s", "vs "+base, "p50 ms", "p99 ms", "added p50", "added p99", "errors",
		"CPU us/req", "vs "+base)
	for _, row := range r.Rows {
		ratio, cpu, cpuRatio := "-", "-", "-"
		if row.CPUUsPerReq > 0 {
			cpu = fmt.Sprintf("%.1f", row.CPUUsPerReq)
		}
		for _, o := range r.Rows {
			if o.Name == base && o.Concurrency == row.Concurrency && o.RPS > 0 {
				ratio = fmt.Sprintf("%.2fx", row.RPS/o.RPS)
			}
			if o.Name == base && o.Concurrency == row.Concurrency && o.CPUUsPerReq > 0 && row.CPUUsPerReq > 0 {
				cpuRatio = fmt.Sprintf("%.2fx", row.CPUUsPerReq/o.CPUUsPerReq)
			}
		}
		fmt.Fprintf(&b, "%-13s %4d %10.0f %8s %9.3f %9.3f %10.3f %10.3f %6d %11s %8s\n", row.Name, row.Concurrency, row.RPS, ratio,
			row.P50Ms, row.P99Ms, row.AddedP50Ms, row.AddedP99Ms, row.Errors, cpu, cpuRatio)
	}
	if len(r.Streams) > 0 {
		fmt.Fprintf(&b, "\n%-13s %8s %7s %14s %8s %8s\n", "front end", "streams", "errors", "CPU ms/stream", "vs "+base, "wall s")
		var baseCPU float64
		for _, s := range r.Streams {
			if s.Name == base {
				baseCPU = s.CPUMsPerStrm
			}
		}
		for _, s := range r.Streams {
			ratio := "-"
			if baseCPU > 0 {
				ratio = fmt.Sprintf("%.2fx", s.CPUMsPerStrm/baseCPU)
			}
			fmt.Fprintf(&b, "%-13s %8d %7d %14.3f %8s %8.1f\n", s.Name, s.Streams, s.Errors, s.CPUMsPerStrm, ratio, s.WallSeconds)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
