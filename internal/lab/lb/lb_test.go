package lb

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/deadaddr"
)

func quiet() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: io.Discard})
}

// namedBackend answers every request with its name.
func namedBackend(t *testing.T, name string) *httptest.Server {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, name)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func front(t *testing.T, policy string, backends ...string) *httptest.Server {
	ts, _ := frontB(t, policy, backends...)
	return ts
}

func frontB(t *testing.T, policy string, backends ...string) (*httptest.Server, *balancer) {
	t.Helper()
	h, err := New(policy, backends, quiet())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts, h.(*balancer)
}

// idle waits until no request is in flight at b: a client can read the
// last byte of a response before the proxy's handler has returned.
func idle(t *testing.T, b *balancer) {
	t.Helper()
	for range 2000 {
		b.mu.Lock()
		busy := 0
		for _, n := range b.inflight {
			busy += n
		}
		b.mu.Unlock()
		if busy == 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("requests stayed in flight")
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestPolicies(t *testing.T) {
	cases := []struct {
		policy string
		want   string // sequential requests, nothing in flight between them
	}{
		{RoundRobin, "abcabc"},
		{LeastConnections, "aaaaaa"}, // ties go to the first backend
	}
	for _, tc := range cases {
		t.Run(tc.policy, func(t *testing.T) {
			f, b := frontB(t, tc.policy, namedBackend(t, "a").URL, namedBackend(t, "b").URL, namedBackend(t, "c").URL)
			var got strings.Builder
			for range len(tc.want) {
				idle(t, b)
				_, body := get(t, f.URL+"/v1/models")
				got.WriteString(body)
			}
			if got.String() != tc.want {
				t.Errorf("backends = %q, want %q", got.String(), tc.want)
			}
		})
	}
}

func TestLeastConnectionsAvoidsBusyBackend(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(started)
			<-release
		}
		_, _ = io.WriteString(w, "a")
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	f, b := frontB(t, LeastConnections, slow.URL, namedBackend(t, "b").URL)
	slowDone := make(chan string, 1)
	go func() {
		resp, err := http.Get(f.URL + "/slow")
		if err != nil {
			slowDone <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		slowDone <- string(b)
	}()
	<-started
	for i := range 3 {
		// Wait for the previous fast request to leave b, so b's count is 0
		// against a's 1; otherwise the tie rule would decide.
		for range 2000 {
			b.mu.Lock()
			n := b.inflight[1]
			b.mu.Unlock()
			if n == 0 {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if _, body := get(t, f.URL+"/fast"); body != "b" {
			t.Errorf("request %d went to %q while a holds a slow request, want b", i, body)
		}
	}
	close(release)
	if got := <-slowDone; got != "a" {
		t.Errorf("slow request got %q", got)
	}
	idle(t, b)
	if _, body := get(t, f.URL+"/fast"); body != "a" {
		t.Errorf("after the slow request ended, got %q, want a (tie goes first)", body)
	}
}

func TestStreamingPassesThrough(t *testing.T) {
	for _, policy := range []string{RoundRobin, LeastConnections} {
		t.Run(policy, func(t *testing.T) {
			release := make(chan struct{})
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "data: {\"n\":1}\n\n")
				http.NewResponseController(w).Flush()
				<-release // the upstream is not finished until the client saw chunk 1
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
			}))
			t.Cleanup(up.Close)
			f := front(t, policy, up.URL)
			resp, err := http.Post(f.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
			if err != nil {
				close(release)
				t.Fatal(err)
			}
			defer resp.Body.Close()
			first := make(chan string, 1)
			br := bufio.NewReader(resp.Body)
			go func() {
				line, _ := br.ReadString('\n')
				first <- line
			}()
			select {
			case line := <-first:
				if line != "data: {\"n\":1}\n" {
					t.Errorf("first line = %q", line)
				}
			case <-time.After(30 * time.Second): // a hang guard, not a speed target
				t.Error("first chunk was buffered until the upstream finished")
			}
			close(release)
			rest, _ := io.ReadAll(br)
			if !strings.Contains(string(rest), "[DONE]") {
				t.Errorf("rest = %q", rest)
			}
		})
	}
}

func TestDeadBackend502(t *testing.T) {
	// Refused for the whole test (a listener closed at once may have its
	// port given to the front itself).
	dead := "http://" + deadaddr.Addr(t)
	f := front(t, RoundRobin, dead)
	status, body := get(t, f.URL+"/v1/models")
	if status != http.StatusBadGateway {
		t.Errorf("status = %d, want 502", status)
	}
	var e struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if e.Error["type"] != "server_error" || e.Error["message"] == "" || e.Error["param"] != nil || e.Error["code"] != nil {
		t.Errorf("error = %v", e.Error)
	}
}

func TestNewRejects(t *testing.T) {
	cases := []struct {
		name     string
		policy   string
		backends []string
	}{
		{"no backends", RoundRobin, nil},
		{"unknown policy", "random", []string{"http://127.0.0.1:1"}},
		{"no scheme", RoundRobin, []string{"127.0.0.1:8000"}},
		{"bad url", LeastConnections, []string{"http://[::1"}},
	}
	for _, tc := range cases {
		if _, err := New(tc.policy, tc.backends, nil); err == nil {
			t.Errorf("%s: want an error", tc.name)
		}
	}
}
