package trace

import (
	"bytes"
	_ "embed"
	"fmt"
)

// conversationSlice is the first 10 minutes of the Mooncake conversation
// trace; see testdata/README.md for its origin and licence.
//
//go:embed testdata/mooncake_conversation_slice.jsonl
var conversationSlice []byte

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
