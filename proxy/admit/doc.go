// Package admit decides who starts now, who waits and who is shed when
// the replicas of a model are saturated: admission from the engines'
// own signals, a bounded router-side queue with per-request deadlines,
// strict priority classes, and weighted fair queueing between tenants
// within a class.
//
// The proxy calls Admit once per request, after it has read the
// request's candidates (RoomOf turns them into the model's headroom) and
// before it decides and dispatches, and calls the release Admit returns
// when the request ends. While the model has room and nothing queues,
// Admit returns at once: a cluster that is not saturated sees no change.
//
// # Saturation
//
// A replica whose engine publishes its sequence slots (vLLM's
// max_num_seqs, SGLang's max_running_requests, or the router's learned
// estimate) has room for Slots + MaxWaiting requests in flight: its
// batch, and a short queue of its own so that a freed slot never waits
// for the router. The router's in-flight count (exact for the replicas it
// owns, the owner's gossip plus its own requests for the others) is held
// against that limit, so the room follows each dispatch and each finish
// at once, not at the next metrics scrape (requests sent to a replica
// past the mesh are not counted). A replica that publishes no slots has
// room until its engine reports MaxWaiting waiting; one that publishes
// nothing is never saturated (no signal, no queueing). A model is
// saturated when none of its replicas has room.
//
// KV cache usage, where the engine publishes it, is an opt-in veto
// (MaxKVUsage): an engine at that share has no room whatever its slots.
// It is off by default: the reading is a scrape old, and a full one
// holds the queue back until the next scrape, while an engine whose KV
// is full queues its requests anyway, which its slots and the router's
// count already bound.
//
// # Release at the end
//
// A request holds its admission until it ends, not until its first
// token: an engine's sequence slot is held through decode, so the room a
// request takes comes back when it finishes. Releasing at the first
// token would let the next wave in while the slots are still busy, and
// it would queue in the engines again.
//
// # Order
//
// Classes are strict: a queued request of a higher class always starts
// before one of a lower class, and one that arrives with only lower
// classes queued starts at once when its class has room. Queue order
// alone does not protect the high class's time to first token: an engine
// runs a started request to its end, so a high request that finds every
// slot taken by lower ones waits a whole sequence's time. So a class
// keeps free, of the slots, what the classes above it held at their peak
// over the last 10 s, plus the square root of that peak (the excess of
// random arrivals over their recent peak: square-root staffing), less
// what they hold now; and a class with traffic above it, as the low
// class always, starts only into a free slot, never into an engine's
// first-come queue. The lower classes take the wait and, past their
// deadlines, the shedding; a model served in one class reserves nothing.
// Within a class, tenants
// share by self-clocked weighted fair queueing on the request's cost (its
// estimated prompt tokens): each request gets a virtual finish time
// max(V, the tenant's last finish) + cost, and the smallest starts
// first, so a tenant that floods the queue waits behind its own requests
// while another tenant's request goes ahead. A tenant's state lives only
// while it has requests queued, so the tenants tracked are bounded by the
// queue.
//
// # Shedding
//
// Every request gets an answer: admitted, or shed with 429 (its tenant
// holds more than its share of a full queue) or 503 (the queue is full
// of requests of its class or higher, it was displaced by a higher
// class, or it cannot start within its deadline), each with a
// Retry-After from the measured drain rate. A queued request whose client
// goes away leaves the queue.
package admit
