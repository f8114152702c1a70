package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the command and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRunReplicaSimServesAndStops(t *testing.T) {
	t.Setenv("KVMESH_MODEL", "env-model")
	t.Setenv("KVMESH_TIME_SCALE", "1000")
	t.Setenv("KVMESH_LORA_ADAPTERS", "sql-lora,chat-lora")
	t.Setenv("KVMESH_LISTEN", "127.0.0.1:1") // the flag below wins
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runReplicaSim(ctx, []string{"--listen", "127.0.0.1:0", "--log-level", "warn"}, &stdout, &stderr)
	}()
	var base string
	for range 2000 {
		if _, after, ok := strings.Cut(stdout.String(), "listening on "); ok {
			base = strings.TrimSpace(after)
			break
		}
		select {
		case err := <-done:
			t.Fatalf("exited early: %v; stderr: %s", err, stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
	if base == "" {
		t.Fatal("no listening line")
	}
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"id":"env-model"`) {
		t.Errorf("models = %s, want the model from KVMESH_MODEL", body)
	}
	if !strings.Contains(string(body), `"id":"chat-lora"`) || !strings.Contains(string(body), `"parent":"env-model"`) {
		t.Errorf("models = %s, want the adapters of KVMESH_LORA_ADAPTERS with their parent", body)
	}
	resp, err = http.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"env-model","prompt":"hello","max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("completion status = %d", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run returned %v after cancel", err)
	}
}

func TestRunReplicaSimFlagErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"help", []string{"--help"}, nil, "KVMESH_<FLAG>"},
		{"bad level", []string{"--log-level", "loud"}, nil, "invalid --log-level"},
		{"bad env", nil, map[string]string{"KVMESH_KV_BLOCKS": "many"}, "KVMESH_KV_BLOCKS"},
		{"bad config", []string{"--time-scale", "-1"}, nil, "time scale"},
		{"extra args", []string{"extra"}, nil, "unexpected arguments"},
		{"adapter named as the model", []string{"--lora-adapters", "kvmesh-sim"}, nil, "LoRA adapter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stdout, stderr syncBuffer
			err := runReplicaSim(context.Background(), tc.args, &stdout, &stderr)
			if err == nil {
				t.Fatal("want an error")
			}
			if tc.name == "help" {
				if !errors.Is(err, flag.ErrHelp) || !strings.Contains(stderr.String(), tc.want) ||
					!strings.Contains(stderr.String(), "-prefill-tokens-per-s") {
					t.Errorf("help: err %v, output %s", err, stderr.String())
				}
				return
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}
