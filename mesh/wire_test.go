package mesh

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func sampleMessages(t testing.TB) [][]byte {
	st := stateMsg{header: header{Origin: "a", Boot: 7, Seq: 9}, Replica: "http://r:1", Owned: true, Healthy: true,
		Capacity: 2048, Epoch: 3, Version: 4, Digest: 5, InFlight: 2, Pending: 1.5,
		Models: []string{"m1", "m2"}, DeclaredBy: []string{"a", "b"}}
	d := deltaMsg{header: header{Origin: "a", Boot: 7, Seq: 10}, Replica: "http://r:1", Epoch: 3, From: 4, Hashes: []uint64{1, 2, 3}}
	s, err := summary.New(summary.Params{CapacityBlocks: 64, FalsePositiveRate: 0.01}, 3)
	if err != nil {
		t.Fatal(err)
	}
	s.Add([]uint64{1, 2, 3, 4})
	sum := s.AppendEncode(nil, summary.DefaultContract().Fingerprint())
	pp := []byte{kindPushPull}
	pp = appendS8(pp, "a")
	pp = append(pp, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 1)
	pp = appendStateWithSummary(pp, &st, sum)
	return [][]byte{
		st.append(nil),
		d.append(nil),
		fullReq{Origin: "b", Replica: "http://r:1"}.append(nil),
		appendStateWithSummary([]byte{kindFullReply}, &st, sum),
		pp,
		nodeMeta{Region: "eu", API: "http://a:8080", Contract: summary.DefaultContract().ID()}.encode(),
	}
}

func TestWireRoundTrip(t *testing.T) {
	msgs := sampleMessages(t)
	tests := []struct {
		name string
		b    []byte
		want any
	}{
		{"state", msgs[0], stateMsg{header: header{Origin: "a", Boot: 7, Seq: 9}, Replica: "http://r:1", Owned: true, Healthy: true,
			Capacity: 2048, Epoch: 3, Version: 4, Digest: 5, InFlight: 2, Pending: 1.5,
			Models: []string{"m1", "m2"}, DeclaredBy: []string{"a", "b"}}},
		{"delta", msgs[1], deltaMsg{header: header{Origin: "a", Boot: 7, Seq: 10}, Replica: "http://r:1", Epoch: 3, From: 4, Hashes: []uint64{1, 2, 3}}},
		{"full request", msgs[2], fullReq{Origin: "b", Replica: "http://r:1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeMsg(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
	full, err := decodeMsg(msgs[3])
	if err != nil {
		t.Fatal(err)
	}
	if f := full.(stateWithSummary); f.State.Replica != "http://r:1" || len(f.Summary) == 0 {
		t.Fatalf("full reply %+v", f.State)
	}
	p, err := decodePushPull(msgs[4])
	if err != nil || p.Origin != "a" || p.Boot != 7 || len(p.Entries) != 1 {
		t.Fatalf("push/pull %+v %v", p, err)
	}
	m, err := decodeMeta(msgs[5])
	if err != nil || m.Region != "eu" || m.API != "http://a:8080" {
		t.Fatalf("meta %+v %v", m, err)
	}
}

// Every strict prefix of a valid message is an error, never a panic.
func TestWireTruncated(t *testing.T) {
	for i, b := range sampleMessages(t) {
		for n := 0; n < len(b); n++ {
			_, e1 := decodeMsg(b[:n])
			_, e2 := decodePushPull(b[:n])
			_, e3 := decodeMeta(b[:n])
			if e1 == nil && e2 == nil && e3 == nil {
				t.Fatalf("message %d truncated to %d bytes decoded", i, n)
			}
		}
	}
}

// Garbage and truncated messages fed to a live router's delegate never
// panic, and each one that does not decode is counted exactly once.
func TestDelegateGarbage(t *testing.T) {
	a := newRouter(t, "a", nil)
	declare(a, "http://r:1")
	d := &delegate{m: a.Mesh}
	fp := summary.DefaultContract().Fingerprint()
	rng := rand.New(rand.NewPCG(1, 2))
	msgs := sampleMessages(t)
	// bad counts what the mesh must count as undecodable: the message, or
	// a full summary inside a message that decodes.
	badSum := func(st stateMsg, sum []byte, origin string) bool {
		if len(sum) == 0 || st.Origin == a.cfg.Name || (origin != "" && st.Origin != origin) {
			return false
		}
		_, err := summary.Decode(sum, fp)
		return err != nil
	}
	badMsg := func(b []byte) int {
		v, err := decodeMsg(b)
		if err != nil {
			return 1
		}
		if f, ok := v.(stateWithSummary); ok && badSum(f.State, f.Summary, "") {
			return 1
		}
		return 0
	}
	badPushPull := func(b []byte) int {
		p, err := decodePushPull(b)
		if err != nil {
			return 1
		}
		n := 0
		for _, e := range p.Entries {
			if badSum(e.State, e.Summary, p.Origin) {
				n++
			}
		}
		return n
	}
	garbage := func(i int) []byte {
		b := append([]byte(nil), msgs[i%len(msgs)]...)
		switch i % 3 {
		case 0:
			b = b[:rng.IntN(len(b)+1)]
		case 1:
			for j := 0; j < 1+rng.IntN(4); j++ {
				b[rng.IntN(len(b))] ^= byte(1 + rng.IntN(255))
			}
		default:
			b = make([]byte, rng.IntN(64))
			for j := range b {
				b[j] = byte(rng.Uint32())
			}
		}
		return b
	}
	decodeDrops := func() float64 { return testutil.ToFloat64(a.met.dropped.WithLabelValues(dropDecode)) }
	base := decodeDrops()
	want := 0
	for i := 0; i < 2000; i++ {
		b := garbage(i)
		a.handleMsg(b)
		d.MergeRemoteState(b, i%2 == 0)
		want += badMsg(b) + badPushPull(b)
	}
	if want == 0 {
		t.Fatal("the garbage all decoded: the test tests nothing")
	}
	if got := decodeDrops() - base; got != float64(want) {
		t.Fatalf("decode drops = %v, want %d", got, want)
	}
	// Through memberlist's entry point: handed to the inbox, then counted.
	for i := 0; i < 200; i++ {
		b := garbage(i)
		d.NotifyMsg(b)
		if len(b) > 0 {
			want += badMsg(b)
		}
	}
	eventually(t, wait, "inbox messages counted", func() error {
		if got := decodeDrops() - base; got != float64(want) {
			return fmt.Errorf("decode drops = %v, want %d", got, want)
		}
		return nil
	})
	if got := testutil.ToFloat64(a.met.dropped.WithLabelValues(dropHandoffFull)); got != 0 {
		t.Fatalf("hand-off drops = %v with a near-empty inbox", got)
	}
}

func FuzzDecodeMsg(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeMsg(b)
		if err != nil {
			return
		}
		// What decodes re-encodes to the same bytes (the format has no
		// slack a sender could hide data in).
		var out []byte
		switch m := v.(type) {
		case stateMsg:
			out = m.append(nil)
		case deltaMsg:
			out = m.append(nil)
		case fullReq:
			out = m.append(nil)
		case stateWithSummary:
			out = appendStateWithSummary([]byte{kindFullReply}, &m.State, m.Summary)
		}
		if string(out) != string(b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", b, out)
		}
	})
}

func FuzzDecodePushPull(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	fp := summary.DefaultContract().Fingerprint()
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePushPull(b)
		if err != nil {
			return
		}
		for _, e := range p.Entries {
			_, _ = summary.Decode(e.Summary, fp)
		}
	})
}

func FuzzDecodeMeta(f *testing.F) {
	for _, b := range sampleMessages(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeMeta(b)
		if err == nil && string(m.encode()) != string(b) {
			t.Fatalf("re-encoding differs")
		}
	})
}
