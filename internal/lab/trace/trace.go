// Package trace reads LLM-serving workload traces (the Mooncake JSONL
// format, LMBench's variant of it, and MT-Bench questions) and turns their block hash ids into
// deterministic prompt text, so a trace can be replayed against real
// OpenAI-compatible endpoints with the trace's exact prefix sharing.
package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/zeebo/xxh3"
)

// MooncakeBlockTokens is the number of prompt tokens covered by one entry of
// a Mooncake record's hash_ids.
const MooncakeBlockTokens = 512

// maxLineBytes bounds one JSONL line; the largest real record (126K tokens,
// ~250 ids) is a few KB, so this only stops runaway input.
const maxLineBytes = 64 << 20

// Request is one trace record.
type Request struct {
	Arrival      time.Duration // from trace start
	InputTokens  int
	OutputTokens int
	HashIDs      []int64 // chained block ids, one per MooncakeBlockTokens tokens of prompt
}

// mooncakeRecord is the wire shape of one Mooncake or LMBench line.
// Pointers tell a missing field from a zero one; the timestamp and the ids
// are kept raw because LMBench writes them differently.
type mooncakeRecord struct {
	Timestamp    json.RawMessage `json:"timestamp"`
	InputLength  *int64          `json:"input_length"`
	OutputLength *int64          `json:"output_length"`
	HashIDs      []json.Number   `json:"hash_ids"`
}

// absoluteNs is the smallest numeric timestamp read as absolute Unix
// nanoseconds rather than milliseconds from the trace start: 1e14 ms would
// be a trace over three thousand years long, while any Unix time in
// nanoseconds since 1973 is above it.
const absoluteNs = 1e14

// ReadMooncake parses Mooncake JSONL records (one JSON object per line; blank
// lines are skipped) and returns them sorted by arrival, keeping file order
// among equal timestamps. It rejects missing or negative timestamp,
// input_length and output_length, and empty hash_ids; errors name the line.
// It does not require len(hash_ids) == ceil(input_length/512).
//
// It also reads LMBench's trace-replayer format, the same fields with the
// timestamp as absolute Unix nanoseconds in a string (or a number of
// absoluteNs or more) and hash ids of any width: such arrivals are taken
// from the first record's, and ids that do not fit an int64 are mapped to
// one by hashing their decimal text (equal ids stay equal).
func ReadMooncake(r io.Reader) ([]Request, error) {
	var out []Request
	sorted, absolute, base := true, false, int64(math.MaxInt64)
	err := eachLine(r, func(lineNo int, line []byte) error {
		var rec mooncakeRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("mooncake line %d: %w", lineNo, err)
		}
		req, ns, err := rec.request()
		if err != nil {
			return fmt.Errorf("mooncake line %d: %w", lineNo, err)
		}
		if n := len(out); n > 0 && (ns >= 0) != absolute {
			return fmt.Errorf("mooncake line %d: absolute and relative timestamps mixed", lineNo)
		}
		if ns >= 0 {
			absolute, base = true, min(base, ns)
			req.Arrival = time.Duration(ns) // rebased below
		}
		if n := len(out); n > 0 && req.Arrival < out[n-1].Arrival {
			sorted = false
		}
		out = append(out, req)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if absolute {
		for i := range out {
			out[i].Arrival -= time.Duration(base)
		}
	}
	if !sorted {
		sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	}
	return out, nil
}

// timestamp parses a record's timestamp: milliseconds from the trace start
// (Mooncake), or absolute nanoseconds (LMBench: a string, or a number of
// absoluteNs or more), returned as ns >= 0; ns is -1 for the first kind.
func (rec *mooncakeRecord) timestamp() (ms float64, ns int64, err error) {
	raw := bytes.TrimSpace(rec.Timestamp)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, -1, errors.New("missing timestamp")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, -1, fmt.Errorf("timestamp: %w", err)
		}
		v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			return 0, -1, fmt.Errorf("timestamp %q: want integer nanoseconds", s)
		}
		if v < 0 {
			return 0, -1, fmt.Errorf("negative timestamp %d", v)
		}
		return 0, v, nil
	}
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		return 0, -1, fmt.Errorf("timestamp: %w", err)
	}
	switch {
	case math.IsNaN(f) || f < 0:
		return 0, -1, fmt.Errorf("negative timestamp %v", f)
	case f >= absoluteNs && f < math.MaxInt64:
		return 0, int64(f), nil
	case f > float64(math.MaxInt64/int64(time.Millisecond)):
		return 0, -1, fmt.Errorf("timestamp %v ms out of range", f)
	}
	return f, -1, nil
}

// hashID maps a hash id of any width to an int64: itself when it fits,
// else a hash of its decimal text.
func hashID(n json.Number) (int64, error) {
	s := n.String()
	if v, err := strconv.ParseInt(s, 10, 64); err == nil {
		return v, nil
	}
	for i := 0; i < len(s); i++ {
		if (s[i] < '0' || s[i] > '9') && !(i == 0 && s[i] == '-') {
			return 0, fmt.Errorf("hash id %q is not an integer", s)
		}
	}
	return int64(xxh3.HashString(s) | 1<<62), nil
}

func (rec *mooncakeRecord) request() (Request, int64, error) {
	ms, ns, err := rec.timestamp()
	if err != nil {
		return Request{}, -1, err
	}
	switch {
	case rec.InputLength == nil:
		return Request{}, -1, errors.New("missing input_length")
	case rec.OutputLength == nil:
		return Request{}, -1, errors.New("missing output_length")
	case *rec.InputLength < 0:
		return Request{}, -1, fmt.Errorf("negative input_length %d", *rec.InputLength)
	case *rec.OutputLength < 0:
		return Request{}, -1, fmt.Errorf("negative output_length %d", *rec.OutputLength)
	case *rec.InputLength > math.MaxInt32 || *rec.OutputLength > math.MaxInt32:
		return Request{}, -1, errors.New("token count out of range")
	case len(rec.HashIDs) == 0:
		return Request{}, -1, errors.New("empty hash_ids")
	}
	ids := make([]int64, len(rec.HashIDs))
	for i, n := range rec.HashIDs {
		if ids[i], err = hashID(n); err != nil {
			return Request{}, -1, err
		}
	}
	return Request{
		Arrival:      time.Duration(ms * float64(time.Millisecond)),
		InputTokens:  int(*rec.InputLength),
		OutputTokens: int(*rec.OutputLength),
		HashIDs:      ids,
	}, ns, nil
}

// Load reads a Mooncake or LMBench JSONL trace file; see ReadMooncake.
func Load(path string) ([]Request, error) { return LoadMooncake(path) }

// LoadMooncake reads a Mooncake (or LMBench) JSONL file, gzipped when its
// name ends in .gz; see ReadMooncake.
func LoadMooncake(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load mooncake trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("load mooncake trace %s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	reqs, err := ReadMooncake(r)
	if err != nil {
		return nil, fmt.Errorf("load mooncake trace %s: %w", path, err)
	}
	return reqs, nil
}

// Question is one MT-Bench question: a category and its user turns.
type Question struct {
	ID       int
	Category string
	Turns    []string
}

type mtbenchRecord struct {
	QuestionID *int     `json:"question_id"`
	Category   string   `json:"category"`
	Turns      []string `json:"turns"`
}

// ReadMTBench parses MT-Bench question JSONL
// ({"question_id","category","turns":[...]}) in file order. Every record
// needs a question_id and at least one turn.
func ReadMTBench(r io.Reader) ([]Question, error) {
	var out []Question
	err := eachLine(r, func(lineNo int, line []byte) error {
		var rec mtbenchRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("mtbench line %d: %w", lineNo, err)
		}
		if rec.QuestionID == nil {
			return fmt.Errorf("mtbench line %d: missing question_id", lineNo)
		}
		if len(rec.Turns) == 0 {
			return fmt.Errorf("mtbench line %d: no turns", lineNo)
		}
		out = append(out, Question{ID: *rec.QuestionID, Category: rec.Category, Turns: rec.Turns})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachLine calls fn for every non-blank line of r with its 1-based number.
func eachLine(r io.Reader, fn func(lineNo int, line []byte) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		if err := fn(lineNo, line); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("after line %d: %w", lineNo, err)
	}
	return nil
}
