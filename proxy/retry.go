package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/proxy/upstream"
)

// DefaultRetryBudget is the default time from a request's first upstream
// attempt within which another attempt may start.
const DefaultRetryBudget = 10 * time.Second

// A POST to an LLM is not idempotent: a generation that started once and
// is started again costs a second generation, and a client that saw an
// error retries a third. So, like Caddy's reverse proxy (which retries a
// non-idempotent request only when the dial failed), the router tries
// another candidate only when the request provably never reached a
// replica:
//
//   - the connection was never made (dial error: refused, unreachable,
//     DNS, dial timeout) or its TLS handshake failed: not a byte of the
//     request was written;
//   - the upstream answered 429 or 503 before the router sent anything
//     more: a refusal, by RFC 9110 and by every OpenAI server, means the
//     request was not processed;
//   - the router itself gave up before sending (the candidate vanished,
//     or a peer's API is not https while peer TLS is required).
//
// Every other failure (reset or EOF after the request was written, a
// response-header timeout, a 500/502/504) may mean a generation is
// running, and is reported to the client instead. net/http's own replay
// of a request on a reused keep-alive connection that the server closed
// first is safe by the same rule: it replays a POST only when nothing
// was written (or the client sent an Idempotency-Key).

// neverReached reports whether err from http.Client.Do proves the request
// never reached the upstream.
func neverReached(err error) bool {
	if op, ok := errors.AsType[*net.OpError](err); ok && op.Op == "dial" {
		return true
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return true
	}
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return true // an upstream speaking plain HTTP to our TLS
	}
	if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		return true
	}
	if _, ok := errors.AsType[x509.HostnameError](err); ok {
		return true
	}
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return true
	}
	return false
}

// refused reports whether an upstream status says the request was refused
// unprocessed, so another replica may take it.
func refused(status int) bool {
	return status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests
}

// maxRefusedDrain is how much of a refused response's body is read so
// that its connection can carry the next request.
const maxRefusedDrain = 64 << 10

// refusedDrainTimeout bounds the drain of a refused response before the
// retry, and the idle timeout does when it is shorter. A refusal's body
// is a short error document sent with its head, so it is there at once
// or not at all; the drain only saves a later dial, and the client's
// retry waits on it. An upstream that sends a 503's head and then
// stalls its body would otherwise hold the request for as long as it
// stalls, with no idle timeout (the relay's watch starts only for a
// response that is relayed) nor any other bound.
const refusedDrainTimeout = time.Second

// drainRefused reads what there is of a refused response's body, up to
// maxRefusedDrain and for at most refusedDrainTimeout (or the upstream
// idle timeout when it is shorter). A drain cut short leaves the body
// unfinished, so its connection is closed rather than pooled. cancel,
// when not nil, cancels the net/http request resp answers; idle is the
// upstream idle timeout (<= 0: none).
func drainRefused(resp *http.Response, cancel func(), idle time.Duration) {
	d := refusedDrainTimeout
	if t := idle; t > 0 && t < d {
		d = t
	}
	if b, ok := resp.Body.(*upstream.Body); ok {
		// The own client's read fails on the connection's deadline; a
		// connection read to its body's end goes back without one.
		_ = b.Conn().SetReadDeadline(time.Now().Add(d))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxRefusedDrain))
		_ = b.Conn().SetReadDeadline(time.Time{})
		return
	}
	if cancel != nil {
		t := time.AfterFunc(d, cancel)
		defer t.Stop()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxRefusedDrain))
}

// answerUnreached answers a request none of whose attempts reached a
// replica: 502 to a client. To a hop's entry router it is 503, which the
// entry reads as a refusal (nothing was dispatched) and tries another
// router's replica while it may: an owner whose one replica of the kind
// died before its health checks noticed would otherwise cost that
// request (a decode replica killed mid-stream: every decode leg sent
// through its owner until then).
func answerUnreached(st *reqState) int {
	msg := fmt.Sprintf("all %d upstream attempts for the model '%s' failed", st.attempts, st.prompt.Model)
	if st.hop {
		return writeRetryLater(st.w, http.StatusServiceUnavailable, time.Second, msg+"; none reached a replica")
	}
	return writeError(st.w, http.StatusBadGateway, msg)
}
