package summary

// Resizing: a summary's geometry (its bits, and so where every key lives)
// follows from its capacity, and the filter keeps no hashes, so a summary
// of another capacity cannot be derived from the bits. But a replica's
// capacity in blocks does change while it serves: the router learns how
// many bytes of prompt text the engine's tokens stand for, and its cache
// of a fixed number of tokens is then more or fewer blocks. Starting an
// empty summary then would forget every prefix the replica holds, and the
// next turn of every conversation there would be placed as if cold.
//
// So the owner remembers the hashes it added to each generation (kept,
// cleared with its generation at a rotation, as the bits are), and
// Resized replays them, older generation first, into a summary of the new
// size: it then remembers what the old one did, as far as the new
// capacity reaches (a smaller one rotates on the way, keeping the most
// recent), less the blocks found not held. Copies keep no hashes (they
// learn keys from deltas), so a copy that became the owner resizes empty;
// its next records fill it.
//
// The hashes cost 8 bytes per remembered block on the owner only, at most
// maxKeptPerGen per generation (a generation that adds more keeps its
// most recent: 65,536 blocks of 1 KiB text is 16M tokens, beyond the
// cache of one replica of today's engines).

const maxKeptPerGen = 1 << 16

// keptHashes is one generation's added hashes, a ring once full.
type keptHashes struct {
	h    []uint64
	next int // where the next hash goes once h is full
}

func (k *keptHashes) add(h uint64, limit int) {
	if len(k.h) < limit {
		k.h = append(k.h, h)
		return
	}
	if limit == 0 {
		return
	}
	k.h[k.next] = h
	k.next = (k.next + 1) % len(k.h)
}

// ordered appends the kept hashes to dst, oldest first.
func (k *keptHashes) ordered(dst []uint64) []uint64 {
	dst = append(dst, k.h[k.next:]...)
	return append(dst, k.h[:k.next]...)
}

func (k *keptHashes) clear() { k.h, k.next = k.h[:0], 0 }

// keptLimit is how many hashes a generation keeps: all it can hold.
func keptLimit(g geometry) int { return min(g.perGen, maxKeptPerGen) }

// Resized returns a summary of params p and epoch (a new history: copies
// take it as a full copy) that holds what s holds as far as s's owner
// remembers: the blocks added to its generations, replayed older first
// (the LRU order, so a smaller summary keeps the most recent), without
// those forgotten since. It reports how many hashes it replayed. (A
// function rather than a method: Summary's methods are its readers' and
// its log's.)
func Resized(s *Summary, p Params, epoch uint64) (*Summary, int, error) {
	n, err := New(p, epoch)
	if err != nil {
		return nil, 0, err
	}
	s.mu.RLock()
	older, newer := &s.kept[1-s.cur], &s.kept[s.cur]
	hashes := make([]uint64, 0, len(older.h)+len(newer.h))
	hashes = newer.ordered(older.ordered(hashes))
	live := hashes[:0]
	for _, h := range hashes {
		if _, gone := s.neg[s.geo.key(probeOf(h))]; !gone {
			live = append(live, h)
		}
	}
	s.mu.RUnlock()
	n.Add(live)
	return n, len(live), nil
}
