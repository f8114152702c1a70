// Package reply reads an engine's reply as it passes through the router
// to the client: the generated answer (choice 0) and the usage, from each
// SSE chunk or the whole JSON body, by a byte-level scan built on
// internal/jsonscan. The router appends the answer to the prompt to learn
// what the engine now holds, and checks its prediction against the
// reported cached tokens.
package reply

import (
	"bytes"
	"sync"
	"sync/atomic"
)

// maxAnswerBytes bounds what the owner keeps of a response to learn the
// generated answer: a longer answer is recorded up to this length (a prefix
// of what the engine holds is still true).
const maxAnswerBytes = 4 << 20

// maxSSELine bounds one pending SSE line; a longer line is skipped.
const maxSSELine = 1 << 20

// BudgetBytes bounds what all of a router's sinks hold beyond
// freeAnswerBytes each: maxAnswerBytes and maxSSELine bound one stream,
// and without a bound on their sum 4,096 connections of long generations
// could make a router hold 16 GB of answers to record. A sink that cannot
// reserve more records the prefix it has (still true of what the engine
// holds) and skips the rest, as one past maxAnswerBytes does.
const BudgetBytes = 256 << 20

// freeAnswerBytes is what a sink holds without reserving: a typical
// answer never touches the budget (no shared counter per request).
const freeAnswerBytes = 64 << 10

// Budget bounds what all of a router's sinks hold together (BudgetBytes);
// a nil Budget bounds nothing.
type Budget struct{ left atomic.Int64 }

// NewBudget returns a budget of n bytes.
func NewBudget(n int64) *Budget {
	b := &Budget{}
	b.left.Store(n)
	return b
}

// reserve makes sure s may hold n bytes (beyond its free share),
// reserving from the budget in steps of freeAnswerBytes. Once it could
// not, the answer is full: nothing more is appended, so what is recorded
// stays a prefix.
func (s *Sink) reserve(n int) bool {
	if n <= freeAnswerBytes+s.held || s.budget == nil {
		return true
	}
	step := (n - freeAnswerBytes - s.held + freeAnswerBytes - 1) / freeAnswerBytes * freeAnswerBytes
	if s.budget.left.Add(-int64(step)) < 0 {
		s.budget.left.Add(int64(step))
		s.full = true
		return false
	}
	s.held += step
	return true
}

// maxPooledBytes is the largest buffer a released sink keeps for reuse;
// the rare huge answer's buffer goes to the garbage collector instead of
// pinning memory in the pool.
const maxPooledBytes = 64 << 10

// Sink watches the bytes of a response as they pass through to the
// client and collects the generated answer (choice 0) and the usage. It
// never changes or holds back the bytes. Each SSE data line (or the whole
// JSON body) is read by extractAnswer, a byte-level scanner that copies
// only the answer text: no per-chunk decode into Go values.
type Sink struct {
	sse    bool
	buf    []byte // SSE: the pending partial line; JSON: the body so far
	skip   bool   // SSE: drop the rest of an overlong line; JSON: body too large
	answer []byte
	fields usageFields // the usage objects so far, merged
	usage  Usage       // fields, resolved
	done   bool        // SSE: saw [DONE]
	tmp    []byte      // scratch for one chunk's answer text
	tpl    chunkTemplate
	plain  bool // never use the template (the tests' reference)
	// budget is the router's (nil: none); held is what s reserved of it.
	budget *Budget
	held   int
	full   bool // the budget was spent: the answer takes no more
}

// chunkTemplate is the shape of the last chunk that was read in full:
// the bytes before and after the one string that made up its answer, in
// a chunk without usage. Engines send the same id, model and fields in
// every delta chunk of a stream, so the next chunk is usually pre + new
// content + suf; when its middle is a well-formed string body it
// tokenizes exactly as the template did with only that string changed,
// so its answer is that string and nothing else is read. Anything else
// takes the full path, which learns the template again.
type chunkTemplate struct {
	pre, suf []byte
	ok       bool
}

var sinks = sync.Pool{New: func() any { return new(Sink) }}

// NewSink returns a sink from the pool for a response that is an SSE
// stream (sse) or one JSON body, holding beyond its free share only what
// budget grants (nil: no bound); Release returns it.
func NewSink(sse bool, budget *Budget) *Sink {
	s := sinks.Get().(*Sink)
	s.sse = sse
	s.budget = budget
	return s
}

// Answer is the answer text collected so far: valid until Release.
func (s *Sink) Answer() []byte { return s.answer }

// Usage is what the response's usage objects said, the later ones'
// fields overriding the earlier ones'.
func (s *Sink) Usage() Usage { return s.usage }

// Done reports whether an SSE stream's data: [DONE] line went by: the
// engine finished the answer, whatever becomes of the connection after.
func (s *Sink) Done() bool { return s.done }

// Release resets the sink and returns it to the pool. The sink must not
// be used afterwards.
func (s *Sink) Release() {
	if s.held > 0 {
		s.budget.left.Add(int64(s.held))
	}
	if cap(s.buf) > maxPooledBytes {
		s.buf = nil
	}
	if cap(s.answer) > maxPooledBytes {
		s.answer = nil
	}
	if cap(s.tmp) > maxPooledBytes {
		s.tmp = nil
	}
	if cap(s.tpl.pre)+cap(s.tpl.suf) > maxPooledBytes {
		s.tpl = chunkTemplate{}
	}
	*s = Sink{buf: s.buf[:0], answer: s.answer[:0], tmp: s.tmp[:0],
		tpl: chunkTemplate{pre: s.tpl.pre[:0], suf: s.tpl.suf[:0]}}
	sinks.Put(s)
}

// Feed takes the next bytes of the response body.
func (s *Sink) Feed(b []byte) {
	if !s.sse {
		if s.skip {
			return
		}
		if len(s.buf)+len(b) > maxAnswerBytes || !s.reserve(len(s.buf)+len(b)) {
			s.skip, s.buf = true, s.buf[:0]
			return
		}
		s.buf = append(s.buf, b...)
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			if !s.skip {
				if len(s.buf)+len(b) > maxSSELine || !s.reserve(len(s.answer)+len(s.buf)+len(b)) {
					s.skip, s.buf = true, s.buf[:0]
				} else {
					s.buf = append(s.buf, b...)
				}
			}
			return
		}
		line := b[:i]
		b = b[i+1:]
		if s.skip {
			s.skip = false
			continue
		}
		if len(s.buf) > 0 {
			s.buf = append(s.buf, line...)
			line = s.buf
		}
		s.line(line)
		s.buf = s.buf[:0]
	}
}

var (
	dataPrefix = []byte("data:")
	doneMarker = []byte("[DONE]")
)

// line handles one complete SSE line.
func (s *Sink) line(l []byte) {
	l = bytes.TrimSuffix(l, []byte{'\r'})
	data, ok := bytes.CutPrefix(l, dataPrefix)
	if !ok {
		return
	}
	data = bytes.TrimSpace(data)
	if bytes.Equal(data, doneMarker) {
		s.done = true
		return
	}
	s.take(data)
}

// take extracts one JSON document's answer text and usage into the sink;
// an invalid document changes nothing.
func (s *Sink) take(doc []byte) {
	if t := &s.tpl; t.ok && !s.plain && len(doc) >= len(t.pre)+len(t.suf) && bytes.HasPrefix(doc, t.pre) && bytes.HasSuffix(doc, t.suf) {
		if body, ok := stringBody(doc[len(t.pre) : len(doc)-len(t.suf)]); ok {
			s.tmp = body.appendText(s.tmp[:0])
			s.appendAnswer(s.tmp)
			return
		}
	}
	s.tmp, s.fields, s.tpl = takeFull(s.tmp[:0], doc, s.fields, s.tpl, s.sse)
	s.usage = s.fields.usage()
	s.appendAnswer(s.tmp)
}

// takeFull reads a document with the full extractor and returns its
// answer (appended to dst), the usage so far (usage with the document's
// fields merged in) and the template to use next. An invalid document
// yields nothing and keeps both.
func takeFull(dst, doc []byte, usage usageFields, tpl chunkTemplate, sse bool) ([]byte, usageFields, chunkTemplate) {
	out, u, part, hasPart, ok := extractAnswerPart(dst, doc)
	if !ok {
		return out, usage, tpl
	}
	if u.present {
		usage = usage.merge(u)
	}
	tpl.ok = false
	if sse && hasPart && !u.present {
		// part.raw sits between its quotes in doc.
		tpl.pre = append(tpl.pre[:0], doc[:part.at]...)
		tpl.suf = append(tpl.suf[:0], doc[part.at+len(part.raw):]...)
		tpl.ok = true
	}
	return out, usage, tpl
}

func (s *Sink) appendAnswer(t []byte) {
	if s.full {
		return
	}
	if room := maxAnswerBytes - len(s.answer); len(t) > room {
		t = t[:room]
	}
	if !s.reserve(len(s.answer) + len(s.buf) + len(t)) {
		return // the budget is spent: the prefix so far is recorded
	}
	s.answer = append(s.answer, t...)
}

// Finish is called once the body has ended cleanly; it reads a JSON body.
func (s *Sink) Finish() {
	if s.sse {
		if len(s.buf) > 0 && !s.skip {
			s.line(s.buf)
		}
		return
	}
	if s.skip {
		return
	}
	s.take(bytes.TrimSpace(s.buf))
}
