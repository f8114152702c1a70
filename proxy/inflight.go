package proxy

import (
	"sync"
	"time"
)

// maxFlightBlocks bounds the blocks flightBlocks keeps per replica: the
// blocks of a request past it are not kept (its prediction for the
// requests behind it only falls short, as without the set).
const maxFlightBlocks = 1 << 16

// flightBlocks is, per owned replica, the prompt blocks of the requests
// whose first byte came (the engine computed their prompt) that have not
// ended. The summary holds a prompt once the engine has computed it (its
// first byte, relay.go), but an engine that prefills requests in turn
// (vLLM's prefix cache) computes a prompt shared by requests sent
// together once, and reports it cached for each one behind the first:
// twelve first turns of one system prompt sent at once are eleven cache
// hits no summary could predict. So the predicted cached tokens (learn,
// after the response) count the blocks of the requests whose first byte
// came before this one's and were still in flight then, as well as the
// summary's match, when the engine shares them (sharesInFlight: known
// from the engine's kind, else judged by acceptedFirst). The order is the first tokens', which is the order
// the engine computed the prompts in: the headers' (vLLM sends them just
// before it hands the request to its engine) come out the other way
// round at times for two requests sent within a millisecond, and each
// was then mispredicted by a block. Placement does not read the set: a
// prompt still queued for prefill is no reason to queue another behind
// it.
type flightBlocks struct {
	mu sync.Mutex
	by map[string]map[uint64]int32
}

func newFlightBlocks() *flightBlocks {
	return &flightBlocks{by: map[string]map[uint64]int32{}}
}

// begin counts a request of hashes whose prompt the replica id has
// computed. match is how many of its leading blocks the requests it
// computed before, still in flight, bring; end, called once when the
// request ends (answered, failed or abandoned), takes its blocks out.
func (f *flightBlocks) begin(id string, hashes []uint64) (match int, end func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := f.by[id]
	for match < len(hashes) && held[hashes[match]] > 0 {
		match++
	}
	if held == nil {
		held = map[uint64]int32{}
		f.by[id] = held
	}
	kept := hashes
	if room := maxFlightBlocks - len(held); len(kept) > room {
		// A bound read before the loop (blocks already held would not
		// grow the map): the tail of a huge prompt goes uncounted.
		kept = kept[:max(room, 0)]
	}
	for _, h := range kept {
		held[h]++
	}
	return match, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, h := range kept {
			if held[h]--; held[h] <= 0 {
				delete(held, h)
			}
		}
		// held is still f.by[id] while it holds kept's blocks: emptied
		// here, it goes (a replica's set lasts no longer than its
		// requests).
		if len(kept) > 0 && len(held) == 0 {
			delete(f.by, id)
		}
	}
}

// beginFlight counts st's attempt, whose first byte owned replica id
// has just sent, in the proxy's flightBlocks and keeps its match for
// learn when the engine shared its blocks with it (shares:
// acceptedFirst); the returned func ends it.
// A function, not a method: reqState has methods enough.
func beginFlight(st *reqState, id string, shares bool) func() {
	m, end := st.p.flight.begin(id, st.hashes)
	st.flightMatch = 0
	if shares {
		st.flightMatch = m
	}
	return end
}

// sharesInFlight reports whether replica id's engine lets a request
// reuse the blocks of the requests it computed before it: as the engine
// is known to (shares, from its adapter: vLLM yes, llama.cpp no), and
// for an engine not known that way (nil shares, or known false) by the
// timing of this answer (acceptedFirst).
func sharesInFlight(shares func(id string) (bool, bool), id string, start, headed, first time.Time) bool {
	if shares != nil {
		if s, known := shares(id); known {
			return s
		}
	}
	return acceptedFirst(start, headed, first)
}

// acceptedFirst reports whether the engine answered a request's headers
// before it computed the prompt: the headers came (headed) sooner after
// the request was sent (start) than the first byte came after them
// (first). Such an engine (vLLM) queues the request behind those it
// accepted before and shares their computed blocks with it. One that
// sends its headers with the first token (llama.cpp) computed the prompt
// in a slot of its own, sharing nothing with the requests beside it:
// there, simultaneous first turns of one system prompt each report
// nothing cached, and counting the others' blocks would over-predict
// them.
func acceptedFirst(start, headed, first time.Time) bool {
	return first.Sub(headed) > headed.Sub(start)
}
