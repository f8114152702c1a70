package route

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/zeebo/xxh3"
)

// LoRA adapters. An engine such as vLLM serves a base model and, on top
// of it, LoRA adapters that a request names as its model (they are listed
// in /v1/models with the base model as their "parent"). The engine holds
// at most a few adapters resident at once (vLLM's --max-loras): a request
// for one that is not resident loads it, evicting the least recently
// used one, and waits while every resident one is in use. So an adapter's
// requests belong where it is loaded, and the loads of an adapter loaded
// nowhere belong on one replica every router names alike.
//
// What the decision knows of it travels as LoRAs, per replica, from the
// engine adapter (internal/engine) through the health checker and the
// mesh's gossip (in EngineLoad's wire section, as tags an older router
// skips) to the view, which reduces it, per model, to the one byte
// Candidate.LoRA (LoRAFit): the Candidate is read by every decision, and
// a set of adapters in it would cost every base-model decision a copy.

// ModelKey is the hash of a model's name: Request.Model, the rendezvous
// key of an adapter's loads, and (its high bits) the adapter's id in a
// LoRAs.
func ModelKey(name string) uint64 { return xxh3.HashStringSeed(name, 0x106a) }

// LoRAID is the id of model name in a LoRAs: the high 26 bits of its
// ModelKey. Two adapters of one replica share an id with probability
// 2^-26 per pair; a shared id makes one look loaded where the other is,
// a misplacement the engine corrects by loading it.
func LoRAID(name string) uint32 { return uint32(ModelKey(name) >> 38) }

// loraIDBits is the width of a LoRAID.
const loraIDBits = 26

// MaxLoRAEntries bounds the adapters (and base models) a LoRAs lists, so
// that a replica's state stays small on the wire whatever its engine
// reports: base models first, then running adapters, then the other
// loaded ones, then waiting ones. Active and Resident still count every
// adapter the engine named.
const MaxLoRAEntries = 24

// maxLoRABases bounds the base models among the entries (an engine serves
// one, under a few names at most).
const maxLoRABases = 4

// The state of an entry, its low two bits. A base model has neither
// bit: it is listed so that a router can tell it from an adapter.
const (
	loraLoaded  = 1 // the adapter is loaded (resident)
	loraWaiting = 2 // requests of the adapter wait (for a sequence slot, or to load it)
)

// LoRAs is what a replica's engine tells of its LoRA adapters: its limit
// on adapters resident at once, how many it has in use and loaded, which
// those are, and which of its models are base models rather than
// adapters. The zero value is an engine without LoRA (or one that says
// nothing of it); every field's zero is unknown. It is a comparable
// value: the health checker reports it only when it changed.
type LoRAs struct {
	// Max is how many adapters the engine holds resident at once (vLLM's
	// --max-loras, the max_lora label of vllm:lora_requests_info); 0
	// is unknown, which the decision reads as room.
	Max uint16
	// Active is how many distinct adapters the engine runs or queues
	// requests of now (vLLM's running_lora_adapters and
	// waiting_lora_adapters together, as llm-d counts them against
	// max_lora): with fewer than Max it loads another without waiting.
	Active uint16
	// Resident is how many adapters the engine holds loaded (at most
	// Max): with fewer than Max it loads another into a free slot,
	// evicting none.
	Resident uint16
	// entries are 4 bytes each, a big-endian uint32 of a LoRAID shifted
	// left by 2 and an entry state, sorted by id, unique ids, at most
	// MaxLoRAEntries. A string, so that the value stays comparable and
	// immutable when copied.
	entries string
}

// MakeLoRAs builds what an engine told: its limit, the base models it
// serves (its /v1/models entries without a parent), the adapters it
// holds loaded, most recently used first, and those whose requests run
// and wait now (a running one is loaded). Loaded adapters past the limit
// are not loaded (the engine cannot hold them: the least recent are
// dropped), names past the bounds are dropped (base models past
// maxLoRABases, then entries past MaxLoRAEntries in MaxLoRAEntries'
// order), and duplicates are merged. An engine that names no base model,
// no adapter and no limit says nothing of LoRA: the zero value.
func MakeLoRAs(maxLoRAs int, bases, loaded, running, waiting []string) LoRAs {
	var a LoRAs
	a.Max = uint16(min(max(maxLoRAs, 0), 1<<16-1))
	byID := map[uint32]uint32{}
	var order []uint32 // ids in the order they earn a place
	resident := 0
	add := func(name string, state uint32) {
		if name == "" {
			return
		}
		id := LoRAID(name)
		st, ok := byID[id]
		if ok && st == 0 {
			return // a base model stays one
		}
		if state&loraLoaded != 0 && st&loraLoaded == 0 {
			if a.Max > 0 && resident == int(a.Max) {
				state &^= loraLoaded
			} else {
				resident++
			}
		}
		if !ok {
			if state == 0 {
				return // a loaded adapter past the limit
			}
			order = append(order, id)
		}
		byID[id] = st | state
	}
	for i, b := range bases {
		if i == maxLoRABases {
			break
		}
		if _, ok := byID[LoRAID(b)]; !ok && b != "" {
			byID[LoRAID(b)] = 0
			order = append(order, LoRAID(b))
		}
	}
	for _, n := range running {
		add(n, loraLoaded)
	}
	for _, n := range loaded {
		add(n, loraLoaded)
	}
	for _, n := range waiting {
		add(n, loraWaiting)
	}
	inUse := map[uint32]bool{}
	for _, list := range [][]string{running, waiting} {
		for _, n := range list {
			if id := LoRAID(n); n != "" && byID[id] != 0 {
				inUse[id] = true
			}
		}
	}
	a.Active = uint16(min(len(inUse), 1<<16-1))
	a.Resident = uint16(min(resident, 1<<16-1))
	if len(order) > MaxLoRAEntries {
		order = order[:MaxLoRAEntries]
	}
	slices.Sort(order)
	b := make([]byte, 0, 4*len(order))
	for _, id := range order {
		b = binary.BigEndian.AppendUint32(b, id<<2|byID[id])
	}
	a.entries = string(b)
	return a
}

// Known reports that the engine said anything of LoRA.
func (a LoRAs) Known() bool { return a.Max > 0 || a.entries != "" || a.Active > 0 || a.Resident > 0 }

// Len is the number of entries listed.
func (a LoRAs) Len() int { return len(a.entries) / 4 }

func (a LoRAs) entry(i int) (id, state uint32) {
	e := binary.BigEndian.Uint32([]byte(a.entries[4*i : 4*i+4]))
	return e >> 2, e & 3
}

// Forget is a as known once the engine's /metrics stops answering: its
// limit (configured) and its base models (from /v1/models) stay, the
// adapters loaded and in use become unknown.
func (a LoRAs) Forget() LoRAs {
	out := LoRAs{Max: a.Max}
	var b []byte
	for i := range a.Len() {
		if id, st := a.entry(i); st == 0 {
			b = binary.BigEndian.AppendUint32(b, id<<2)
		}
	}
	out.entries = string(b)
	return out
}

// Named is the adapters of a that models name (a replica's models: an
// adapter it loads or queues is one of them), loaded and waiting,
// sorted: the names of what a holds only as ids, for the status page and
// the mesh's debug view.
func (a LoRAs) Named(models []string) (loaded, waiting []string) {
	if a.entries == "" {
		return nil, nil
	}
	for _, m := range models {
		f := a.Fit(LoRAID(m))
		if f&LoRAResident != 0 {
			loaded = append(loaded, m)
		}
		if f&LoRAWaiting != 0 {
			waiting = append(waiting, m)
		}
	}
	slices.Sort(loaded)
	slices.Sort(waiting)
	return loaded, waiting
}

// Parent is the base model that adapter m of a replica serving models
// (sorted) sits on, as the replica's engine listed it (vLLM's /v1/models
// "parent"): the one of models a lists as a base model, the first by
// name when it serves its base under several names. "" when m is not an
// adapter there (a base model, or an engine that says nothing of LoRA)
// or no base model of it is known.
func (a LoRAs) Parent(models []string, m string) string {
	if a.Fit(LoRAID(m))&LoRAAdapter == 0 {
		return ""
	}
	for _, b := range models {
		if b != m && a.Fit(LoRAID(b)) == 0 {
			return b
		}
	}
	return ""
}

// LoRAFit is what the decision reads of one candidate for a request's
// model: whether the model is a LoRA adapter there, whether it is loaded
// or waits there, whether the engine can load it without waiting and
// without evicting. The view computes it per model (LoRAs.Fit); 0 is a
// base model, or an engine that says nothing of LoRA, and leaves the
// decision as it is without adapters.
type LoRAFit uint8

// The bits of a LoRAFit.
const (
	// LoRAAdapter: the model is an adapter at this replica (its engine
	// tells LoRA and does not list the model as a base model).
	LoRAAdapter LoRAFit = 1 << iota
	// LoRAResident: the adapter is loaded there.
	LoRAResident
	// LoRAWaiting: requests of the adapter wait there.
	LoRAWaiting
	// LoRARoom: the engine has fewer adapters in use than its limit (or
	// an unknown limit): it can load one more without waiting.
	LoRARoom
	// LoRAFree: the engine holds fewer adapters than its limit (or an
	// unknown limit): it can load one more evicting none.
	LoRAFree
)

// Fit is a's word on the model of LoRAID id.
func (a LoRAs) Fit(id uint32) LoRAFit {
	if !a.Known() {
		return 0
	}
	f := LoRAAdapter
	// A binary search over the sorted ids; a few entries at most.
	lo, hi := 0, a.Len()
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if eid, _ := a.entry(m); eid < id {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < a.Len() {
		if eid, st := a.entry(lo); eid == id {
			if st == 0 {
				return 0 // a base model
			}
			if st&loraLoaded != 0 {
				f |= LoRAResident
			}
			if st&loraWaiting != 0 {
				f |= LoRAWaiting
			}
		}
	}
	if a.Max == 0 || a.Active < a.Max {
		f |= LoRARoom
	}
	if a.Max == 0 || a.Resident < a.Max {
		f |= LoRAFree
	}
	return f
}

// The wire tags of LoRAs, in EngineLoad's section after its own fields'
// (which take 1 to 15). A router that does not know them skips them
// (EngineLoad.DecodeWire), so they need no mesh wire version.
const (
	wireLoRAMax      = 16 // Max, present when known
	wireLoRAActive   = 17 // Active, present when not 0
	wireLoRAResident = 18 // Resident, present when not 0
	wireLoRAEntries  = 19 // the first entry; entry i takes tag 19+i
)

// appendWire appends a's fields to an EngineLoad section: each entry an
// id<<2|state varint of at most 4 bytes (a 26-bit id), so that the
// section's 255 bytes hold the engine's fields, a's counts and
// MaxLoRAEntries entries (5 bytes each with the tag) with room left for
// fields to come.
func (a LoRAs) appendWire(dst []byte) []byte {
	for _, f := range [...]struct {
		tag byte
		v   uint16
	}{{wireLoRAMax, a.Max}, {wireLoRAActive, a.Active}, {wireLoRAResident, a.Resident}} {
		if f.v > 0 {
			dst = binary.AppendUvarint(append(dst, f.tag), uint64(f.v))
		}
	}
	for i := range a.Len() {
		id, st := a.entry(i)
		dst = binary.AppendUvarint(append(dst, byte(wireLoRAEntries+i)), uint64(id<<2|st))
	}
	return dst
}

// loraDecoder collects LoRAs' tags while an EngineLoad section is read.
type loraDecoder struct {
	a       LoRAs
	entries []byte
	lastID  uint32
}

// field reads one tag of LoRAs; ok is false for a tag that is not one.
func (d *loraDecoder) field(tag byte, v uint64) (ok bool, err error) {
	switch {
	case tag == wireLoRAMax, tag == wireLoRAActive, tag == wireLoRAResident:
		if v == 0 || v > 1<<16-1 {
			return true, fmt.Errorf("lora: tag %d: %d out of range", tag, v)
		}
		switch tag {
		case wireLoRAMax:
			d.a.Max = uint16(v)
		case wireLoRAActive:
			d.a.Active = uint16(v)
		default:
			d.a.Resident = uint16(v)
		}
		return true, nil
	case tag >= wireLoRAEntries && int(tag) < wireLoRAEntries+MaxLoRAEntries:
		i := int(tag) - wireLoRAEntries
		if i != len(d.entries)/4 {
			return true, fmt.Errorf("lora: entry %d after %d entries", i, len(d.entries)/4)
		}
		if v >= 1<<(loraIDBits+2) {
			return true, fmt.Errorf("lora: entry %#x out of range", v)
		}
		if id := uint32(v >> 2); i > 0 && id <= d.lastID {
			return true, fmt.Errorf("lora: entry id %#x after %#x", id, d.lastID)
		} else {
			d.lastID = id
		}
		d.entries = binary.BigEndian.AppendUint32(d.entries, uint32(v))
		return true, nil
	}
	return false, nil
}

// done is the LoRAs read, checked as a whole: an engine holds at least
// as many adapters as it lists loaded, and no more than its limit; it
// has at least as many in use as it lists waiting.
func (d *loraDecoder) done() (LoRAs, error) {
	d.a.entries = string(d.entries)
	loaded, waiting := 0, 0
	for i := range d.a.Len() {
		_, st := d.a.entry(i)
		if st&loraLoaded != 0 {
			loaded++
		}
		if st&loraWaiting != 0 {
			waiting++
		}
	}
	switch {
	case int(d.a.Resident) < loaded:
		return LoRAs{}, fmt.Errorf("lora: %d adapters resident, %d listed loaded", d.a.Resident, loaded)
	case d.a.Max > 0 && d.a.Resident > d.a.Max:
		return LoRAs{}, fmt.Errorf("lora: %d adapters resident over the limit %d", d.a.Resident, d.a.Max)
	case int(d.a.Active) < waiting:
		return LoRAs{}, fmt.Errorf("lora: %d adapters in use, %d listed waiting", d.a.Active, waiting)
	}
	return d.a, nil
}

// LoRAPlacement says where a LoRA adapter's request went; it is a metric
// label. Empty for a base model's request.
type LoRAPlacement string

// The placements of an adapter's request.
const (
	LoRALoaded  LoRAPlacement = "loaded"  // where the adapter is loaded
	LoRALoad    LoRAPlacement = "load"    // where a free slot loads it, evicting none
	LoRASwap    LoRAPlacement = "swap"    // where loading it evicts an idle adapter
	LoRAQueued  LoRAPlacement = "waiting" // where its requests already wait, every slot in use
	LoRAFull    LoRAPlacement = "full"    // where every slot is in use: it waits for one, then evicts
	LoRAUnknown LoRAPlacement = "unknown" // no candidate told (stale): placed as a base model's request
)

// LoRAPlacements lists every placement, for metric initialisation.
var LoRAPlacements = []LoRAPlacement{LoRALoaded, LoRALoad, LoRASwap, LoRAQueued, LoRAFull, LoRAUnknown}

// placementOf is the placement of a request sent to a replica of fit f.
func placementOf(f LoRAFit) LoRAPlacement {
	switch {
	case f&LoRAAdapter == 0:
		return LoRAUnknown
	case f&LoRAResident != 0:
		return LoRALoaded
	case f&LoRARoom != 0 && f&LoRAFree != 0:
		return LoRALoad
	case f&LoRARoom != 0:
		return LoRASwap
	case f&LoRAWaiting != 0:
		return LoRAQueued
	}
	return LoRAFull
}

// loraMode is which candidates pickLoRA leaves to the decision.
type loraMode uint8

const (
	loraAll           loraMode = iota // no candidate tells: all, as a base model's request
	loraLoadedOnly                    // the replicas holding the adapter
	loraLoadedAndLoad                 // those, and the one to load it on
	loraLoadOrQueued                  // the one to load it on (busy), and where it waits
	loraQueuedOnly                    // where it waits
	loraOne                           // the one to load it on, every slot in use
)

// pickLoRA is the LoRA scorer: it leaves the decision (Pick, over the
// candidates it keeps) only the replicas an adapter's request should go
// to, in about the order llm-d's lora-affinity scorer ranks them (loaded,
// room to load it, already queued there, full), bounded by the engine's
// limit:
//
//   - a replica holding the adapter that can start the request (a free
//     sequence slot): the replicas holding it, among which the decision
//     is the usual cache-aware one;
//   - else, those (all busy) and the one replica to load it on next: of
//     the replicas that can start the request and load it without
//     waiting (fewer adapters in use than the limit), one with a free
//     slot if any (it evicts none), else one holding only idle adapters
//     (it evicts the least recently used); among those, the first by
//     rendezvous hashing of (adapter, replica), so that every router,
//     and routers that cannot talk, load an adapter on the same replica,
//     and different adapters on different ones. The decision weighs
//     queueing where it is loaded against loading it there (the cold
//     path takes the one that can start it);
//   - with none of those, the replicas holding it, queueing there;
//   - held nowhere and no replica to load it on that can start it: the
//     first by rendezvous that could load it without waiting (busy) and
//     the replicas where it waits; else where it waits; else the first
//     by rendezvous of the replicas that can start it (else of all),
//     where it waits for a slot to free.
//
// Stale candidates tell nothing (their owner's word is old) and are left
// out, unless no candidate tells, when the request is placed as a base
// model's. The decision's reason is the one Pick gives among the kept.
func (p Policy) pickLoRA(req Request, cands []Candidate) Decision {
	key := req.Model
	if key == 0 {
		key = req.Root
	}
	loaded, loadedCan, queued := 0, false, 0
	load, swap, roomBusy, full, fullCan := -1, -1, -1, -1, -1
	var wLoad, wSwap, wRoomBusy, wFull, wFullCan uint64
	best := func(i int, w uint64, at *int, aw *uint64) {
		if *at < 0 || w > *aw {
			*at, *aw = i, w
		}
	}
	for i := range cands {
		c := &cands[i]
		f := c.LoRA
		if c.Stale || f&LoRAAdapter == 0 {
			continue
		}
		can := canStart(c)
		switch w := weight(key, c.Hash); {
		case f&LoRAResident != 0:
			loaded++
			loadedCan = loadedCan || can
		case f&LoRARoom != 0 && can && f&LoRAFree != 0:
			best(i, w, &load, &wLoad)
		case f&LoRARoom != 0 && can:
			best(i, w, &swap, &wSwap)
		case f&LoRARoom != 0:
			best(i, w, &roomBusy, &wRoomBusy)
		case f&LoRAWaiting != 0:
			queued++
		case can:
			best(i, w, &fullCan, &wFullCan)
		default:
			best(i, w, &full, &wFull)
		}
	}
	mode, one := loraAll, -1
	switch {
	case loadedCan:
		mode = loraLoadedOnly
	case load >= 0:
		mode, one = loraLoadedAndLoad, load
	case swap >= 0:
		mode, one = loraLoadedAndLoad, swap
	case loaded > 0:
		mode = loraLoadedOnly
	case roomBusy >= 0:
		mode, one = loraLoadOrQueued, roomBusy
	case queued > 0:
		mode = loraQueuedOnly
	case fullCan >= 0:
		mode, one = loraOne, fullCan
	case full >= 0:
		mode, one = loraOne, full
	}
	req.loraPlaced = true
	if mode == loraAll {
		d := p.Pick(req, cands)
		d.LoRA = LoRAUnknown
		return d
	}
	kept := 0
	for i := range cands {
		if keepLoRA(mode, &cands[i], i == one) {
			kept++
		}
	}
	if kept == len(cands) { // every replica holds it, say: no copy
		d := p.Pick(req, cands)
		if d.Index >= 0 {
			d.LoRA = placementOf(cands[d.Index].LoRA)
		}
		return d
	}
	// The kept candidates, copied (on the stack for a few): Pick reads
	// a slice, and the caller's must stay as they are.
	var buf [16]Candidate
	var ibuf [16]int
	sub, idx := buf[:0], ibuf[:0]
	if kept > len(buf) {
		sub, idx = make([]Candidate, 0, kept), make([]int, 0, kept)
	}
	for i := range cands {
		if c := &cands[i]; keepLoRA(mode, c, i == one) {
			sub = append(sub, *c)
			idx = append(idx, i)
		}
	}
	d := p.Pick(req, sub)
	if d.Index >= 0 {
		d.Index = idx[d.Index]
		d.LoRA = placementOf(cands[d.Index].LoRA)
	}
	return d
}

// keepLoRA reports whether pickLoRA's mode keeps c (one: c is the
// replica to load the adapter on).
func keepLoRA(mode loraMode, c *Candidate, one bool) bool {
	f := c.LoRA
	if c.Stale || f&LoRAAdapter == 0 {
		return false
	}
	loaded := f&LoRAResident != 0
	queued := !loaded && f&LoRARoom == 0 && f&LoRAWaiting != 0
	switch mode {
	case loraLoadedOnly:
		return loaded
	case loraLoadedAndLoad:
		return loaded || one
	case loraLoadOrQueued:
		return one || queued
	case loraQueuedOnly:
		return queued
	case loraOne:
		return one
	}
	return true
}
