// Package quota enforces tenants' token budgets across the whole mesh:
// input and output tokens per window (a minute by default) per tenant,
// counted by every router and agreed through gossip, with no central
// store.
//
// # Counting
//
// Each router counts what it admits, per tenant, in buckets of
// Window/Buckets of wall-clock time (every router cuts the same buckets
// from the Unix epoch). A request is charged when it is admitted: its
// input tokens estimated from the prompt's bytes, its output tokens
// reserved (the request's max_tokens, else the tenant's mean output on
// this router); when it ends the charge is corrected to the engine's
// usage (Settle), in the bucket it was charged to: prompt_tokens and
// completion_tokens, or the Responses and Messages APIs' input_tokens
// (with Anthropic's cache_read_input_tokens and
// cache_creation_input_tokens, which its input_tokens leaves out) and
// output_tokens, streamed or whole (package reply reads them). A tenant's usage "in the window" at time t is the
// sum of the buckets that overlap [t-Window, t]: Buckets+1 of them, so
// that the tokens admitted in any interval of length Window are never
// more than what one check saw (a sliding window, read a bucket
// conservatively; a tenant at its budget gets about Buckets/(Buckets+1)
// of it per Window in steady state).
//
// # Agreeing
//
// A router gossips its own counts (AppendGossip, every Interval, by the
// mesh to every peer that reads them) and merges its peers'
// (MergeGossip). Each bucket of each router is a PN-counter: two
// counters that only grow, tokens charged and tokens given back by a
// correction, for input and for output. Only the router that owns them
// writes them, so a merge takes the larger of each counter per (router,
// incarnation, bucket), and a tenant's mesh-wide usage is the sum over
// routers: merges commute and repeat harmlessly, and a message lost or
// reordered is made good by the next (each carries every live bucket).
// Old buckets leave with the window. A message carries at most
// WireTenants tenants, the router's heaviest in the window; the others
// are summed into one "rest" entry (shown, not enforced: a tenant outside
// a router's top WireTenants is counted there by that router alone until
// it is heavy enough to be listed).
//
// # Admitting
//
// A router admits a request when the tenant's mesh-wide usage plus the
// request's estimate fits the budget, and when its own admissions since
// its last gossip, with this one, times N (the routers heard within
// three intervals, itself included) fit what is left: every router may
// take only its share of the headroom between two gossips, so that N
// routers that see the same room do not each fill it. One request per
// interval is always allowed when it fits the mesh-wide room, so a
// request larger than a share is not refused forever. Over budget the
// answer is 429 rate_limit_exceeded with Retry-After: the time until
// enough of the window's oldest buckets leave it (or the next gossip,
// when only the share held the request back).
//
// # Bounds
//
// Connected routers: what the mesh admits for a tenant in any window is
// the budget plus at most (N-1) requests' estimates per gossip interval
// in which the tenant's room ran out, plus the error of the estimates
// (input bytes per token; output reserved at max_tokens is given back,
// output beyond a reservation is charged when the request ends).
//
// Partitioned: each side sees its own routers' usage live and the other
// sides' as last heard, which leaves the window as it ages. Each side
// then admits up to the budget on its own, so the mesh admits at most
// P × budget in any window overlapping a partition into P sides (a side
// whose routers all fail admits nothing). With StaleShare, a router
// that has not been heard for three intervals, but within the window, is
// assumed to use at least its share (budget / the routers heard within
// the window) on the far side: the sides then together admit at most the
// budget for a partition shorter than the window, at the price of that
// share being held back for up to a window after a router stops for
// good. During a rolling upgrade, routers that do not gossip usage count
// what they admit for no one but themselves.
//
// Clocks: buckets are wall-clock; a router whose clock is off by d
// counts its peers' buckets d early or late. Routers more than a bucket
// ring apart refuse each other's usage (MergeGossip's error).
package quota
