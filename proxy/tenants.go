package proxy

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/proxy/prompt"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/kvmesh/kvmesh/proxy/reply"
	"github.com/zeebo/xxh3"
)

// The tenant of a request, and its token budget (package quota): a
// request is charged its estimated input tokens and reserved output
// tokens before it may queue or dispatch, and the charge is corrected to
// the engine's usage when it ends. The router that admits a request
// counts it, a hop's owner does not.

// Seeds of the tenant hashes, one per source of the identity, so one
// value from two sources does not name one tenant.
const (
	tenantByKey    = 0x74656e616e740001
	tenantByHeader = 0x74656e616e740002
	tenantByAddr   = 0x74656e616e740003
)

// tenantOf identifies the tenant of a request with headers h from addr
// (admission's fair queueing, and the tenant's token budget); keyed: the
// router checks API keys.
func tenantOf(h http.Header, addr string, keyed bool) uint64 {
	key := bearerKey(h)
	switch {
	case keyed && key != "":
		return xxh3.HashStringSeed(key, tenantByKey)
	case h.Get(admit.HeaderTenant) != "":
		return xxh3.HashStringSeed(h.Get(admit.HeaderTenant), tenantByHeader)
	case key != "":
		return xxh3.HashStringSeed(key, tenantByKey)
	}
	return xxh3.HashStringSeed(addr, tenantByAddr)
}

// TenantKeys are the tenant hashes a name stands for in a budgets file:
// as an API key, as an X-Kvmesh-Tenant value and as a client address,
// whichever identifies the tenant (tenantOf).
func TenantKeys(name string) [3]uint64 {
	return [3]uint64{xxh3.HashStringSeed(name, tenantByKey), xxh3.HashStringSeed(name, tenantByHeader),
		xxh3.HashStringSeed(name, tenantByAddr)}
}

// spent is what an engine reported a request used, as its answer went
// by: its usage, and the answer's bytes (read: a sink read them).
type spent struct {
	usage  reply.Usage
	answer int
	read   bool
}

// spentOf reads a sink before it is released (nil: nothing read).
func spentOf(s *reply.Sink) spent {
	if s == nil {
		return spent{}
	}
	return spent{usage: s.Usage(), answer: len(s.Answer()), read: true}
}

// chargeTenant charges a request of tenant with prompt pr to l at
// bytesPerToken; when the budget is spent it answers 429
// rate_limit_exceeded with Retry-After and reports false.
func chargeTenant(w http.ResponseWriter, l *quota.Ledger, bytesPerToken float64, tenant uint64, pr *prompt.Prompt) (quota.Ticket, int, bool) {
	in := int64(math.Ceil(float64(len(pr.Text)) / bytesPerToken))
	t, d := l.Reserve(tenant, in, pr.MaxTokens)
	if d.OK {
		return t, 0, true
	}
	h := w.Header()
	h.Set("X-Ratelimit-Limit-Tokens", strconv.FormatInt(d.Limit, 10))
	h.Set("X-Ratelimit-Remaining-Tokens", strconv.FormatInt(max(d.Limit-d.Used, 0), 10))
	h.Set("X-Ratelimit-Reset-Tokens", d.RetryAfter.Round(time.Millisecond).String())
	secs := max(int((d.RetryAfter+time.Second-1)/time.Second), 1)
	h.Set("Retry-After", strconv.Itoa(secs))
	msg := fmt.Sprintf("Rate limit reached for this tenant on %s tokens per %v: limit %d, used %d mesh-wide; please try again in %ds",
		d.Kind, l.Window(), d.Limit, d.Used, secs)
	return quota.Ticket{}, writeErrorCode(w, http.StatusTooManyRequests, "tokens", codeRateLimited, msg), false
}

// settleTokens corrects a request's charge t to what it used (it ended
// with status code, its relay read sp): the engine's usage when it
// reported it (prompt and completion tokens, in any API's field names:
// reply.Usage), else the estimate for the
// input and the answer's bytes at bytesPerToken for the output; a
// request no engine answered with success settles at nothing.
func settleTokens(l *quota.Ledger, t quota.Ticket, code int, sp spent, bytesPerToken float64) {
	if !t.Held() {
		return
	}
	answered := code >= 200 && code < 300 || code == statusClientGone && sp.read
	if !answered {
		l.Settle(t, 0, 0)
		return
	}
	u := sp.usage
	in, out := int64(-1), int64(0)
	if u.PromptTokens > 0 {
		in = u.PromptTokens
	}
	switch {
	case u.Present:
		out = u.CompletionTokens
	case sp.read:
		out = int64(math.Ceil(float64(sp.answer) / bytesPerToken))
	}
	l.Settle(t, in, out)
}

// reserveTokens charges st to its tenant's token budget before it may
// queue (a step of the request path, inference, before admission): input tokens
// estimated from the prompt's bytes at the replicas' learned bytes per
// token, output reserved at its max_tokens (else the tenant's mean). A
// hop was charged by the router it entered. When the budget is spent it
// answers 429 and reports false.
func reserveTokens(st *reqState) bool {
	p := st.p
	if p.cfg.Quota == nil || st.hop {
		return true
	}
	var ok bool
	tenant := tenantOf(st.r.Header, clientAddr(st.r), p.cfg.APIKeys != nil)
	st.quota, st.code, ok = chargeTenant(st.w, p.cfg.Quota, p.ratios.Overall(), tenant, &st.prompt)
	return ok
}
