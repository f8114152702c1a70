package mesh

// Membership: memberlist, its configuration and lifecycle (joining,
// re-joining failed peers), and the routers it reports, under a lock of
// its own. What ownership and the view need of a router, membership
// hands the table (table.setRouter) after its own lock is released.

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
)

// member is one router as memberlist last reported it.
type member struct {
	node     memberlist.Node // a copy: memberlist mutates its own under its lock
	meta     nodeMeta
	wire     wireVersion // the highest it decodes, as it last advertised (delegate.go)
	alive    bool
	failedAt time.Time
	rtt      time.Duration
}

// membership is the router's memberlist and the routers it knows.
type membership struct {
	*env
	tab        *table // told what ownership and the view need of each router
	contractID string
	meta       []byte // this router's node metadata
	ml         *memberlist.Memberlist
	guard      *guardedTransport // nil with Config.Transport (transport.go)
	numAlive   atomic.Int64
	// gone are the watchers of routers that left or failed (gonewatch.go).
	gone goneWatches

	// mu guards members and refused. Nothing else is locked under it.
	mu      sync.RWMutex
	members map[string]*member
	refused map[string]time.Time // last log line per refused peer
}

func newMembership(e *env) *membership {
	b := &membership{env: e, contractID: e.cfg.Contract.ID() + protocol,
		members: map[string]*member{}, refused: map[string]time.Time{}}
	b.numAlive.Store(1)
	return b
}

// start creates the memberlist, with the delegate handing gossip to rep.
func (b *membership) start(rep *replication) error {
	meta := nodeMeta{Region: b.cfg.Region, API: b.cfg.APIAddr, Contract: b.contractID}.encode()
	if len(meta) > memberlist.MetaMaxSize {
		return fmt.Errorf("mesh: node metadata is %d bytes, over memberlist's %d", len(meta), memberlist.MetaMaxSize)
	}
	b.meta = meta
	mc, err := b.memberlistConfig()
	if err != nil {
		return err
	}
	d := &delegate{mem: b, rep: rep}
	mc.Delegate, mc.Events, mc.Alive, mc.Merge, mc.Ping = d, d, d, d, d
	ml, err := memberlist.Create(mc)
	if err != nil {
		if b.cfg.Transport == nil {
			_ = mc.Transport.Shutdown() // ours: release the sockets
		}
		return fmt.Errorf("mesh: creating memberlist: %w", err)
	}
	b.ml = ml
	return nil
}

func (b *membership) memberlistConfig() (*memberlist.Config, error) {
	cfg, t := b.cfg, b.cfg.Timing
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.Logger = cfg.Logger.Named("memberlist").StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})
	mc.GossipInterval, mc.PushPullInterval = t.GossipInterval, t.PushPullInterval
	mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult, mc.TCPTimeout = t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult, t.TCPTimeout
	mc.GossipToTheDeadTime = 30 * t.ProbeInterval
	mc.DeadNodeReclaimTime = 30 * t.ProbeInterval // a restarted router may come back on another address
	mc.UDPBufferSize = udpBufferSize
	// The mesh's payloads are Rice-coded deltas and Bloom bits, which LZW
	// does not shrink; compressing every stream cost more CPU than the
	// batches themselves.
	mc.EnableCompression = false
	// The wire version (wireversion.go's wireVersion): the maximum says what
	// this router decodes; the minimum and current stay wireBase, which
	// every router speaks, or memberlist would refuse the routers from
	// before versioning, which advertise 0, 0, 0.
	mc.DelegateProtocolMin, mc.DelegateProtocolVersion, mc.DelegateProtocolMax = uint8(wireBase), uint8(wireBase), uint8(b.wire)
	if cfg.SecretKey != nil {
		mc.SecretKey = append([]byte(nil), cfg.SecretKey...)
	}
	if cfg.BindAddr != "" {
		host, port, err := splitHostPort(cfg.BindAddr)
		if err != nil {
			return nil, fmt.Errorf("mesh: bind address %q: %w", cfg.BindAddr, err)
		}
		mc.BindAddr, mc.BindPort, mc.AdvertisePort = host, port, port
	}
	if cfg.AdvertiseAddr != "" {
		host, port, err := splitHostPort(cfg.AdvertiseAddr)
		if err != nil {
			return nil, fmt.Errorf("mesh: advertise address %q: %w", cfg.AdvertiseAddr, err)
		}
		mc.AdvertiseAddr, mc.AdvertisePort = host, port
	}
	if err := b.guardTransport(mc); err != nil { // transport.go
		return nil, err
	}
	b.withDeadlines(mc) // deadline.go
	return mc, nil
}

func splitHostPort(s string) (string, int, error) {
	host, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, port, nil
}

// joinLoop joins the seeds with backoff until one answers, then, every
// ReconnectInterval, re-joins failed peers (for FailedPeerTimeout) and
// every seed not all in the mesh (for ever, re-resolving DNS names):
// memberlist never re-joins a dead node by itself, so this is what heals a
// partition, whatever its length. Between reconnects it expires the
// declarations peers stopped asserting.
func (b *membership) joinLoop() {
	defer b.wg.Done()
	if len(b.cfg.Join) > 0 {
		backoff := b.cfg.Timing.ProbeInterval
		for {
			n, err := b.ml.Join(b.cfg.Join)
			if err == nil && n > 0 {
				b.log.Info("joined mesh", "seeds", b.cfg.Join, "contacted", n)
				break
			}
			b.log.Warn("join failed; retrying", "seeds", b.cfg.Join, "error", err, "in", backoff)
			if !b.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
	t := b.cfg.Timing
	period := min(t.ReconnectInterval, max(t.DeclarationTTL/4, t.StateInterval))
	lastReconnect := time.Now()
	for b.sleep(period) {
		now := time.Now()
		b.tab.expireDeclarations(now)
		if now.Sub(lastReconnect) < t.ReconnectInterval {
			continue
		}
		lastReconnect = now
		b.reconnect(now)
	}
}

// reconnect re-joins up to three failed peers (remembered for
// FailedPeerTimeout) and every seed that is missing; when a peer is
// missing but no seed is, one seed as well.
func (b *membership) reconnect(now time.Time) {
	var addrs []string
	alive := map[string]bool{b.ml.LocalNode().Address(): true}
	var forgotten []string
	b.mu.Lock()
	for name, mb := range b.members {
		if mb.alive {
			alive[mb.node.Address()] = true
			continue
		}
		if now.Sub(mb.failedAt) > b.cfg.Timing.FailedPeerTimeout {
			delete(b.members, name)
			forgotten = append(forgotten, name)
			continue
		}
		addrs = append(addrs, mb.node.Address())
	}
	b.mu.Unlock()
	for _, name := range forgotten {
		b.tab.forgetRouter(name)
	}
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	addrs = addrs[:min(len(addrs), 3)]
	ctx, cancel := context.WithTimeout(b.ctx, min(b.cfg.Timing.TCPTimeout, 5*time.Second))
	seeds := missingSeeds(b.cfg.Join, int(b.ml.LocalNode().Port), func(host string) ([]string, error) {
		return net.DefaultResolver.LookupHost(ctx, host)
	}, alive)
	cancel()
	if len(addrs) > 0 && len(seeds) == 0 && len(b.cfg.Join) > 0 {
		// A known peer is missing though every seed is here: ask one seed,
		// which may know where it went (one push/pull per round, not one
		// per seed: each carries full summaries).
		seeds = []string{b.cfg.Join[rand.IntN(len(b.cfg.Join))]}
	}
	addrs = append(addrs, seeds...)
	if len(addrs) == 0 {
		return
	}
	if n, err := b.ml.Join(addrs); n > 0 {
		b.log.Debug("reconnected", "addrs", addrs, "contacted", n)
	} else {
		b.log.Debug("reconnect failed", "addrs", addrs, "error", err)
	}
}

// upsert records memberlist's word on a router, then hands the table
// what it needs of it, and tells the watchers of a router gone.
func (b *membership) upsert(n *memberlist.Node, alive bool) {
	meta, _ := decodeMeta(n.Meta) // alive delegate checked it
	node := *n
	node.Meta = bytes.Clone(n.Meta)
	b.mu.Lock()
	mb := b.members[n.Name]
	if mb == nil {
		mb = &member{}
		b.members[n.Name] = mb
	}
	mb.node, mb.meta, mb.wire = node, meta, wireVersion(n.DMax)
	if mb.alive && !alive {
		mb.failedAt = time.Now()
	}
	gone := mb.alive && !alive && n.Name != b.cfg.Name
	if !mb.alive && alive && n.Name != b.cfg.Name {
		// A peer came: the changes no tick sent while there was none
		// go now (beaconTick reads nothing without a peer).
		wakeBeacons(b.beaconWake)
	}
	mb.alive = alive
	var k int64
	for _, x := range b.members {
		if x.alive {
			k++
		}
	}
	if b.members[b.cfg.Name] == nil {
		k++
	}
	b.numAlive.Store(max(k, 1))
	b.mu.Unlock()
	b.tab.setRouter(n.Name, alive, meta)
	if gone {
		b.notifyGone(meta.API)
	}
}

// pinged records the RTT of a direct probe.
func (b *membership) pinged(name string, rtt time.Duration) {
	b.mu.Lock()
	mb := b.members[name]
	if mb != nil {
		if mb.rtt == 0 {
			mb.rtt = rtt
		} else {
			mb.rtt = (mb.rtt*7 + rtt) / 8 // smooth: one slow probe should not flip a route
		}
		rtt = mb.rtt
	}
	b.mu.Unlock()
	if mb != nil {
		b.tab.setRTT(name, rtt) // the entries of the replicas it owns carry it
	}
}

// list describes the routers this router knows, sorted by name.
func (b *membership) list() []MemberInfo {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make([]MemberInfo, 0, len(b.members))
	for name, mb := range b.members {
		st := "failed"
		if mb.alive {
			st = "alive"
		}
		out = append(out, MemberInfo{Name: name, Region: mb.meta.Region, API: mb.meta.API, Addr: mb.node.Address(),
			State: st, RTTMs: float64(mb.rtt.Microseconds()) / 1000, Self: name == b.cfg.Name, Wire: int(mb.wire)})
	}
	slices.SortFunc(out, func(x, y MemberInfo) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// peerAPIs lists the API base URLs of the other routers alive, sorted.
func (b *membership) peerAPIs() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []string
	for name, mb := range b.members {
		if name != b.cfg.Name && mb.alive && mb.meta.API != "" {
			out = append(out, mb.meta.API)
		}
	}
	slices.Sort(out)
	return out
}

// aliveNode returns the node of router name while it is alive.
func (b *membership) aliveNode(name string) (memberlist.Node, bool) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if mb := b.members[name]; mb != nil && mb.alive {
		return mb.node, true
	}
	return memberlist.Node{}, false
}

// peerNode is what a peer's sender needs of a router.
type peerNode struct {
	node  memberlist.Node
	wire  wireVersion
	alive bool
}

// peerNodes returns every other router membership remembers.
func (b *membership) peerNodes() map[string]peerNode {
	b.mu.RLock()
	defer b.mu.RUnlock()
	out := make(map[string]peerNode, len(b.members))
	for name, mb := range b.members {
		if name != b.cfg.Name {
			out[name] = peerNode{node: mb.node, wire: mb.wire, alive: mb.alive}
		}
	}
	return out
}

// liveWires lists the wire versions of the other routers alive.
func (b *membership) liveWires() []wireVersion {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var live []wireVersion
	for name, mb := range b.members {
		if mb.alive && name != b.cfg.Name {
			live = append(live, mb.wire)
		}
	}
	return live
}
