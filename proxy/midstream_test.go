package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// sseEvent is one event as an SSE client (the WHATWG algorithm, as
// openai-python's SSEDecoder implements it) dispatches it.
type sseEvent struct {
	event, data string
}

// parseSSE parses a whole stream body: its events, and the bytes after
// the last blank line (a partial event, which a client drops).
func parseSSE(b string) (events []sseEvent, rest string) {
	var ev sseEvent
	var data []string
	has := false
	line, start := 0, 0
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\n' && c != '\r' {
			continue
		}
		l := b[line:i]
		if c == '\r' && i+1 < len(b) && b[i+1] == '\n' {
			i++
		}
		line = i + 1
		if l == "" {
			if has {
				ev.data = strings.Join(data, "\n")
				events = append(events, ev)
			}
			ev, data, has, start = sseEvent{}, nil, false, i+1
			continue
		}
		k, v, _ := strings.Cut(l, ":")
		v = strings.TrimPrefix(v, " ")
		switch k {
		case "event":
			ev.event, has = v, true
		case "data":
			data, has = append(data, v), true
		}
	}
	return events, b[start:]
}

// readCutStream reads a stream the router ended with an error event
// (midstream.go): the body must end cleanly and hold only whole events,
// every one's data JSON, the last and only the last an OpenAI error
// envelope with a message and a type. It returns the data of the events
// before the error and the error object.
func readCutStream(t *testing.T, resp *http.Response) ([]string, map[string]any) {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("the stream did not end cleanly: %v after %q", err, b)
	}
	events, rest := parseSSE(string(b))
	if rest != "" {
		t.Fatalf("the stream ends with a partial event %q (a client reads it as the error event's start)", rest)
	}
	if len(events) == 0 {
		t.Fatalf("no event in %q", b)
	}
	var before []string
	for i, ev := range events {
		var doc map[string]any
		if err := json.Unmarshal([]byte(ev.data), &doc); err != nil {
			t.Fatalf("event %d's data %q is not JSON (a client's parse error): %v", i, ev.data, err)
		}
		e, isErr := doc["error"].(map[string]any)
		if i < len(events)-1 {
			if isErr {
				t.Fatalf("an error event before the last: %q", b)
			}
			before = append(before, ev.data)
			continue
		}
		if !isErr {
			t.Fatalf("the last event is no error event: %q", b)
		}
		if m, _ := e["message"].(string); m == "" {
			t.Errorf("the error has no message: %v", e)
		}
		if typ, _ := e["type"].(string); typ == "" {
			t.Errorf("the error has no type: %v", e)
		}
		return before, e
	}
	panic("unreachable")
}

// midEvent is the first bytes of an event, where a cut falls inside it.
const midEvent = "data: {\"choices\":[{\"index\":0,\"del"

// hijackedStream answers with a chunked SSE head and then hands its
// connection to f, which writes the body's chunks itself (chunk).
func hijackedStream(t *testing.T, f func(c net.Conn, chunk func(string))) *replicaServer {
	return newReplica(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c, bw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		bw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
		bw.Flush()
		f(c, func(s string) {
			fmt.Fprintf(bw, "%x\r\n%s\r\n", len(s), s)
			bw.Flush()
		})
	})
}

func event(i int) string {
	return fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
}

// TestMidStreamFailureEndsWithErrorEvent: a stream whose upstream fails
// after its head ends for the client with the whole events sent before,
// exactly one parseable error event and a clean end, on every relay path
// (the own client with and without the stream loop, net/http); a partial
// event at the failure is never passed on. Each fault in turn: a stall
// past the idle timeout at an event's end and inside one, and a reset at
// an event's end and inside one.
func TestMidStreamFailureEndsWithErrorEvent(t *testing.T) {
	faults := []struct {
		name, tail, cause, code string
		reset                   bool
	}{
		{"stall", "", midstreamIdle, codeUpstreamTimeout, false},
		{"stall_mid_event", midEvent, midstreamIdle, codeUpstreamTimeout, false},
		{"reset", "", midstreamError, codeUpstreamError, true},
		{"reset_mid_event", midEvent, midstreamError, codeUpstreamError, true},
	}
	for _, fault := range faults {
		for _, cl := range idleClients {
			for _, off := range []bool{false, true} {
				if cl.name == "nethttp" && !off {
					continue // net/http's streams never take the loop
				}
				t.Run(fmt.Sprintf("%s/%s/no_loop=%v", fault.name, cl.name, off), func(t *testing.T) {
					gone := make(chan struct{}, 1)
					rep := hijackedStream(t, func(c net.Conn, chunk func(string)) {
						chunk(event(0))
						time.Sleep(5 * time.Millisecond) // two reads, two chunks to the client
						if fault.tail != "" {
							chunk(event(1) + fault.tail) // the next event's start with this one
						} else {
							chunk(event(1))
						}
						if fault.reset {
							time.Sleep(5 * time.Millisecond) // read before the reset
							_ = c.(*net.TCPConn).SetLinger(0)
							return
						}
						// Until the router gives up and closes the connection.
						_, _ = c.Read(make([]byte, 1))
						gone <- struct{}{}
					})
					view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
					p, srv, _ := newTestProxy(t, view, func(c *Config) {
						cl.set(c)
						c.NoStreamLoop = off
						c.UpstreamIdleTimeout = 200 * time.Millisecond
					})
					ctx, cancel := context.WithTimeout(t.Context(), testWait)
					defer cancel()
					resp := post(t, ctx, srv.URL+"/v1/chat/completions", chatBody("m", true, longPrompt))
					if resp.StatusCode != 200 {
						t.Fatalf("status %d", resp.StatusCode)
					}
					before, e := readCutStream(t, resp)
					if len(before) != 2 || !strings.Contains(before[0], `"t0"`) || !strings.Contains(before[1], `"t1"`) {
						t.Errorf("events before the error %q, want t0 and t1", before)
					}
					if e["code"] != fault.code || e["type"] != "server_error" {
						t.Errorf("error %v, want code %s, type server_error", e, fault.code)
					}
					if !fault.reset {
						recv(t, gone, "the replica's connection closed")
					}
					waitFor(t, "the failure counted", func() bool {
						return testutil.ToFloat64(p.m.midstream.WithLabelValues(fault.cause, endErrorEvent)) == 1
					})
					if got := testutil.ToFloat64(p.m.midstream.WithLabelValues(fault.cause, endAborted)); got != 0 {
						t.Errorf("aborted %v, want 0", got)
					}
					view.waitDone(t)
					requireReleased(t, p, rep.URL)
					if len(view.recorded(rep.URL)) != 1 {
						t.Errorf("records %d, want the prompt's only (nothing of a cut answer)", len(view.recorded(rep.URL)))
					}
					if loop := testutil.ToFloat64(p.m.loopStreams); cl.name == "own" && !off && runtime.GOOS == "linux" && loop != 1 {
						t.Errorf("loop streams %v, want 1 (the stream loop untested)", loop)
					}
				})
			}
		}
	}
}

// TestMidStreamFailureAbortsOtherBodies: a response that is not an SSE
// stream the router frames (JSON, chunked or with a Content-Length; an
// SSE body with a Content-Length, which cannot be extended) still ends
// with a broken connection when its upstream fails mid-body: a truncated
// document must not look complete.
func TestMidStreamFailureAbortsOtherBodies(t *testing.T) {
	for _, tc := range []struct {
		name, ctype string
		length      bool
	}{
		{"json_chunked", "application/json", false},
		{"json_length", "application/json", true},
		{"sse_length", "text/event-stream", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				c, bw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				part := event(0)
				if tc.length {
					fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", tc.ctype, 10*len(part), part)
				} else {
					fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", tc.ctype, len(part), part)
				}
				bw.Flush()
				time.Sleep(5 * time.Millisecond)
				_ = c.(*net.TCPConn).SetLinger(0)
			})
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
			p, srv, _ := newTestProxy(t, view, nil)
			// The head of a body not flushed may never leave the
			// router: then the request fails, and that is a broken
			// connection too.
			resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", tc.ctype != "application/json", longPrompt)))
			var b []byte
			if err == nil {
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if err == nil {
				t.Fatalf("the cut body ended as if whole: %q", b)
			}
			if strings.Contains(string(b), `"error"`) {
				t.Errorf("an error event in a body that is not a framed stream: %q", b)
			}
			waitFor(t, "the failure counted", func() bool {
				return testutil.ToFloat64(p.m.midstream.WithLabelValues(midstreamError, endAborted)) == 1
			})
			view.waitDone(t)
		})
	}
}

// TestStreamErrorEventShapes: the error event of each API parses as its
// clients read it: OpenAI's envelope (an "error" object, which the SDKs
// raise as APIError) for chat and completions, the Responses API's error
// event and Anthropic's.
func TestStreamErrorEventShapes(t *testing.T) {
	for _, tc := range []struct{ path, event, want string }{
		{"/v1/chat/completions", "", `{"error":{"message":"m","type":"server_error","param":null,"code":"c"}}`},
		{"/v1/completions", "", `{"error":{"message":"m","type":"server_error","param":null,"code":"c"}}`},
		{"/v1/responses", "error", `{"type":"error","code":"c","message":"m","param":null}`},
		{"/v1/messages", "error", `{"type":"error","error":{"type":"api_error","message":"m"}}`},
	} {
		b := streamErrorEvent(tc.path, "c", "m")
		events, rest := parseSSE(string(b))
		if len(events) != 1 || rest != "" || events[0].event != tc.event || events[0].data != tc.want {
			t.Errorf("%s: %q parses as %+v (rest %q), want event %q data %s", tc.path, b, events, rest, tc.event, tc.want)
		}
		if !json.Valid([]byte(events[0].data)) {
			t.Errorf("%s: data is not JSON", tc.path)
		}
	}
}

// TestMidStreamFailureOtherAPIs: a cut Responses or Messages stream ends
// with that API's own error event (event: error) and a clean end; the
// id of a cut response is not remembered for previous_response_id.
func TestMidStreamFailureOtherAPIs(t *testing.T) {
	for _, tc := range []struct{ path, body, first, want string }{
		{"/v1/responses", fmt.Sprintf(`{"model":"m","input":%q,"stream":true}`, longPrompt),
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_cut\",\"status\":\"in_progress\"}}\n\n",
			`{"type":"error","code":"upstream_timeout","message":"`},
		{"/v1/messages", fmt.Sprintf(`{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":%q}]}`, longPrompt),
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_cut\"}}\n\n",
			`{"type":"error","error":{"type":"api_error","message":"`},
	} {
		t.Run(tc.path, func(t *testing.T) {
			rep := newReplica(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, tc.first+tc.first[:20]) // an event, and the start of the next
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			view := newFakeView([]string{"m"}, fakeReplica{id: rep.URL})
			p, srv, _ := newTestProxy(t, view, func(c *Config) { c.UpstreamIdleTimeout = 100 * time.Millisecond })
			resp := post(t, t.Context(), srv.URL+tc.path, tc.body)
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("the stream did not end cleanly: %v after %q", err, b)
			}
			events, rest := parseSSE(string(b))
			if len(events) != 2 || rest != "" || string(b[:len(tc.first)]) != tc.first {
				t.Fatalf("got %q, want the first event, then the error event alone", b)
			}
			if e := events[1]; e.event != "error" || !strings.HasPrefix(e.data, tc.want) || !json.Valid([]byte(e.data)) {
				t.Errorf("error event %+v, want event: error with data %s...", e, tc.want)
			}
			view.waitDone(t)
			waitCounted(t, p, strings.TrimPrefix(tc.path, "/v1/"), 1)
			if n := p.responses.len(); n != 0 {
				t.Errorf("%d response ids remembered, want none of a cut stream", n)
			}
		})
	}
}
