package mesh

import "github.com/kvmesh/kvmesh/route"

// What a rolling upgrade may add to the wire (wire.go): each router's
// version, the version a sender encodes at for each peer, and a state as
// a peer of an older version reads it.

// wireVersion names what a router's decoders understand. A router
// advertises its own as memberlist's DelegateProtocolMax (membership.go),
// and encodes for a peer at the lesser of the two (peerWire, and
// pushPullWire for push/pull, where memberlist does not say who the peer
// is). The next addition to the wire (a flag, a field, a message kind)
// takes the next number: it gets a constant here, a case in
// stateFlags, needs and at (or their like for what it adds), and older
// routers keep reading what they always read.
//
// memberlist refuses a push/pull in which an alive router's current
// delegate version lies outside some router's [min, max], and routers
// before versioning advertise 0, 0, 0: so every router advertises
// wireBase as its current version and its minimum, and only its maximum
// grows. Raising the minimum is how a future version would refuse
// routers older than it (memberlist then refuses them at join).
type wireVersion uint8

const (
	// wireBase is every router before versioning (memberlist's default
	// delegate versions, 0, 0, 0).
	wireBase wireVersion = 0
	// wireNoLoad decodes the state flag flagNoLoad.
	wireNoLoad wireVersion = 1
	// wireEngine decodes the state flag flagEngine and the engine
	// section it announces.
	wireEngine wireVersion = 2
	// wireUsage decodes the message kind kindUsage.
	wireUsage wireVersion = 3
	// wireRole decodes the state flag flagRole and the role it
	// announces.
	wireRole wireVersion = 4
	// wireLoad decodes the message kind kindLoad, the owners' load
	// beacons (beacon.go); an older router is sent none.
	wireLoad wireVersion = 5
	// wireLatest is this build's version.
	wireLatest = wireLoad
)

// peerWire is the version a router of version self encodes at for a
// peer that advertises peer.
func peerWire(self, peer wireVersion) wireVersion { return min(self, peer) }

// pushPullWire is the version of a router's push/pull state. memberlist
// asks for it (Delegate.LocalState) without saying which router it goes
// to, so it is the least version of the live peers; in a join the peer
// may be one this router does not know yet (it answers before it merges
// the joiner's state), so it is wireBase. The batches that follow a join
// carry every state at the peer's own version.
func pushPullWire(self wireVersion, join bool, live []wireVersion) wireVersion {
	if join {
		return wireBase
	}
	v := self
	for _, p := range live {
		v = peerWire(v, p)
	}
	return v
}

// stateFlags is the state flags a router of version v decodes.
func (v wireVersion) stateFlags() byte {
	f := flagOwned | flagHealthy | flagWithdrawn | flagSlim
	if v >= wireNoLoad {
		f |= flagNoLoad
	}
	if v >= wireEngine {
		f |= flagEngine
	}
	if v >= wireRole {
		f |= flagRole
	}
	return f
}

// hasRole reports that s carries the replica's role (flagRole): an
// owner's full state of a replica that is not a whole one.
func (s *stateMsg) hasRole() bool {
	return s.Owned && !s.Slim && (s.Role != route.RoleBoth || s.Bootstrap != 0)
}

// noLoad reports that s is encoded without its section with flagNoLoad:
// an owner's full state whose engine publishes no counts.
func (s *stateMsg) noLoad() bool { return s.Owned && !s.Slim && !s.EngineWire && !s.Engine.HasLoad }

// needs is the least version that carries s whole.
func (s *stateMsg) needs() wireVersion {
	switch {
	case s.hasRole():
		return wireRole
	case s.EngineWire:
		return wireEngine
	case s.noLoad():
		return wireNoLoad
	}
	return wireBase
}

// at is s as a router of version v is to read it: what v does not know
// is left out. Below wireRole the role is left out; below wireEngine the load is the three counts and
// NoLoad, the section's other fields unknown; without flagNoLoad an
// engine's 0 running and 0 waiting read as known counts, as every router
// before the flag read them.
func (s stateMsg) at(v wireVersion) stateMsg {
	if v < wireRole {
		// A router before roles reads every replica as a whole one
		// (it cannot split requests anyway).
		s.Role, s.Bootstrap = route.RoleBoth, 0
	}
	if v < wireEngine && s.EngineWire {
		s.EngineWire = false
		s.Engine = legacyLoad(s.Engine, route.EngineLoad{})
		s.LoRA = route.LoRAs{}
	}
	if v < wireNoLoad && s.noLoad() {
		s.Engine.HasLoad = true
	}
	return s
}

// legacyLoad is l's fields that a state without flagEngine carries
// (running, waiting, slots, and HasLoad through flagNoLoad) over rest's
// others.
func legacyLoad(l, rest route.EngineLoad) route.EngineLoad {
	rest.Running, rest.Waiting, rest.Slots, rest.HasLoad = l.Running, l.Waiting, l.Slots, l.HasLoad
	return rest
}
