package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvmesh/kvmesh/internal/kvevents"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/summary"
)

// removalWatch subscribes beside the router to the engine's own KV-event
// stream. While marking, it keeps the blocks the engine stores (those of
// the one prompt then in flight); it notes the first batch that removes
// one of them: when it arrived here and the engine's timestamp on it.
type removalWatch struct {
	mu       sync.Mutex
	marking  bool
	marked   map[uint64]bool
	arrived  time.Time
	engineTS float64
	removed  int
}

func (w *removalWatch) Batch(b kvevents.Batch) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range b.Events {
		switch {
		case e.Kind == kvevents.BlockStored && w.marking:
			for _, h := range e.Hashes {
				w.marked[h] = true
			}
		case e.Kind == kvevents.BlockRemoved:
			for _, h := range e.Hashes {
				if !w.marked[h] {
					continue
				}
				w.removed++
				if w.arrived.IsZero() {
					w.arrived, w.engineTS = now, b.TS
				}
			}
		}
	}
}

func (w *removalWatch) Lost(string) {}

// mark starts or stops keeping the blocks stored.
func (w *removalWatch) mark(on bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.marking = on
}

// first is the first removal of a marked block (zero time: none yet),
// and how many marked blocks were removed.
func (w *removalWatch) first() (time.Time, float64, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.arrived, w.engineTS, w.removed
}

// markedCount is how many blocks were marked.
func (w *removalWatch) markedCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.marked)
}

// TestKVEventEvictionReachesThePeerOnVLLM is
// TestKVEventEvictionReachesThePeer on a real vLLM server: router a owns
// the server at KVMESH_VLLM_URL with --kv-events auto, router b is joined
// to it. One prompt is cached and both routers' views hold it; other
// prompts make vLLM evict its blocks; b's copy of a's summary must drop
// them. It logs the latency from vLLM's timestamp on the first batch with
// a BlockRemoved (and from its arrival at a subscriber of our own beside
// the router) to b's copy no longer matching the whole prompt.
// internal/lab/e2e/vllm/run.sh's peer phase starts a server whose cache
// holds about one and a half such prompts (--num-gpu-blocks-override 72,
// 32-token blocks) and runs this test repeatedly; without
// KVMESH_VLLM_URL it is skipped. Each run tags its prompts with a fresh
// nonce, so runs against the same server start uncached, and the watch
// times the first removal of the first prompt's own engine blocks.
func TestKVEventEvictionReachesThePeerOnVLLM(t *testing.T) {
	replica := os.Getenv("KVMESH_VLLM_URL")
	if replica == "" {
		t.Skip("KVMESH_VLLM_URL is not set (a real vLLM server with KV events; see internal/lab/e2e/vllm/run.sh)")
	}
	model := os.Getenv("KVMESH_VLLM_MODEL")
	if model == "" {
		model = "tiny-llama"
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	resp, err := http.Get(strings.TrimRight(replica, "/") + "/kv_event_sources")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	src, err := parseSources(body, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	watch := &removalWatch{marked: map[uint64]bool{}}
	sub, err := kvevents.New(kvevents.Config{Endpoint: src.Endpoint, Topic: src.Topic}, watch)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); sub.Run(ctx) }()
	defer wg.Wait()
	defer cancel()

	logs := &lockedWriter{}
	base := routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 200 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
	}
	base.kvEvents.auto = true
	if os.Getenv("KVMESH_TEST_GOSSIP") == "lan" {
		base.timing = mesh.LANTiming()
	}
	a, b := startPair(ctx, t, base, []string{replica})
	defer func() {
		for _, r := range []*router{a, b} {
			if err := r.shutdown(); err != nil {
				t.Errorf("shutdown %s: %v", r.name, err)
			}
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	eventually(t, "our subscriber, router a's and b's view of the replica", func() bool {
		if !sub.Stats().Connected || !hasCandidate(b, model, replica) {
			return false
		}
		d, ok := a.kv.debug()[replica]
		return ok && d.Events.Connected
	})

	client := &http.Client{Timeout: 120 * time.Second}
	ask := func(text string) error {
		body := fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":%q}]}`, model, text)
		resp, err := client.Post("http://"+a.ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	nonce := fmt.Sprintf("%x", time.Now().UnixNano())
	// ~1,400 Gemma tokens: 44 blocks of 32, two such prompts overflow 72.
	words := func(tag string) string { return nonce + " " + strings.Repeat(tag+" kv events evict blocks. ", 200) }
	first := words("alpha")
	pr, err := prompt.RenderChat([]byte(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}]}`, model, first)))
	if err != nil {
		t.Fatal(err)
	}
	c := base.contract
	hashes := c.AppendHashes(nil, c.Root(model, ""), pr.Text)
	probes := summary.MakeProbes(nil, hashes)
	match := func(r *router) int { return r.mesh.MatchReplica(replica, probes) }
	// The first prompt's engine blocks are those stored while it runs
	// (the test sends nothing else); a server reused from an earlier run
	// evicts that run's blocks meanwhile, which the watch ignores.
	watch.mark(true)
	if err := ask(first); err != nil {
		t.Fatal(err)
	}
	eventually(t, "vLLM's BlockStored of the first prompt", func() bool { return watch.markedCount() > 0 })
	watch.mark(false)
	for _, r := range []*router{a, b} {
		eventually(t, r.name+" to hold the first prompt", func() bool { return match(r) == len(hashes) })
	}
	if at, _, _ := watch.first(); !at.IsZero() {
		t.Fatal("vLLM evicted the first prompt before the test meant it to (a server shared with other work?)")
	}
	// The prompts that evict run beside the polling: vLLM evicts when it
	// schedules one, seconds before its answer on a CPU build.
	asked := make(chan error, 1)
	go func() {
		for _, tag := range []string{"bravo", "charlie", "delta"} {
			if err := ask(words(tag)); err != nil {
				asked <- err
				return
			}
			if at, _, _ := watch.first(); !at.IsZero() {
				break
			}
		}
		asked <- nil
	}()
	defer func() {
		if err := <-asked; err != nil {
			t.Error(err)
		}
	}()
	for i := 0; ; i++ {
		if at, _, _ := watch.first(); !at.IsZero() {
			break
		}
		if i == 60000 {
			t.Fatal("vLLM removed none of the first prompt's blocks within 120 s of the prompts that should evict them")
		}
		time.Sleep(2 * time.Millisecond)
	}
	at, engineTS, _ := watch.first()
	for i := 0; match(b) == len(hashes); i++ { // polled finely, so the latency logged is close
		if i == 5000 {
			t.Fatalf("router b still claims the whole evicted prompt %v after the eviction", time.Since(at))
		}
		time.Sleep(2 * time.Millisecond)
	}
	seen := time.Now()
	engine := time.Unix(0, int64(engineTS*1e9))
	_, _, removed := watch.first()
	t.Logf("peer eviction latency %v (from vLLM's timestamp on the batch to b's copy dropping it; %v from its arrival at a subscriber); "+
		"vLLM removed %d of the first prompt's blocks; a matches %d of %d text blocks, b %d",
		seen.Sub(engine).Round(time.Millisecond), seen.Sub(at).Round(time.Millisecond), removed, match(a), len(hashes), match(b))
	d := a.kv.debug()[replica]
	if d.Tracker.Evicted == 0 || d.Events.Gaps != 0 || !d.Events.Connected {
		t.Fatalf("tracker %+v events %+v", d.Tracker, d.Events)
	}
}
