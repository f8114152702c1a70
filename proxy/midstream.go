package proxy

import (
	"encoding/json"
	"net/http"
)

// A stream that fails after its head was sent (its upstream reset, went
// silent past the upstream idle timeout, or broke its framing) cannot
// change its status any more. Aborting the client's connection says "not
// whole", but an OpenAI client reports it as a transport failure
// (APIConnectionError in openai-python 3.x, a bare
// httpx.RemoteProtocolError in older ones, "terminated" in openai-node),
// not as the API error callers handle. Engines answer their own mid-stream failures
// with an error event: vLLM and SGLang write
// `data: {"error":{"message":...,"type":...,"code":...}}` and end the
// body, and the official SDKs raise APIError on any event whose data has
// an "error" key (openai-python's Stream.__stream__, openai-node's
// Stream). So when the response relayed is an SSE stream, the router ends
// it the same way: an error event in the endpoint's own shape
// (streamErrorEvent), then the body's normal end: on every relay path
// (relay's read and write loop, for the own client and for net/http's
// hops and TLS replicas; the stream loop hands a failure back to the
// handler, which writes the event the same way).
//
// That needs the client to be at an event boundary when the failure comes:
// the error event written after half an event would be parsed as that
// event's continuation (one broken JSON document). The relay therefore
// writes a stream's bytes up to its last complete event ("\n\n", or its
// CRLF form) and holds back the rest of a partial event until its blank
// line arrives (upstream.Framing). An SSE client cannot use a partial event
// before its blank line anyway, so holding it costs the client nothing; a
// read that ends with a whole event, which is how engines write and how
// reads nearly always end, is written at once and costs two byte
// comparisons. A failure then drops the held part: what the client got is
// exactly the whole events before the failure, then the error event. An
// event longer than the relay's buffer (32 KB) is passed on in pieces;
// a failure inside one aborts the connection, the only signal left once
// part of the event is sent.
//
// Other responses keep the aborted connection: a JSON body cut short must
// not look complete, and there is no way to append an error to a JSON
// document already half sent (a chunked body that ends normally would
// hand the client a truncated document as if whole). The same holds for
// an SSE response with a Content-Length, whose body cannot be extended;
// and [DONE] is never written after the error event, since it is the one
// completeness marker of clients that do not read "error".

// Causes of a mid-stream failure (the cause label of
// kvmesh_upstream_midstream_failures_total).
const (
	midstreamIdle  = "idle_timeout"
	midstreamError = "upstream_error"
	// midstreamOwnerGone: a hop's owner router left the mesh and did not
	// answer (hop.Owners); its event's code is hop.CodeOwnerGone.
	midstreamOwnerGone = "owner_gone"
	// midstreamStalled: the replica was judged stalled (stall.go) and
	// ejected.
	midstreamStalled = "stalled"
)

// How a failed stream ended for its client (the end label).
const (
	endErrorEvent = "error_event"
	endAborted    = "aborted"
)

// Codes of the error event (OpenAI's error.code, a string).
const (
	codeUpstreamTimeout = "upstream_timeout"
	codeUpstreamError   = "upstream_error"
)

// streamErrorEvent is the SSE error event that ends a failed stream of
// the endpoint at path: OpenAI's error envelope for chat and completions
// (as vLLM and SGLang write it, and as the SDKs check for it), the
// Responses API's error event (event: error, its type, code and message
// at the top level), and Anthropic's error event for /v1/messages.
func streamErrorEvent(path, code, msg string) []byte {
	var b []byte
	switch path {
	case "/v1/messages":
		type body struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		}
		d, _ := json.Marshal(struct {
			Type  string `json:"type"`
			Error body   `json:"error"`
		}{"error", body{"api_error", msg}})
		b = append([]byte("event: error\ndata: "), d...)
	case "/v1/responses":
		d, _ := json.Marshal(struct {
			Type    string  `json:"type"`
			Code    string  `json:"code"`
			Message string  `json:"message"`
			Param   *string `json:"param"`
		}{"error", code, msg, nil})
		b = append([]byte("event: error\ndata: "), d...)
	default:
		// errorJSON ends its line; the blank line ends the event.
		return append(append([]byte("data: "), errorJSON(http.StatusBadGateway, "server_error", code, msg)...), '\n')
	}
	return append(b, "\n\n"...)
}
