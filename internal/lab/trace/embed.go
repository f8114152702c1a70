package trace

import (
	"bytes"
	"compress/gzip"
	_ "embed"
	"fmt"
)

// conversationSlice is the first 10 minutes of the Mooncake conversation
// trace; see testdata/README.md for its origin and licence.
//
//go:embed testdata/mooncake_conversation_slice.jsonl
var conversationSlice []byte

// conversationTraceGz is the whole Mooncake conversation trace, gzipped;
// see testdata/README.md for its origin and licence.
//
//go:embed testdata/mooncake_conversation_trace.jsonl.gz
var conversationTraceGz []byte

// EmbeddedConversationSlice returns the first 10 minutes (timestamp < 600 s,
// 1,750 requests) of the Mooncake conversation trace, built into the binary
// so demos and tests need no files. It parses afresh on every call, so
// callers may modify the result. It panics only if the committed data is
// corrupt.
func EmbeddedConversationSlice() []Request {
	reqs, err := ReadMooncake(bytes.NewReader(conversationSlice))
	if err != nil {
		panic(fmt.Sprintf("trace: embedded conversation slice: %v", err))
	}
	return reqs
}

// EmbeddedConversationTrace returns the whole Mooncake conversation trace
// (one hour, 12,031 requests), built into the binary gzipped so that the
// simulator's envelope check runs on a fresh checkout. It parses afresh on
// every call, so callers may modify the result. It panics only if the
// committed data is corrupt.
func EmbeddedConversationTrace() []Request {
	zr, err := gzip.NewReader(bytes.NewReader(conversationTraceGz))
	if err != nil {
		panic(fmt.Sprintf("trace: embedded conversation trace: %v", err))
	}
	reqs, err := ReadMooncake(zr)
	if err != nil {
		panic(fmt.Sprintf("trace: embedded conversation trace: %v", err))
	}
	return reqs
}
