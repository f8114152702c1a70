package mesh

import "sync"

// goneWatches fans memberlist's word that a router left or failed out to
// its watchers (the proxy ends its requests in flight through a router it
// cannot reach any more: proxy/ownerfail.go). A watcher is a function
// called synchronously on the goroutine that learned it, memberlist's,
// under memberlist's lock: it must neither block nor call into the mesh.
// No goroutine and no queue: an event is delivered at once or, with no
// watcher, not at all.
//
// memberlist does not tell a graceful leave from a failure here: its
// leave event's node carries no state (nodeState's own State field
// shadows Node's, which stays "alive"), and a router's own dead message
// is only told apart inside memberlist. A router that left is draining
// its requests in flight; one that failed is not answering them: the
// watcher tells them apart by asking the router itself.
type goneWatches struct {
	mu  sync.Mutex
	fns map[*goneWatch]struct{}
}

type goneWatch struct{ fn func(api string) }

// WatchGone calls gone with the API base URL of each router that was
// alive and that the mesh now takes for gone (memberlist's leave event: it
// left, or failed its probes and then its suspicion timeout), from now
// until stop is called. A router only suspected is not gone.
//
// gone runs on memberlist's goroutine, under its lock: it must not block,
// nor call the mesh or memberlist.
func (m *Mesh) WatchGone(gone func(api string)) (stop func()) {
	w := &goneWatch{fn: gone}
	gw := &m.mem.gone
	gw.mu.Lock()
	if gw.fns == nil {
		gw.fns = map[*goneWatch]struct{}{}
	}
	gw.fns[w] = struct{}{}
	gw.mu.Unlock()
	return func() {
		gw.mu.Lock()
		delete(gw.fns, w)
		gw.mu.Unlock()
	}
}

// notifyGone tells every watcher that the router at api is gone. It must
// be called without the mesh's locks.
func (b *membership) notifyGone(api string) {
	if api == "" {
		return
	}
	gw := &b.gone
	gw.mu.Lock()
	fns := make([]func(string), 0, len(gw.fns))
	for w := range gw.fns {
		fns = append(fns, w.fn)
	}
	gw.mu.Unlock()
	for _, fn := range fns {
		fn(api)
	}
}
