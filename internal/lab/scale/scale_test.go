package scale

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// TestSmall runs a tiny mesh briefly: every next turn and replay at
// another router is matched and nothing is resynchronised.
func TestSmall(t *testing.T) {
	res, err := Run(t.Context(), Config{Routers: 3, Replicas: 6, Rate: 200, Duration: 2 * time.Second, Replays: 50, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	res.Report(testWriter{t})
	if res.Requests == 0 || res.VisSamples == 0 || res.Replays == 0 {
		t.Fatalf("nothing measured: %+v", res)
	}
	if res.ReplaysMatched != res.Replays || res.VisMissed != 0 {
		t.Fatalf("replays %d/%d matched, %d not visible", res.ReplaysMatched, res.Replays, res.VisMissed)
	}
	for why, n := range res.FullCopies {
		if why != "new_peer" && n != 0 {
			t.Fatalf("%v full copies for %s", n, why)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

func report(b *testing.B, res *Result) {
	res.Report(os.Stderr)
	b.ReportMetric(res.MeshOutPerRouter()/1e3, "KB/s/router")
	b.ReportMetric(res.BytesPerBlockPerPeer(), "B/block/peer")
	b.ReportMetric(res.DeltaBytesPerBlock, "delta-B/block/peer")
	b.ReportMetric(float64(res.Requests)/res.Elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(res.VisP99)/1e6, "vis-p99-ms")
	b.ReportMetric(float64(res.DecisionP99)/1e3, "decision-p99-µs")
	b.ReportMetric(float64(res.IdleDecisionP99)/1e3, "idle-decision-p99-µs")
	if res.Replays > 0 {
		b.ReportMetric(100*float64(res.ReplaysMatched)/float64(res.Replays), "%replays-matched")
	}
	b.ReportMetric(res.FullCopies["overflow"], "overflow-fulls")
	b.ReportMetric(float64(res.RSS)/1e6, "RSS-MB")
}

// BenchmarkIssue9Table reruns issue 9's table: 3 routers over real
// memberlist sockets on 127.0.0.1, 6 instant replicas, new 4-8 KB prompts
// at each rate, then 200 earlier prompts (still cached at their owner)
// replayed with one more turn at another router. Each run lasts
// KVMESH_SCALE_SECONDS (default 10).
func BenchmarkIssue9Table(b *testing.B) {
	for _, rate := range []float64{50, 200, 800, 2000} {
		b.Run(fmt.Sprintf("%.0f-req-s", rate), func(b *testing.B) {
			for b.Loop() {
				res, err := Run(b.Context(), Config{Routers: 3, Replicas: 6, Rate: rate, Duration: seconds(10),
					MinBlocks: 4, MaxBlocks: 8, Capacity: 16384, Real: true, Replays: 200, Seed: 9})
				if err != nil {
					b.Fatal(err)
				}
				report(b, res)
			}
		})
	}
}

// BenchmarkScale is issue 9's scale point: 16 routers x 1,024 replicas x
// 5,000 req/s of new 32 KB prompts over the in-memory network.
func BenchmarkScale(b *testing.B) {
	for b.Loop() {
		res, err := Run(b.Context(), Config{Routers: 16, Replicas: 1024, Rate: 5000, Duration: seconds(10),
			MinBlocks: 32, MaxBlocks: 32, Capacity: 4096, Replays: 200, Seed: 16, DecideEvery: 10})
		if err != nil {
			b.Fatal(err)
		}
		report(b, res)
	}
}

func seconds(def int) time.Duration {
	if s := os.Getenv("KVMESH_SCALE_SECONDS"); s != "" {
		var n int
		if _, err := fmt.Sscan(s, &n); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return time.Duration(def) * time.Second
}
