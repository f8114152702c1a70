package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/internal/kvevents"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/mesh"
)

// evictionWatch is the replica's event sink: it publishes, and notes when
// the first batch with an eviction went out.
type evictionWatch struct {
	pub     *kvevents.Publisher
	mu      sync.Mutex
	evicted time.Time
}

func (w *evictionWatch) Publish(b kvevents.Batch) error {
	for _, e := range b.Events {
		if e.Kind == kvevents.BlockRemoved {
			w.mu.Lock()
			if w.evicted.IsZero() {
				w.evicted = time.Now()
			}
			w.mu.Unlock()
		}
	}
	return w.pub.Publish(b)
}

func (w *evictionWatch) firstEviction() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.evicted
}

// TestKVEventEvictionReachesThePeer: a replica-sim publishing vLLM-format
// KV events (tagged maps, with a replay endpoint) behind router a (with
// --kv-events auto) and router b joined to it. A prompt is cached, both
// routers' views of the replica hold it; two other prompts make the
// engine evict its blocks; a's summary drops them from the events alone
// (no request of that prompt is sent again, so no usage could correct
// it), and b's copy shows it too. Without the events both would go on
// claiming the whole prompt.
func TestKVEventEvictionReachesThePeer(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// 160 blocks of 16 tokens (64 bytes of the simulator's text): one
	// prompt of ~5 KB and its answer fit twice, not three times.
	sim := startCountingSim(t, "sim", replicasim.Config{TimeScale: 1000, DefaultMaxTokens: 8, KVBlocks: 160, BlockSize: 16})
	defer sim.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	watch := &evictionWatch{pub: kvevents.NewPublisher(ln, rl, "kv-events", kvevents.FormMap, 100)}
	defer watch.pub.Close()
	sim.sim.PublishKVEvents(watch, "tcp://*:"+portOf(ln), "tcp://*:"+portOf(rl), "kv-events")

	logs := &lockedWriter{}
	base := pairConfig(logs, 50*time.Millisecond)
	base.kvEvents.auto = true
	if os.Getenv("KVMESH_TEST_GOSSIP") == "lan" { // peer.sh measures the latency with the default timings too
		base.timing = mesh.LANTiming()
	}
	a, b := startPair(ctx, t, base, []string{sim.srv.URL})
	defer stopPair(t, logs, a, b)
	eventually(t, "router a subscribed", func() bool { return watch.pub.Subscribers() == 1 && hasCandidate(b, simModel, sim.srv.URL) })

	client := &http.Client{Timeout: 10 * time.Second}
	ask := func(text string) {
		t.Helper()
		if err := chatOnce(client, a.ln.Addr().String(), simModel, text); err != nil {
			t.Fatal(err)
		}
	}
	words := func(tag string) string { return strings.Repeat(tag+" kv events evict blocks. ", 200) } // ~5 KB
	first := words("alpha")
	hashes, probes := chatBlocks(t, base.contract, simModel, first)
	match := func(r *router) int {
		for _, cand := range r.mesh.Candidates(simModel, nil) {
			if cand.ID() == sim.srv.URL && cand.Summary != nil {
				return cand.Summary.Match(probes)
			}
		}
		return -1
	}
	ask(first)
	for _, r := range []*router{a, b} {
		eventually(t, r.name+" to hold the first prompt", func() bool { return match(r) == len(hashes) })
	}
	eventually(t, "the answer related to the engine's blocks", func() bool {
		d := a.kv.debug()[sim.srv.URL]
		return d.Tracker.Attributed == 1 && d.Tracker.TextBlocks >= len(hashes)
	})
	if !watch.firstEviction().IsZero() {
		t.Fatal("the engine evicted before the test meant it to")
	}
	ask(words("bravo"))
	ask(words("charlie"))
	at := watch.firstEviction()
	if at.IsZero() {
		t.Fatal("the engine evicted nothing")
	}
	eventually(t, "a's summary to drop the evicted blocks", func() bool { return match(a) < len(hashes) })
	// How soon is measured, not asserted (a shared machine's scheduling
	// is no test of the code): internal/lab/e2e/kvevents/peer.sh runs this
	// test repeatedly and reports the logged latency.
	for i := 0; match(b) == len(hashes); i++ { // polled finely, so the latency logged is close
		if i == 4000 {
			t.Fatalf("router b still claims the whole evicted prompt %v after the eviction", time.Since(at))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("peer eviction latency %v (from the engine publishing it to b's copy dropping it); a matches %d of %d blocks, b %d",
		time.Since(at).Round(time.Millisecond), match(a), len(hashes), match(b))
	d := a.kv.debug()[sim.srv.URL]
	if d.Tracker.Evicted == 0 || d.Events.Gaps != 0 || !d.Events.Connected {
		t.Fatalf("tracker %+v events %+v", d.Tracker, d.Events)
	}
	// The subscription shows in /debug/mesh and /metrics.
	raw, _ := json.Marshal(a.debug())
	if !strings.Contains(string(raw), `"kv_events"`) {
		t.Fatalf("/debug/mesh without kv_events: %s", raw)
	}
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_kv_events_total" && mf.GetMetric()[0].GetCounter().GetValue() > 0 {
			found = true
		}
	}
	if !found {
		t.Fatal("kvmesh_kv_events_total missing or 0")
	}
}

func portOf(ln net.Listener) string {
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return p
}

func TestKVEventsFlag(t *testing.T) {
	var f kvEventsFlag
	for _, ok := range []string{"auto", "http://10.0.0.5:8000=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,topic=kv"} {
		if err := f.Set(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if c := f.given["http://10.0.0.5:8000"]; !f.auto || c.Endpoint != "tcp://10.0.0.5:5557" || c.Replay != "tcp://10.0.0.5:5558" || c.Topic != "kv" {
		t.Fatalf("%+v", f)
	}
	for _, bad := range []string{"", "on", "http://x=tcp://*:5557", "http://x=tcp://h:1,bogus=1", "http://x=zmq://h:1", "=tcp://h:1"} {
		if err := (&kvEventsFlag{}).Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseSources(t *testing.T) {
	c, err := parseSources([]byte(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}`), "10.0.0.5")
	if err != nil || c.Endpoint != "tcp://10.0.0.5:5557" || c.Replay != "tcp://10.0.0.5:5558" || c.Topic != "kv-events" {
		t.Fatalf("%+v %v", c, err)
	}
	// vLLM 0.32's answer: the KVEventsConfig by data-parallel rank.
	c, err = parseSources([]byte(`{"0":{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","buffer_steps":10000,"hwm":100000,"max_queue_size":100000,"topic":"kv-events"}}`), "127.0.0.1")
	if err != nil || c.Endpoint != "tcp://127.0.0.1:5557" || c.Replay != "tcp://127.0.0.1:5558" || c.Topic != "kv-events" {
		t.Fatalf("by rank: %+v %v", c, err)
	}
	// Later releases: an array, one source per data-parallel rank.
	c, err = parseSources([]byte(`[{"data_parallel_rank":0,"endpoint":"tcp://192.0.2.1:5557","replay_endpoint":null,"topic":""}]`), "10.0.0.5")
	if err != nil || c.Endpoint != "tcp://192.0.2.1:5557" || c.Replay != "" || c.Topic != "" {
		t.Fatalf("array: %+v %v", c, err)
	}
	for _, bad := range []string{`[]`, `{}`, `[{"data_parallel_rank":0,"endpoint":"tcp://h:1"},{"data_parallel_rank":1,"endpoint":"tcp://h:2"}]`,
		`{"0":{"endpoint":"tcp://h:1"},"1":{"endpoint":"tcp://h:2"}}`, `{"0":{"enable_kv_cache_events":false,"endpoint":"tcp://*:5557"}}`, `{"0":[]}`,
		`{"endpoint":"ipc:///tmp/x"}`, `not json`, `[1]`} {
		if _, err := parseSources([]byte(bad), "h"); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

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
	base := pairConfig(logs, 200*time.Millisecond)
	base.kvEvents.auto = true
	if os.Getenv("KVMESH_TEST_GOSSIP") == "lan" {
		base.timing = mesh.LANTiming()
	}
	a, b := startPair(ctx, t, base, []string{replica})
	defer stopPair(t, logs, a, b)
	eventually(t, "our subscriber, router a's and b's view of the replica", func() bool {
		if !sub.Stats().Connected || !hasCandidate(b, model, replica) {
			return false
		}
		d, ok := a.kv.debug()[replica]
		return ok && d.Events.Connected
	})

	client := &http.Client{Timeout: 120 * time.Second}
	ask := func(text string) error { return chatOnce(client, a.ln.Addr().String(), model, text) }
	nonce := fmt.Sprintf("%x", time.Now().UnixNano())
	// ~1,400 Gemma tokens: 44 blocks of 32, two such prompts overflow 72.
	words := func(tag string) string { return nonce + " " + strings.Repeat(tag+" kv events evict blocks. ", 200) }
	first := words("alpha")
	hashes, probes := chatBlocks(t, base.contract, model, first)
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
