package mesh

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
)

// BenchmarkReadersUnderIngest times what a request's handler takes of the
// mesh's lock (Locate, as the proxy calls per request) at a router whose
// copies of 1,024 replicas, all bound in its Index, take the owner's
// deltas of 5,000 new 32-block prompts a second (issue 9's rate, all
// from one owner: its batches are the largest a router applies). Every
// write section of the table's lock holds such a reader up, one call in thousands:
// the max and the calls over 100 µs show them. It reports the reader's
// wall time per call, p50, p99, p99.9 and max, and the calls over 100 µs.
func BenchmarkReadersUnderIngest(b *testing.B) {
	owner, a, _ := copying1024(b)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the owner's load: 5,000 new prompts of 32 blocks a second
		defer wg.Done()
		rng := rand.New(rand.NewPCG(3, 4))
		h := make([]uint64, 32)
		start, i := time.Now(), 0
		for {
			select {
			case <-stop:
				return
			default:
			}
			for target := int(time.Since(start).Seconds() * 5000); i < target; i++ {
				for j := range h {
					h[j] = rng.Uint64()
				}
				owner.Record(fmt.Sprintf("http://replica-%04d:8000", i%1024), h)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("http://replica-%04d:8000", i)
	}
	took := make([]time.Duration, 0, b.N)
	i := 0
	for b.Loop() {
		t0 := time.Now()
		a.Locate(ids[i%len(ids)])
		took = append(took, time.Since(t0))
		i++
		if i%16 == 0 {
			time.Sleep(50 * time.Microsecond) // a request's other work
		}
	}
	close(stop)
	wg.Wait()
	slices.Sort(took)
	q := func(f float64) float64 { return float64(took[int(f*float64(len(took)-1))].Nanoseconds()) / 1000 }
	b.ReportMetric(q(0.5), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(q(0.999), "p99.9-µs")
	b.ReportMetric(q(1), "max-µs")
	slow := len(took) - sort.Search(len(took), func(i int) bool { return took[i] > 100*time.Microsecond })
	b.ReportMetric(float64(slow), "calls>100µs")
	b.ReportMetric(0, "ns/op")
}

// TestAssembleSplitsAtTheLimits packs entries into batches: each message
// decodes to its share of the entries, in order, stays under
// maxBatchBytes, and is allocated at its size.
func TestAssembleSplitsAtTheLimits(t *testing.T) {
	m := &dissemination{env: &env{cfg: Config{Name: "a"}, boot: 7}}
	big := make([]byte, maxBatchBytes/3)
	var parts [][]byte
	for i := range 10 {
		st := stateMsg{header: header{Origin: "a", Boot: 7, Seq: uint64(i)}, Replica: fmt.Sprintf("http://r:%d", i), Owned: true}
		var payload []byte
		kind := payloadNone
		if i%3 == 2 { // three of a third of the limit each: more than one message
			payload, kind = big, payloadFull
		}
		parts = append(parts, appendEntryRaw(nil, st.append(nil), kind, payload))
	}
	msgs := m.assemble(parts)
	if len(msgs) < 2 {
		t.Fatalf("%d messages for %d bytes", len(msgs), 3*len(big))
	}
	next := 0
	for k, b := range msgs {
		if len(b) > maxBatchBytes || cap(b) != len(b) {
			t.Fatalf("message %d: %d bytes, capacity %d", k, len(b), cap(b))
		}
		v, err := decodeMsg(b, wireLatest)
		if err != nil {
			t.Fatalf("message %d: %v", k, err)
		}
		for _, e := range v.(batchMsg).Entries {
			if want := fmt.Sprintf("http://r:%d", next); e.State.Replica != want {
				t.Fatalf("message %d: entry %q, want %q", k, e.State.Replica, want)
			}
			next++
		}
	}
	if next != len(parts) {
		t.Fatalf("%d entries out of %d", next, len(parts))
	}
	if msgs := m.assemble(nil); len(msgs) != 0 {
		t.Fatalf("%d messages of no entries", len(msgs))
	}
}
