// Package hop is the protocol between kvmesh routers: a request the
// entry router forwards to the owner of the replica it chose (a hop)
// carries signed hints (Signer, Value, Parse); the owner announces its
// dispatch with a 103 that the entry watches for (Watch), so that a failed
// hop is retried only when it provably never reached a replica; the entry
// counts its hops into the owners' reported loads (Book) and ends the hops
// of an owner the mesh lost that no longer answers (Owners).
//
// A hop (a request the entry router forwards to the owner of the chosen
// replica) fails in two ways that look the same to the entry: the owner
// died or was cut off before it sent the request to its replica (retrying
// is safe) or after (a generation may be running: retrying could run it
// twice). The dispatch protocol tells them apart:
//
//   - The owner, on an authenticated hop, sends an informational
//     "103 Early Hints" with HeaderDispatched right before it writes the
//     request to its replica, and only then (if the entry is still
//     there) dispatches. It never sends it to a client, nor on a hop it
//     cannot authenticate. The 103 names the replica (HeaderReplica):
//     the entry counts the request in flight there (Book), which
//     is not its hint when the owner decided again.
//   - The entry watches its hop with httptrace. A hop that failed with no
//     such 103 and no response byte never reached a replica through that
//     owner, provided the owner speaks the protocol (below): the entry
//     retries it elsewhere, within the retry budget. After the 103 it
//     never retries.
//   - A hop that gets no byte within Config.HopDispatchTimeout is a dead
//     or partitioned owner: the entry cancels it and retries. So that the
//     owner cannot dispatch after the entry gave up, the entry sends its
//     deadline (HeaderDispatchBy, earlier than its own timeout by
//     dispatchMargin, which covers the 103's way back and clock skew) and
//     the owner refuses a hop past it with 503.
//
// Whether the owner speaks the protocol is known per connection: an owner
// of an older version (during a rolling upgrade) never sends the 103, so
// its silence proves nothing. A connection that has carried a dispatch
// 103 ends at a process that sends it on every authenticated hop, and no
// connection outlives its process (a restart, even into an older version,
// is a new connection). Without that evidence (a fresh connection, an
// older owner, a client that is not upstream.NewClient's), the entry keeps the
// conservative rule of proxy/retry.go: only a hop that provably was not sent is
// retried, and a silent owner is waited for up to the client's
// response-header timeout.
package hop
