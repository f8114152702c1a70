// Package trace reads LLM-serving workload traces (the Mooncake JSONL
// format and MT-Bench questions) and turns their block hash ids into
// deterministic prompt text, so a trace can be replayed against real
// OpenAI-compatible endpoints with the trace's exact prefix sharing.
package trace

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"time"
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

// mooncakeRecord is the wire shape of one Mooncake line. Pointers tell a
// missing field from a zero one.
type mooncakeRecord struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int64   `json:"input_length"`
	OutputLength *int64   `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// ReadMooncake parses Mooncake JSONL records (one JSON object per line; blank
// lines are skipped) and returns them sorted by arrival, keeping file order
// among equal timestamps. It rejects missing or negative timestamp,
// input_length and output_length, and empty hash_ids; errors name the line.
// It does not require len(hash_ids) == ceil(input_length/512).
func ReadMooncake(r io.Reader) ([]Request, error) {
	var out []Request
	sorted := true
	err := eachLine(r, func(lineNo int, line []byte) error {
		var rec mooncakeRecord
		if err := json.Unmarshal(line, &rec); err != nil {
			return fmt.Errorf("mooncake line %d: %w", lineNo, err)
		}
		req, err := rec.request()
		if err != nil {
			return fmt.Errorf("mooncake line %d: %w", lineNo, err)
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
	if !sorted {
		sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	}
	return out, nil
}

func (rec *mooncakeRecord) request() (Request, error) {
	switch {
	case rec.Timestamp == nil:
		return Request{}, errors.New("missing timestamp")
	case rec.InputLength == nil:
		return Request{}, errors.New("missing input_length")
	case rec.OutputLength == nil:
		return Request{}, errors.New("missing output_length")
	case math.IsNaN(*rec.Timestamp) || *rec.Timestamp < 0:
		return Request{}, fmt.Errorf("negative timestamp %v", *rec.Timestamp)
	case *rec.Timestamp > float64(math.MaxInt64/int64(time.Millisecond)):
		return Request{}, fmt.Errorf("timestamp %v ms out of range", *rec.Timestamp)
	case *rec.InputLength < 0:
		return Request{}, fmt.Errorf("negative input_length %d", *rec.InputLength)
	case *rec.OutputLength < 0:
		return Request{}, fmt.Errorf("negative output_length %d", *rec.OutputLength)
	case *rec.InputLength > math.MaxInt32 || *rec.OutputLength > math.MaxInt32:
		return Request{}, errors.New("token count out of range")
	case len(rec.HashIDs) == 0:
		return Request{}, errors.New("empty hash_ids")
	}
	return Request{
		Arrival:      time.Duration(*rec.Timestamp * float64(time.Millisecond)),
		InputTokens:  int(*rec.InputLength),
		OutputTokens: int(*rec.OutputLength),
		HashIDs:      rec.HashIDs,
	}, nil
}

// LoadMooncake reads a Mooncake JSONL file; see ReadMooncake.
func LoadMooncake(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load mooncake trace: %w", err)
	}
	defer f.Close()
	reqs, err := ReadMooncake(f)
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
