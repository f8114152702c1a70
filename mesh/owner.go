package mesh

import "github.com/zeebo/xxh3"

// ownerOf is the ownership rule, a pure function so every router that
// knows the same declarers and the same live set picks the same owner:
// rendezvous (highest random weight) hashing of each live declarer's name
// with the replica's ID; ties, which need a 64-bit collision, go to the
// smaller name. It returns "" when no declarer is alive.
//
// Rendezvous hashing moves a replica only when its owner goes or a new
// declarer wins it, never because an unrelated router joined.
func ownerOf(replicaID string, declarers map[string]bool, live func(name string) bool) string {
	best, bestH := "", uint64(0)
	for d := range declarers {
		if !live(d) {
			continue
		}
		h := ownerWeight(d, replicaID)
		if best == "" || h > bestH || (h == bestH && d < best) {
			best, bestH = d, h
		}
	}
	return best
}

// ownerWeight is a router's rendezvous weight for a replica.
func ownerWeight(router, replicaID string) uint64 {
	return xxh3.HashString(router + "\x00" + replicaID)
}
