//go:build unix

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
)

// asKvmesh, set to 1 in a child's environment, makes the test binary the
// kvmesh command: the shutdown tests send real signals to real processes.
const asKvmesh = "KVMESH_TEST_RUN_AS_KVMESH"

// TestMain runs the kvmesh command in a child started with asKvmesh, and
// the tests otherwise.
func TestMain(m *testing.M) {
	if os.Getenv(asKvmesh) == "1" {
		main() // exits 2 on an error
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// childRouter is a `kvmesh router` process.
type childRouter struct {
	name   string
	cmd    *exec.Cmd
	logs   *lockedWriter
	api    string // http://127.0.0.1:port, once it serves
	gossip string
	done   chan struct{} // closed when the process has exited
	err    error         // cmd.Wait's, after done
	exited time.Time
}

// fatalLine is main's report of the error the command returned.
var fatalLine = regexp.MustCompile(`(?m)^kvmesh: `)

var servingLine = regexp.MustCompile(`router serving: .*listen=(127\.0\.0\.1:\d+) .*gossip=(127\.0\.0\.1:\d+)`)

// startChildRouter starts the test binary as `kvmesh router args...` on
// 127.0.0.1 and waits until it serves.
func startChildRouter(t *testing.T, name string, args ...string) *childRouter {
	t.Helper()
	c := &childRouter{name: name, logs: &lockedWriter{}, done: make(chan struct{})}
	args = append([]string{"router", "--name", name, "--listen", "127.0.0.1:0", "--gossip-bind", "127.0.0.1:0",
		"--admin-listen", "", "--gossip-profile", "test", "--health-interval", "100ms", "--log-level", "info"}, args...)
	c.cmd = exec.Command(os.Args[0], args...)
	env := []string{asKvmesh + "=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVMESH_") {
			env = append(env, kv)
		}
	}
	c.cmd.Env = env
	c.cmd.Stdout, c.cmd.Stderr = io.Discard, c.logs
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		c.exited = time.Now()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("--- log of %s ---\n%s", name, c.logs.String())
		}
	})
	for i := 0; ; i++ {
		if m := servingLine.FindStringSubmatch(c.logs.String()); m != nil {
			c.api, c.gossip = "http://"+m[1], m[2]
			return c
		}
		select {
		case <-c.done:
			t.Fatalf("%s exited before serving: %v\n%s", name, c.err, c.logs.String())
		default:
		}
		if i == 3000 { // 60 s: a liveness bound
			t.Fatalf("%s never served:\n%s", name, c.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSIGTERMAllRoutersAtOnce is issue 24's "shutdown that orchestrators
// read as success": three routers (one owning a replica, two joined to
// it, whose requests hop to it) get SIGTERM at the same moment, idle or
// with a stream in flight at each. Every router must exit 0 within its
// drain timeout, and every stream must end complete ([DONE]). Before,
// a router whose peers all left while it broadcast its own leave waited
// two seconds for the broadcast and exited 2.
func TestSIGTERMAllRoutersAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts router processes")
	}
	// Generous for a loaded 2-core machine: the only time bound asserted.
	const drain = 30 * time.Second
	key := writeFile(t, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n") // 32 bytes, base64
	for _, streams := range []bool{false, true} {
		name := "idle"
		if streams {
			name = "a stream in flight at each router"
		}
		t.Run(name, func(t *testing.T) {
			// 120 tokens at 40 ms: a stream of about 5 s, still running
			// when the signals come, well within the drain timeout.
			sim := startCountingSim(t, "s1", replicasim.Config{Model: simModel, DecodeMsPerToken: 40, MaxNumSeqs: 8})
			defer sim.close()
			common := []string{"--gossip-key-file", key, "--drain-timeout", drain.String()}
			r1 := startChildRouter(t, "r1", append([]string{"--replica", sim.srv.URL}, common...)...)
			r2 := startChildRouter(t, "r2", append([]string{"--join", r1.gossip}, common...)...)
			r3 := startChildRouter(t, "r3", append([]string{"--join", r1.gossip}, common...)...)
			routers := []*childRouter{r1, r2, r3}
			client := &http.Client{Transport: &http.Transport{}}
			defer client.CloseIdleConnections()
			for _, r := range routers {
				// Ready: r2 and r3 see r1's replica healthy, by gossip.
				eventually(t, r.name+" ready", func() bool {
					resp, err := client.Get(r.api + "/readyz")
					if err != nil {
						return false
					}
					resp.Body.Close()
					return resp.StatusCode == http.StatusOK
				})
			}

			type result struct {
				router, body string
				err          error
			}
			results := make(chan result, len(routers))
			var wg sync.WaitGroup
			if streams {
				ctx, cancel := context.WithTimeout(context.Background(), 2*drain)
				defer cancel()
				started := make(chan string, len(routers))
				for _, r := range routers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						body, err := streamThrough(ctx, client, r.api, started)
						results <- result{r.name, body, err}
					}()
				}
				// Every stream has its first event before the signals (or
				// failed: its result says so).
				for range routers {
					select {
					case <-started:
					case <-ctx.Done():
						t.Fatal("streams did not start")
					}
				}
			}

			sent := time.Now()
			for _, r := range routers {
				if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			for _, r := range routers {
				select {
				case <-r.done:
				case <-time.After(2 * drain):
					t.Fatalf("%s still running %v after SIGTERM", r.name, 2*drain)
				}
			}
			wg.Wait()
			close(results)
			for _, r := range routers {
				took := r.exited.Sub(sent)
				t.Logf("%s: exit %v, %v after SIGTERM", r.name, r.err, took.Round(time.Millisecond))
				if r.err != nil {
					t.Errorf("%s exited with %v, want status 0", r.name, r.err)
				}
				// The drain timeout, and process teardown on a loaded machine.
				if took > drain+5*time.Second {
					t.Errorf("%s exited %v after SIGTERM, past its drain timeout %v", r.name, took, drain)
				}
				// (memberlist may log errors of its own as its peers close
				// their sockets: not the router's.)
				if l := r.logs.String(); !strings.Contains(l, "router stopped") || strings.Contains(l, "drain timed out") || fatalLine.MatchString(l) {
					t.Errorf("%s did not stop cleanly (no \"router stopped\", a cut drain, or a fatal error)", r.name)
				}
			}
			n := 0
			for res := range results {
				n++
				if res.err != nil {
					t.Errorf("stream at %s: %v\n%s", res.router, res.err, res.body)
				}
			}
			if streams && n != len(routers) {
				t.Errorf("%d streams ended, want %d", n, len(routers))
			}
		})
	}
}

// streamThrough sends one streamed chat request to api, says on started
// when its first event came (or when it failed before), and reads it to
// its end: an error unless it ended with [DONE] and no error event.
func streamThrough(ctx context.Context, client *http.Client, api string, started chan<- string) (string, error) {
	first := true
	defer func() {
		if first {
			started <- api
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/chat/completions",
		strings.NewReader(streamBody("a prompt for a stream that outlives the signal "+api, 120)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return string(b), fmt.Errorf("status %d", resp.StatusCode)
	}
	var body strings.Builder
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		body.WriteString(line)
		if first && strings.HasPrefix(line, "data: ") {
			first = false
			started <- api
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return body.String(), err
		}
	}
	switch s := body.String(); {
	case strings.Contains(s, `"error"`):
		return s, errors.New("the stream ended with an error event")
	case !strings.Contains(s, "data: [DONE]"):
		return s, errors.New("the stream ended without [DONE]")
	}
	return body.String(), nil
}
