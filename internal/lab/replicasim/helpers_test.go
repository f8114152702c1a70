package replicasim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fast is a time scale that makes modelled durations negligible in tests.
const fast = 1e6

type harness struct {
	t   *testing.T
	s   *Server
	ts  *httptest.Server
	reg *prometheus.Registry
	c   *http.Client
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	logger := hclog.New(&hclog.LoggerOptions{Name: "replicasim", Level: hclog.Warn, Output: io.Discard})
	s, err := New(cfg, logger, reg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(s.Handler())
	tr := &http.Transport{}
	h := &harness{t: t, s: s, ts: ts, reg: reg, c: &http.Client{Transport: tr}}
	// Cleanups run last-first: end sequences, then the server, then the client.
	t.Cleanup(tr.CloseIdleConnections)
	t.Cleanup(ts.Close)
	t.Cleanup(func() { _ = s.Close() })
	return h
}

// post sends body to path and returns the response (caller closes it).
func (h *harness) post(ctx context.Context, path string, body any) *http.Response {
	h.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case string:
		r = strings.NewReader(b)
	case io.Reader:
		r = b
	default:
		js, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		r = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.ts.URL+path, r)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.c.Do(req)
	if err != nil {
		h.t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// result is what a test needs from a completion, streamed or not.
type result struct {
	Text   string
	Usage  *usage
	Events []map[string]any // streaming only, without [DONE]
	Done   bool             // streaming saw [DONE]
}

// generate runs one request to completion and decodes either form.
func (h *harness) generate(path string, body map[string]any) result {
	h.t.Helper()
	resp := h.post(context.Background(), path, body)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		h.t.Fatalf("POST %s: status %d: %s", path, resp.StatusCode, b)
	}
	if stream, _ := body["stream"].(bool); stream {
		return readStream(h.t, resp.Body)
	}
	var out struct {
		Choices []struct {
			Text    string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage *usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		h.t.Fatalf("decode: %v", err)
	}
	if len(out.Choices) != 1 || out.Choices[0].FinishReason != "length" {
		h.t.Fatalf("choices = %+v, want one with finish_reason length", out.Choices)
	}
	return result{Text: out.Choices[0].Text + out.Choices[0].Message.Content, Usage: out.Usage}
}

func readStream(t *testing.T, r io.Reader) result {
	t.Helper()
	var res result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		if data == "[DONE]" {
			res.Done = true
			continue
		}
		if res.Done {
			t.Fatalf("event after [DONE]: %s", data)
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		res.Events = append(res.Events, ev)
		if u, ok := ev["usage"]; ok && u != nil {
			b, _ := json.Marshal(u)
			res.Usage = new(usage)
			_ = json.Unmarshal(b, res.Usage)
		}
		choices, _ := ev["choices"].([]any)
		for _, c := range choices {
			cm := c.(map[string]any)
			if txt, ok := cm["text"].(string); ok {
				res.Text += txt
			}
			if d, ok := cm["delta"].(map[string]any); ok {
				if txt, ok := d["content"].(string); ok {
					res.Text += txt
				}
			}
		}
	}
	if err := sc.Err(); err != nil && !res.Done {
		// A cut stream is reported through Done == false.
		t.Logf("stream read: %v", err)
	}
	return res
}

// metric returns the value of a gauge or counter family (first series).
func (h *harness) metric(name string) float64 {
	h.t.Helper()
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		m := mf.GetMetric()[0]
		switch mf.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	h.t.Fatalf("metric %s not found", name)
	return 0
}

// eventually polls cond in a bounded loop; it guards against hangs, it does
// not measure speed, so the bound is generous.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// longSystem is a system prompt of many blocks.
var longSystem = strings.Repeat("You are a careful assistant who answers briefly. ", 40)
