package trace

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReadMooncake(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Request
		wantErr string // substring; "" means success
	}{
		{
			name: "two records",
			in: `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}
{"timestamp": 1500, "input_length": 10, "output_length": 0, "hash_ids": [0]}
`,
			want: []Request{
				{Arrival: 0, InputTokens: 600, OutputTokens: 3, HashIDs: []int64{0, 1}},
				{Arrival: 1500 * time.Millisecond, InputTokens: 10, OutputTokens: 0, HashIDs: []int64{0}},
			},
		},
		{
			name: "unsorted is stably sorted, blank lines skipped, extra fields ok",
			in: `{"timestamp": 20, "input_length": 1, "output_length": 1, "hash_ids": [1]}

{"timestamp": 10, "input_length": 2, "output_length": 1, "hash_ids": [2], "x": 1}
{"timestamp": 20, "input_length": 3, "output_length": 1, "hash_ids": [3]}
{"timestamp": 10, "input_length": 4, "output_length": 1, "hash_ids": [4]}`,
			want: []Request{
				{Arrival: 10 * time.Millisecond, InputTokens: 2, OutputTokens: 1, HashIDs: []int64{2}},
				{Arrival: 10 * time.Millisecond, InputTokens: 4, OutputTokens: 1, HashIDs: []int64{4}},
				{Arrival: 20 * time.Millisecond, InputTokens: 1, OutputTokens: 1, HashIDs: []int64{1}},
				{Arrival: 20 * time.Millisecond, InputTokens: 3, OutputTokens: 1, HashIDs: []int64{3}},
			},
		},
		{name: "empty input", in: "", want: nil},
		{name: "bad json", in: "{\"timestamp\": 0,\n", wantErr: "line 1"},
		{name: "not an object", in: `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[1]}` + "\n[1,2]", wantErr: "line 2"},
		{name: "negative timestamp", in: `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, wantErr: "line 1: negative timestamp"},
		{name: "negative input", in: "\n" + `{"timestamp": 0, "input_length": -5, "output_length": 1, "hash_ids": [1]}`, wantErr: "line 2: negative input_length"},
		{name: "negative output", in: `{"timestamp": 0, "input_length": 5, "output_length": -1, "hash_ids": [1]}`, wantErr: "negative output_length"},
		{name: "empty hash ids", in: `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": []}`, wantErr: "empty hash_ids"},
		{name: "missing hash ids", in: `{"timestamp": 0, "input_length": 5, "output_length": 1}`, wantErr: "empty hash_ids"},
		{name: "missing timestamp", in: `{"input_length": 5, "output_length": 1, "hash_ids": [1]}`, wantErr: "missing timestamp"},
		{name: "missing input", in: `{"timestamp": 0, "output_length": 1, "hash_ids": [1]}`, wantErr: "missing input_length"},
		{name: "missing output", in: `{"timestamp": 0, "input_length": 1, "hash_ids": [1]}`, wantErr: "missing output_length"},
		{name: "string length", in: `{"timestamp": 0, "input_length": "5", "output_length": 1, "hash_ids": [1]}`, wantErr: "line 1"},
		{name: "huge timestamp", in: `{"timestamp": 1e300, "input_length": 5, "output_length": 1, "hash_ids": [1]}`, wantErr: "out of range"},
		{
			name: "lmbench: string nanoseconds rebased, wide ids",
			in: `{"timestamp": "1753780607550317897", "input_length": 2101, "output_length": 84, "hash_ids": [2843241808, 137021281]}
{"timestamp": "1753780607050317897", "input_length": 10, "output_length": 1, "hash_ids": [2843241808]}`,
			want: []Request{
				{Arrival: 0, InputTokens: 10, OutputTokens: 1, HashIDs: []int64{2843241808}},
				{Arrival: 500 * time.Millisecond, InputTokens: 2101, OutputTokens: 84, HashIDs: []int64{2843241808, 137021281}},
			},
		},
		{
			name: "lmbench: numeric absolute nanoseconds",
			in:   `{"timestamp": 1753780607550317897, "input_length": 1, "output_length": 1, "hash_ids": [7]}`,
			want: []Request{{Arrival: 0, InputTokens: 1, OutputTokens: 1, HashIDs: []int64{7}}},
		},
		{name: "lmbench: bad string timestamp", in: `{"timestamp": "soon", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, wantErr: "want integer nanoseconds"},
		{name: "lmbench: negative string timestamp", in: `{"timestamp": "-5", "input_length": 1, "output_length": 1, "hash_ids": [1]}`, wantErr: "negative timestamp"},
		{name: "mixed absolute and relative", in: `{"timestamp": "1753780607550317897", "input_length": 1, "output_length": 1, "hash_ids": [1]}` + "\n" + `{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, wantErr: "mixed"},
		{name: "fractional hash id", in: `{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1.5]}`, wantErr: "not an integer"},
		{name: "null timestamp", in: `{"timestamp": null, "input_length": 1, "output_length": 1, "hash_ids": [1]}`, wantErr: "missing timestamp"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadMooncake(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestLoadMooncake(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "t.jsonl")
	if err := os.WriteFile(p, []byte(`{"timestamp": 3, "input_length": 1, "output_length": 1, "hash_ids": [7]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := LoadMooncake(p)
	if err != nil || len(got) != 1 || got[0].HashIDs[0] != 7 {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := LoadMooncake(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing file: want error")
	}
	if err := os.WriteFile(p, []byte("nope"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadMooncake(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Fatalf("bad file: err = %v, want naming the path", err)
	}
}

func TestEmbeddedConversationSlice(t *testing.T) {
	reqs := EmbeddedConversationSlice()
	if len(reqs) != 1750 {
		t.Fatalf("len = %d, want 1750", len(reqs))
	}
	for i, r := range reqs {
		if r.Arrival >= 600*time.Second {
			t.Fatalf("request %d arrives at %v, past 10 minutes", i, r.Arrival)
		}
		if want := (r.InputTokens + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(r.HashIDs) != want {
			t.Fatalf("request %d: %d ids for %d tokens", i, len(r.HashIDs), r.InputTokens)
		}
		if r.HashIDs[0] != 0 {
			t.Fatalf("request %d does not start with block 0", i)
		}
	}
	// Each call parses afresh, so callers cannot corrupt each other.
	reqs[0].HashIDs[0] = 99
	if again := EmbeddedConversationSlice(); again[0].HashIDs[0] != 0 {
		t.Fatal("second call saw the first caller's modification")
	}
}

// The embedded full trace is the upstream file byte for byte (the
// checksum testdata/README.md records), and the slice is its first lines.
func TestEmbeddedConversationTrace(t *testing.T) {
	zr, err := gzip.NewReader(bytes.NewReader(conversationTraceGz))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	const want = "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df"
	if got := fmt.Sprintf("%x", sha256.Sum256(raw)); got != want {
		t.Fatalf("sha256 %s, want %s", got, want)
	}
	if !bytes.HasPrefix(raw, conversationSlice) {
		t.Fatal("the embedded slice is not the head of the embedded trace")
	}
	reqs := EmbeddedConversationTrace()
	if len(reqs) != 12031 {
		t.Fatalf("len = %d, want 12031", len(reqs))
	}
	reqs[0].HashIDs[0] = 99
	if again := EmbeddedConversationTrace(); again[0].HashIDs[0] != 0 {
		t.Fatal("second call saw the first caller's modification")
	}
	// The same file gzipped on disk loads alike.
	p := filepath.Join(t.TempDir(), "t.jsonl.gz")
	if err := os.WriteFile(p, conversationTraceGz, 0o644); err != nil {
		t.Fatal(err)
	}
	fromDisk, err := LoadMooncake(p)
	if err != nil || len(fromDisk) != len(reqs) {
		t.Fatalf("gzipped file: %d requests, err %v; want %d", len(fromDisk), err, len(reqs))
	}
}

func TestReadMTBench(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []Question
		wantErr string
	}{
		{
			name: "ok",
			in:   `{"question_id": 81, "category": "writing", "turns": ["a", "b"]}` + "\n\n" + `{"question_id": 82, "category": "math", "turns": ["c"]}`,
			want: []Question{{ID: 81, Category: "writing", Turns: []string{"a", "b"}}, {ID: 82, Category: "math", Turns: []string{"c"}}},
		},
		{name: "no turns", in: `{"question_id": 1, "category": "x", "turns": []}`, wantErr: "line 1: no turns"},
		{name: "no id", in: `{"category": "x", "turns": ["a"]}`, wantErr: "missing question_id"},
		{name: "bad json", in: `{"question_id": 1` + "\n", wantErr: "line 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadMTBench(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// sharedFile returns the path of name in the team's shared folder, ../shared
// next to the repository root (found by walking up to go.mod), or skips the
// test when it is not there: CI checkouts have no shared folder.
func sharedFile(t *testing.T, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("no go.mod above the test directory, so no shared folder to find")
		}
		dir = parent
	}
	p := filepath.Join(dir, "..", "shared", name)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("shared file %s not present next to the repository: %v", p, err)
	}
	return p
}

func TestReadMTBenchSharedFile(t *testing.T) {
	f, err := os.Open(sharedFile(t, filepath.Join("traces", "mtbench_questions.jsonl")))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	qs, err := ReadMTBench(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 80 || len(qs[0].Turns) != 2 {
		t.Fatalf("got %d questions, first has %d turns", len(qs), len(qs[0].Turns))
	}
}

func FuzzReadMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}`))
	f.Add([]byte("{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [2]}\n"))
	f.Add([]byte(`{"timestamp": -1}`))
	f.Add(conversationSlice[:bytes.IndexByte(conversationSlice, '\n')+1])
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ReadMooncake(bytes.NewReader(data))
		if err != nil {
			return
		}
		for i, r := range reqs {
			if r.Arrival < 0 || r.InputTokens < 0 || r.OutputTokens < 0 || len(r.HashIDs) == 0 {
				t.Fatalf("request %d accepted with invalid fields: %+v", i, r)
			}
			if i > 0 && r.Arrival < reqs[i-1].Arrival {
				t.Fatalf("not sorted at %d", i)
			}
		}
	})
}

func TestWideHashIDs(t *testing.T) {
	// Ids wider than 63 bits map to int64s: equal stays equal, different
	// stays different.
	in := `{"timestamp": "1", "input_length": 1, "output_length": 1, "hash_ids": [340282366920938463463374607431768211455, 18446744073709551615]}
{"timestamp": "2", "input_length": 1, "output_length": 1, "hash_ids": [340282366920938463463374607431768211455, 18446744073709551614]}`
	got, err := ReadMooncake(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	a, b := got[0].HashIDs, got[1].HashIDs
	if a[0] != b[0] || a[1] == b[1] || a[0] == a[1] {
		t.Fatalf("ids %v and %v: want equal heads and different tails", a, b)
	}
	if got[1].Arrival != time.Nanosecond {
		t.Fatalf("arrival %v, want 1ns", got[1].Arrival)
	}
}
