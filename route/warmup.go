package route

// The warm-up share: a replica holding far fewer blocks than the others
// of its tier (Candidate.Held: new, or emptied by a restart, whose summary
// the owner cut) takes a share of the cold requests, those no replica
// holds beyond the common prefix, until it holds more. Without it, a
// replica added to a warm cluster gets cold requests only where its
// empty queue makes it the shortest wait, or where this router's recent
// placements wrote least (Detail.Written, which a restart does not
// empty): on a lightly loaded cluster it can sit with nothing cached
// while every next turn goes to the others. SMG sends a cold request to
// the worker with the smallest prefix tree for the same reason.
//
// The share is bounded two ways. By the key: only the cold requests
// whose key falls in WarmShare of the key space go to warming replicas
// (the rest are placed as always), so the new conversations that start
// there, and come back there for their next turns, are a bounded part
// of all. By load: a warming replica takes one only while it passes the
// cold limits (it can start the request at once, and its queued prefill
// is within LoadFactor of the mean), so a burst of cold prefills does
// not queue there: no latency cliff. The key's share is computed alike
// by every router, and Held is read from the replica's summary, which
// every router's copy agrees on, so routers owning different replicas
// give a warming replica the same share without telling each other.

// warmSalt separates the warm-up share's hash of the key from the
// rendezvous weights.
const warmSalt = 0x7761726d75702121

// inWarmShare reports whether a cold request with key is one of the
// WarmShare of cold requests a warming replica may take.
func (p Policy) inWarmShare(key uint64) bool {
	return p.WarmShare > 0 && float64(weight(key, warmSalt)>>11) < p.WarmShare*(1<<53)
}

// warmUp is the warming replica that takes a cold request with key, or
// -1: among the candidates of f's tier whose summary counts, the one
// that f admits (the cold limits) holding the fewest blocks (ties in
// rendezvous order), when it holds less than half the mean of those
// candidates. With every replica near empty (a cluster starting) the
// mean is near zero and none is warming. The first pass reads only the
// held counts, and ends the usual decision, in which no replica is
// warming; the limits and the weights are asked of warming replicas
// alone.
func (p Policy) warmUp(cands []Candidate, f coldFilter, key uint64) int {
	var sum, least float64
	n := 0
	for i := range cands {
		c := &cands[i]
		if int(c.Tier) != f.tier || c.Stale || c.Summary == nil {
			continue
		}
		h := float64(c.Held)
		if n == 0 || h < least {
			least = h
		}
		sum += h
		n++
	}
	if n < 2 || 2*least*float64(n) >= sum {
		return -1
	}
	best := -1
	var bestHeld int32
	var bestW uint64
	for i := range cands {
		c := &cands[i]
		if int(c.Tier) != f.tier || c.Stale || c.Summary == nil {
			continue
		}
		h := c.Held
		if 2*float64(h)*float64(n) >= sum || !f.eligible(c) {
			continue
		}
		if w := weight(key, c.Hash); best < 0 || h < bestHeld || (h == bestHeld && w > bestW) {
			best, bestHeld, bestW = i, h, w
		}
	}
	return best
}
