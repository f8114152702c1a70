package mesh

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/route"
)

// Wire formats. Every message and state is hand-encoded, big-endian, and
// every decoder checks every length against the bytes it holds before it
// slices or allocates, because the bytes come from the network.
//
//	s8  = u8 length + bytes, s16 = u16 length + bytes
//	meta     : 1 | region s8 | api s16 | contract s8
//	state    : kindState | origin s8 | boot u64 | seq u64 | replica s16 | flags u8
//	           | epoch u64 | version u64 (a slim state ends here)
//	           | capacity u32 | digest u64
//	           | in-flight u32 | pending f64 | engine
//	           | role u8 | bootstrap u16 (with flagRole)
//	           | models u8 × s8 | declared-by u8 × s8
//	engine   : running u32 | waiting u32 | slots u32 (without flagEngine)
//	           | route.EngineLoad's wire section (with flagEngine)
//	fullReq  : kindFullReq | origin s8 | replica s16
//	batch    : kindBatch | origin s8 | boot u64 | seq u64 | n u16 × entry
//	entry    : state u16-prefixed | payload kind u8 (0 none, 1 delta, 2 full summary)
//	           | payload u32-prefixed (summary.DecodeDelta or summary.Decode)
//	push/pull: kindPushPull | origin s8 | boot u64 | n u32 × (state u16-prefixed | summary u32-prefixed, 0 = none)
//	usage    : kindUsage | origin s8 | boot u64 | payload u32-prefixed (the tenants' token usage, Config.Usage's)
//	load     : kindLoad | origin s8 | boot u64 | seq u64 | n uvarint × (replica uvarint-prefixed
//	           | in-flight uvarint | pending prefill uvarint, thousandths of a block); varints in
//	           their shortest form; one UDP packet (beacon.go)
//
// Kinds 2 (a delta of raw 64-bit hashes on the UDP broadcast queue) and 4
// (a full reply) belonged to protocol 1 and are refused.
//
// A state's flags grow by bits a decoder refuses until it knows them (the
// format has no slack a sender could hide data in). So that a rolling
// upgrade works, every such addition since versioning began has a wire
// version (wireVersion, below), each router advertises the highest it
// decodes, and a sender encodes for a peer only what the peer's version
// knows (stateMsg.at): flagNoLoad, set only by an owner whose engine
// publishes no load counts, goes only to routers of wireNoLoad or later;
// an older router gets the state without it, byte for byte what it
// always read. A router reads an older owner's states, which never carry
// it, as load known, as the older owner meant them. flagEngine (routers
// of wireEngine or later) replaces the three counts by the engine's
// load as route.EngineLoad encodes it (AppendWire), a section that grows
// by fields without a new wire version: a field the engine adapter adds
// reaches every router of wireEngine or later with no change here.
// flagRole (routers of wireRole or later) adds the replica's role in a
// disaggregated deployment (route.Role) and a prefill replica's
// bootstrap port; a state without it is a whole replica's.
const (
	kindState    byte = 1
	kindFullReq  byte = 3
	kindPushPull byte = 5
	kindBatch    byte = 6
	// kindUsage carries the tenants' token usage (usage.go); only to
	// routers of wireUsage or later.
	kindUsage byte = 7
	// kindLoad is an owner's load beacon (beacon.go); only to routers of
	// wireLoad or later.
	kindLoad byte = 8

	payloadNone  byte = 0
	payloadDelta byte = 1
	payloadFull  byte = 2

	metaVersion byte = 1

	flagOwned     byte = 1
	flagHealthy   byte = 2
	flagWithdrawn byte = 4 // the origin no longer declares the replica
	flagSlim      byte = 8 // only epoch and version follow: nothing else changed
	// flagNoLoad: the owner's engine publishes no running and waiting
	// counts (its 0 and 0 say nothing); only in an owner's full state.
	flagNoLoad byte = 16
	// flagEngine: the engine's load is a route.EngineLoad section (which
	// carries HasLoad itself, so never with flagNoLoad); only in an
	// owner's full state.
	flagEngine byte = 32
	// flagRole: the replica's role and bootstrap port follow the
	// engine's load (only in an owner's full state, and only when they
	// are not a whole replica's: route.RoleBoth and no port).
	flagRole byte = 64

	// maxFullBytes is memberlist's limit on one SendReliable message and on
	// push/pull user state (20 MiB); above it delivery silently fails.
	maxFullBytes = 20 << 20
	// maxLocalStateBytes keeps push/pull state well under maxFullBytes.
	maxLocalStateBytes = 16 << 20
	// maxReplicaIDLen keeps a state message inside one gossip packet.
	maxReplicaIDLen = 512
	maxNameLen      = 128
)

var errShort = errors.New("truncated")

// reader decodes with bounds checks; the first error sticks.
type reader struct {
	b   []byte
	err error
	// v is the version decoded: what a later version added is refused.
	v wireVersion
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.fail(errShort)
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) u8() byte {
	b := r.take(1)
	if b == nil {
		return 0
	}
	return b[0]
}

func (r *reader) u16() int {
	b := r.take(2)
	if b == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(b))
}

func (r *reader) u32() uint32 {
	b := r.take(4)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint32(b)
}

func (r *reader) u64() uint64 {
	b := r.take(8)
	if b == nil {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}

func (r *reader) s8() string  { return string(r.take(int(r.u8()))) }
func (r *reader) s16() string { return string(r.take(r.u16())) }

// bytes32 returns a u32-prefixed slice of at most limit bytes (aliasing b).
func (r *reader) bytes32(limit int) []byte {
	n := r.u32()
	if r.err == nil && int64(n) > int64(limit) {
		r.fail(fmt.Errorf("length %d over limit %d", n, limit))
		return nil
	}
	return r.take(int(n))
}

func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Errorf("%d trailing bytes", len(r.b)))
	}
	return r.err
}

func appendS8(dst []byte, s string) []byte {
	if len(s) > math.MaxUint8 {
		s = s[:math.MaxUint8]
	}
	return append(append(dst, byte(len(s))), s...)
}

func appendS16(dst []byte, s string) []byte {
	if len(s) > math.MaxUint16 {
		s = s[:math.MaxUint16]
	}
	return append(binary.BigEndian.AppendUint16(dst, uint16(len(s))), s...)
}

// nodeMeta is what a router advertises in memberlist's node metadata.
type nodeMeta struct {
	Region, API, Contract string
}

func (m nodeMeta) encode() []byte {
	b := []byte{metaVersion}
	b = appendS8(b, m.Region)
	b = appendS16(b, m.API)
	return appendS8(b, m.Contract)
}

func decodeMeta(b []byte) (nodeMeta, error) {
	r := reader{b: b}
	if v := r.u8(); r.err == nil && v != metaVersion {
		return nodeMeta{}, fmt.Errorf("node meta: unknown version %d", v)
	}
	m := nodeMeta{Region: r.s8(), API: r.s16(), Contract: r.s8()}
	if err := r.done(); err != nil {
		return nodeMeta{}, fmt.Errorf("node meta: %w", err)
	}
	return m, nil
}

// header names a gossiped message: who originated it, in which process
// lifetime (boot), and its sequence number there.
type header struct {
	Origin    string
	Boot, Seq uint64
}

func (h header) append(dst []byte, kind byte) []byte {
	dst = append(dst, kind)
	dst = appendS8(dst, h.Origin)
	dst = binary.BigEndian.AppendUint64(dst, h.Boot)
	return binary.BigEndian.AppendUint64(dst, h.Seq)
}

func (r *reader) header() header {
	return header{Origin: r.s8(), Boot: r.u64(), Seq: r.u64()}
}

// stateMsg is one router's word on one replica: a declaration, and when
// the router owns the replica, its health, load and summary position. It is
// also the owner's heartbeat for that replica.
type stateMsg struct {
	header
	Replica        string
	Owned, Healthy bool
	Withdrawn      bool
	// Slim states carry only the summary's position: the owner sends them
	// while nothing else about the replica changed.
	Slim           bool
	Capacity       uint32
	Epoch, Version uint64
	Digest         uint64 // xxh3 of the encoded summary at Version; 0 = unknown
	InFlight       uint32
	Pending        float64
	// Engine is the engine's own load (route.Candidate's EngineLoad).
	// With EngineWire it is encoded whole (flagEngine); without, as the
	// three counts, and HasLoad false as flagNoLoad, of the inverse sense
	// so that a state with known counts sets no bit a router of wire
	// version 0 lacks, and reads there as it always did (wireNoLoad).
	Engine     route.EngineLoad
	EngineWire bool
	// Role is the replica's role and Bootstrap a prefill replica's
	// bootstrap port (flagRole; zero: a whole replica).
	Role      route.Role
	Bootstrap uint16
	// LoRA is the engine's LoRA adapters, in Engine's section (so only
	// with EngineWire), as tags a router that does not know them skips.
	LoRA       route.LoRAs
	Models     []string
	DeclaredBy []string
}

func (s *stateMsg) append(dst []byte) []byte {
	dst = s.header.append(dst, kindState)
	dst = appendS16(dst, s.Replica)
	var f byte
	if s.Owned {
		f |= flagOwned
	}
	if s.Healthy {
		f |= flagHealthy
	}
	if s.Withdrawn {
		f |= flagWithdrawn
	}
	if s.Slim {
		f |= flagSlim
	}
	if s.EngineWire {
		f |= flagEngine
	} else if s.noLoad() {
		f |= flagNoLoad
	}
	if s.hasRole() {
		f |= flagRole
	}
	dst = append(dst, f)
	dst = binary.BigEndian.AppendUint64(dst, s.Epoch)
	dst = binary.BigEndian.AppendUint64(dst, s.Version)
	if s.Slim {
		return dst
	}
	dst = binary.BigEndian.AppendUint32(dst, s.Capacity)
	dst = binary.BigEndian.AppendUint64(dst, s.Digest)
	dst = binary.BigEndian.AppendUint32(dst, s.InFlight)
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(s.Pending))
	if s.EngineWire {
		dst = route.AppendEngineWire(dst, s.Engine, s.LoRA)
	} else {
		dst = binary.BigEndian.AppendUint32(dst, uint32(max(s.Engine.Running, 0)))
		dst = binary.BigEndian.AppendUint32(dst, uint32(max(s.Engine.Waiting, 0)))
		dst = binary.BigEndian.AppendUint32(dst, uint32(max(s.Engine.Slots, 0)))
	}
	if s.hasRole() {
		dst = binary.BigEndian.AppendUint16(append(dst, byte(s.Role)), s.Bootstrap)
	}
	dst = append(dst, byte(min(len(s.Models), math.MaxUint8)))
	for _, m := range s.Models[:min(len(s.Models), math.MaxUint8)] {
		dst = appendS8(dst, m)
	}
	dst = append(dst, byte(min(len(s.DeclaredBy), math.MaxUint8)))
	for _, d := range s.DeclaredBy[:min(len(s.DeclaredBy), math.MaxUint8)] {
		dst = appendS8(dst, d)
	}
	return dst
}

func (r *reader) state() stateMsg {
	var s stateMsg
	s.header = r.header()
	s.Replica = r.s16()
	f := r.u8()
	s.Owned, s.Healthy, s.Withdrawn, s.Slim = f&flagOwned != 0, f&flagHealthy != 0, f&flagWithdrawn != 0, f&flagSlim != 0
	noLoad := f&flagNoLoad != 0
	s.EngineWire = f&flagEngine != 0
	role := f&flagRole != 0
	if f&^r.v.stateFlags() != 0 {
		r.fail(fmt.Errorf("unknown flags %#x", f))
	}
	if (noLoad || s.EngineWire) && (!s.Owned || s.Slim) {
		// Only an owner's full state carries the engine's load.
		r.fail(fmt.Errorf("flags %#x: engine load without an owner's full state", f))
	}
	if noLoad && s.EngineWire {
		r.fail(fmt.Errorf("flags %#x: no load with an engine section", f))
	}
	if role && (!s.Owned || s.Slim) {
		r.fail(fmt.Errorf("flags %#x: a role without an owner's full state", f))
	}
	s.Epoch, s.Version = r.u64(), r.u64()
	if s.Slim {
		if r.err == nil && (s.Replica == "" || len(s.Replica) > maxReplicaIDLen || s.Origin == "") {
			r.fail(errors.New("empty origin or bad replica id"))
		}
		return s
	}
	s.Capacity = r.u32()
	s.Digest = r.u64()
	s.InFlight = r.u32()
	s.Pending = math.Float64frombits(r.u64())
	if r.err == nil && !(s.Pending >= 0 && s.Pending <= 1e15) {
		r.fail(fmt.Errorf("pending prefill %v out of range", s.Pending))
	}
	if s.EngineWire {
		s.Engine, s.LoRA = r.engine()
	} else {
		s.Engine = route.EngineLoad{Running: r.count(), Waiting: r.count(), Slots: r.count(), HasLoad: !noLoad}
	}
	if role {
		s.Role, s.Bootstrap = route.Role(r.u8()), uint16(r.u16())
		// One encoding per state: flagRole only for what a state
		// without it cannot say, a port only for a prefill replica.
		if r.err == nil && (!s.Role.Valid() || !s.hasRole() || (s.Bootstrap != 0 && s.Role != route.RolePrefill)) {
			r.fail(fmt.Errorf("role %d with bootstrap port %d", s.Role, s.Bootstrap))
		}
	}
	if n := int(r.u8()); n > 0 {
		s.Models = make([]string, 0, n)
		for i := 0; i < n && r.err == nil; i++ {
			s.Models = append(s.Models, r.s8())
		}
	}
	if n := int(r.u8()); n > 0 {
		s.DeclaredBy = make([]string, 0, n)
		for i := 0; i < n && r.err == nil; i++ {
			s.DeclaredBy = append(s.DeclaredBy, r.s8())
		}
	}
	if r.err == nil && (s.Replica == "" || len(s.Replica) > maxReplicaIDLen || s.Origin == "") {
		r.fail(errors.New("empty origin or bad replica id"))
	}
	return s
}

// count reads a u32 count of the engine's. A count past the int32 range
// is refused rather than saturated, so that a state decodes to one
// encoding (engines' counts are far below it).
func (r *reader) count() int32 {
	n := r.u32()
	if r.err == nil && n > math.MaxInt32 {
		r.fail(fmt.Errorf("engine count %d out of range", n))
	}
	return int32(min(n, math.MaxInt32))
}

// engine reads a route.EngineLoad section. It is the one part of a
// state with room for bytes this router does not read: the section's
// tags a newer router added, which route.EngineLoad.DecodeWire skips so
// that a field reaches the routers that know it without a wire version.
func (r *reader) engine() (route.EngineLoad, route.LoRAs) {
	if r.err != nil {
		return route.EngineLoad{}, route.LoRAs{}
	}
	l, a, n, err := route.DecodeEngineWire(r.b)
	if err != nil {
		r.fail(err)
		return l, a
	}
	r.b = r.b[n:]
	return l, a
}

// fullReq asks the owner of Replica for a full copy of its summary.
type fullReq struct {
	Origin, Replica string
}

func (f fullReq) append(dst []byte) []byte {
	dst = append(dst, kindFullReq)
	dst = appendS8(dst, f.Origin)
	return appendS16(dst, f.Replica)
}

// stateWithSummary is a state plus, optionally, the encoded summary it
// describes (a full copy). Summary aliases the decoded buffer.
type stateWithSummary struct {
	State   stateMsg
	Summary []byte
}

func appendStateWithSummary(dst []byte, st *stateMsg, sum []byte) []byte {
	n := len(dst)
	dst = append(dst, 0, 0)
	dst = st.append(dst)
	binary.BigEndian.PutUint16(dst[n:], uint16(len(dst)-n-2))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(sum)))
	return append(dst, sum...)
}

func (r *reader) stateWithSummary(limit int) stateWithSummary {
	var out stateWithSummary
	sub := reader{b: r.take(r.u16()), v: r.v}
	if r.err != nil {
		return out
	}
	if sub.u8() != kindState {
		sub.fail(errors.New("embedded message is not a state"))
	}
	out.State = sub.state()
	if err := sub.done(); err != nil {
		r.fail(fmt.Errorf("state: %w", err))
		return out
	}
	out.Summary = r.bytes32(limit)
	return out
}

// batchEntry is one replica's state in a batch, with the delta that
// brings a copy to the state's version, or a full summary. Payload aliases
// the decoded buffer.
type batchEntry struct {
	State   stateMsg
	Kind    byte
	Payload []byte
}

// batchMsg is what an owner sends each peer each tick over a reliable
// stream: the states of the replicas it owns or declares, with their
// deltas.
type batchMsg struct {
	header
	Entries []batchEntry
}

func (b *batchMsg) append(dst []byte) []byte {
	dst = b.header.append(dst, kindBatch)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(b.Entries)))
	for i := range b.Entries {
		dst = appendEntry(dst, &b.Entries[i])
	}
	return dst
}

// appendEntry appends one entry; a batch is assembled from entries
// encoded once and shared by every peer's batch.
func appendEntry(dst []byte, e *batchEntry) []byte {
	return appendEntryRaw(dst, e.State.append(nil), e.Kind, e.Payload)
}

// appendEntryRaw appends an entry of an encoded state (under 64 KiB).
func appendEntryRaw(dst, state []byte, kind byte, payload []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(state)))
	dst = append(dst, state...)
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...)
}

// maxBatchEntries is the most entries one batch holds (a u16 count).
const maxBatchEntries = 1<<16 - 1

func (r *reader) batch() batchMsg {
	var b batchMsg
	b.header = r.header()
	n := r.u16()
	// Every entry takes at least 7 bytes, so n is bounded by the input.
	if r.err == nil && n*7 > len(r.b) {
		r.fail(fmt.Errorf("%d entries in %d bytes", n, len(r.b)))
	}
	if r.err == nil {
		b.Entries = make([]batchEntry, 0, n) // bounded by the input, as above
	}
	for i := 0; i < n && r.err == nil; i++ {
		var e batchEntry
		sub := reader{b: r.take(r.u16()), v: r.v}
		if r.err != nil {
			break
		}
		if sub.u8() != kindState {
			sub.fail(errors.New("embedded message is not a state"))
		}
		e.State = sub.state()
		if err := sub.done(); err != nil {
			r.fail(fmt.Errorf("entry %d state: %w", i, err))
			break
		}
		e.Kind = r.u8()
		e.Payload = r.bytes32(maxFullBytes)
		if r.err == nil && (e.Kind > payloadFull || (e.Kind == payloadNone) != (len(e.Payload) == 0) ||
			e.State.Origin != b.Origin) {
			r.fail(fmt.Errorf("entry %d: payload kind %d with %d bytes, origin %q", i, e.Kind, len(e.Payload), e.State.Origin))
		}
		b.Entries = append(b.Entries, e)
	}
	if r.err == nil && b.Origin == "" {
		r.fail(errors.New("empty origin"))
	}
	return b
}

// pushPull is a router's full state for memberlist's push/pull exchange.
type pushPull struct {
	Origin  string
	Boot    uint64
	Entries []stateWithSummary
}

// decodeMsg decodes one direct message as a router of version v; it
// returns one of stateMsg, fullReq, batchMsg, usageMsg or loadMsg.
func decodeMsg(b []byte, v wireVersion) (any, error) {
	r := reader{b: b, v: v}
	kind := r.u8()
	var out any
	switch kind {
	case kindState:
		out = r.state()
	case kindBatch:
		out = r.batch()
	case kindUsage:
		if v < wireUsage {
			return nil, fmt.Errorf("unknown message kind %d", kind)
		}
		out = r.usage()
	case kindLoad:
		if v < wireLoad {
			return nil, fmt.Errorf("unknown message kind %d", kind)
		}
		out = r.load()
	case kindFullReq:
		f := fullReq{Origin: r.s8(), Replica: r.s16()}
		if r.err == nil && (f.Origin == "" || f.Replica == "") {
			r.fail(errors.New("empty origin or replica"))
		}
		out = f
	default:
		if r.err == nil {
			return nil, fmt.Errorf("unknown message kind %d", kind)
		}
	}
	if err := r.done(); err != nil {
		return nil, fmt.Errorf("message kind %d: %w", kind, err)
	}
	return out, nil
}

// decodePushPull decodes a push/pull state as a router of version v.
func decodePushPull(b []byte, v wireVersion) (pushPull, error) {
	r := reader{b: b, v: v}
	var p pushPull
	if k := r.u8(); r.err == nil && k != kindPushPull {
		return p, fmt.Errorf("push/pull state: kind %d", k)
	}
	p.Origin, p.Boot = r.s8(), r.u64()
	n := r.u32()
	// Every entry takes at least 6 bytes, so n is bounded by the input.
	if r.err == nil && int64(n)*6 > int64(len(r.b)) {
		r.fail(fmt.Errorf("%d entries in %d bytes", n, len(r.b)))
	}
	for i := uint32(0); i < n && r.err == nil; i++ {
		p.Entries = append(p.Entries, r.stateWithSummary(maxFullBytes))
	}
	if err := r.done(); err != nil {
		return pushPull{}, fmt.Errorf("push/pull state: %w", err)
	}
	return p, nil
}
