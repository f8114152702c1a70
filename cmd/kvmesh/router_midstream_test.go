package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/summary"
)

// stallingReplica is a fake OpenAI replica whose streams send two events
// and then nothing, until their request ends (the router closed the
// connection) or release is closed.
func stallingReplica(release <-chan struct{}) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/models":
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m"}]}`)
		case "/metrics":
			fmt.Fprint(w, "# no vllm metrics\n")
		case "/v1/chat/completions":
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 2 {
				fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", i)
				w.(http.Flusher).Flush()
			}
			select {
			case <-r.Context().Done():
			case <-release:
			}
		default:
			http.NotFound(w, r)
		}
	}))
}

// TestEndToEndStalledStreamThroughHop: a stream whose replica stalls
// mid-body behind its owner router, sent by a client to the other router
// (which forwards it over a real hop), ends for the client with the
// events sent before, one error event and a clean end, within a bound
// derived from the idle timeout: the owner's timeout cuts it (the entry's
// hop waits hopIdleSlack longer), and the error event crosses the hop.
func TestEndToEndStalledStreamThroughHop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	release := make(chan struct{})
	rep := stallingReplica(release)
	defer rep.Close()
	defer close(release) // before rep.Close: it waits for the handlers

	const idle = 300 * time.Millisecond
	logs := &lockedWriter{}
	base := routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
		upstreamIdleTimeout: idle,
	}
	co := base
	co.name, co.replicas = "owner", []string{rep.URL}
	owner, err := startRouter(ctx, co)
	if err != nil {
		t.Fatal(err)
	}
	ce := base
	ce.name, ce.join = "entry", []string{owner.mesh.GossipAddr()}
	entry, err := startRouter(ctx, ce)
	if err != nil {
		owner.shutdown()
		t.Fatal(err)
	}
	defer func() {
		for _, r := range []*router{entry, owner} {
			if err := r.shutdown(); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	eventually(t, "the entry to see the owner's replica", func() bool {
		return len(entry.mesh.Candidates("m", nil)) == 1 && entry.health.Ready()
	})

	client := &http.Client{Transport: &http.Transport{}, Timeout: time.Minute}
	defer client.CloseIdleConnections()
	resp, err := client.Post(entry.api+"/v1/chat/completions", "application/json", strings.NewReader(chatRequest("Tell me a story.")))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var datas []string
	var stalled time.Time // when the client had the last event before the stall
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			datas = append(datas, d)
			if len(datas) == 2 {
				stalled = time.Now()
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("the stream did not end cleanly: %v after %q", err, datas)
	}
	took := time.Since(stalled)
	if len(datas) != 3 {
		t.Fatalf("events %q, want 2 then the error", datas)
	}
	var e struct {
		Error struct{ Message, Type, Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(datas[2]), &e); err != nil || e.Error.Code != "upstream_timeout" || e.Error.Message == "" {
		t.Fatalf("last event %q (%v), want an upstream_timeout error", datas[2], err)
	}
	// A liveness bound with the slack of a loaded machine, derived from
	// the timeout: the owner cuts at the timeout after its last read, the
	// entry at most hopIdleSlack later; without the cut the stream would
	// hang until the client's timeout.
	if bound := idle + time.Second + 5*time.Second; took > bound {
		t.Errorf("the stream ended %v after it stalled, over %v", took, bound)
	}
	if got := counter(t, owner, "kvmesh_upstream_midstream_failures_total", ""); got != 1 {
		t.Errorf("the owner counted %v mid-stream failures, want 1 (its own timeout cut the stream)", got)
	}
	if got := counter(t, entry, "kvmesh_upstream_midstream_failures_total", ""); got != 0 {
		t.Errorf("the entry counted %v mid-stream failures, want 0 (the owner's error event crossed the hop)", got)
	}
	// The client's request is counted once, at the entry; the owner
	// counts the hop.
	for _, c := range []struct {
		r           *router
		client, hop float64
	}{{entry, 1, 0}, {owner, 0, 1}} {
		if got := counter(t, c.r, "kvmesh_requests_total", ""); got != c.client {
			t.Errorf("%s counted %v client requests, want %v", c.r.name, got, c.client)
		}
		if got := counter(t, c.r, "kvmesh_hop_requests_total", ""); got != c.hop {
			t.Errorf("%s counted %v hops, want %v", c.r.name, got, c.hop)
		}
	}
	t.Logf("ended %v after the stall (idle timeout %v)", took.Round(time.Millisecond), idle)
}
