package route

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// EngineLoad is what the decision reads of an engine's own metrics, as
// one value from the engine adapter (internal/engine fills it from the
// engine's /metrics and info endpoint) through the health checker and
// the mesh's gossip (AppendWire, DecodeWire) to the Candidate that
// embeds it. A field the decision should read of the engine is added
// here, with its wire tag, its Merge and its Forget; the adapter that
// reads it fills it, and nothing between the two changes. docs/DESIGN.md
// ("Worked example: one more engine field") walks through one.
//
// Every field's zero is "unknown": a router that does not know a field
// (an older one, or an engine that does not publish it) leaves it zero,
// and the decision must read zero as no evidence either way.
type EngineLoad struct {
	// Running and Waiting are the engine's own counts of sequences it runs
	// and requests it queues (vLLM num_requests_running/waiting, SGLang
	// num_running_reqs/num_queue_reqs), as last scraped; the Candidate's
	// InFlight is the router's faster signal in between scrapes. Both are
	// 0 unless HasLoad (the wire carries them only with it).
	Running, Waiting int32
	// Slots is how many sequences the engine runs at once (max-num-seqs),
	// published or learned (SlotEstimate); 0 means unknown.
	Slots int32
	// KVUsage is the share of the engine's KV cache that its running
	// sequences hold, in 1/10000 (vLLM's kv_cache_usage_perc, SGLang's
	// token_usage); 0 is unknown or empty, both no evidence of pressure.
	// Blocks cached for reuse but held by no sequence do not count: the
	// engine evicts them to admit a request.
	KVUsage uint16
	// MinSlots is a lower bound on the engine's sequence slots while
	// Slots is unknown: the most sequences it has been seen running with
	// nothing waiting (the health checker's scrapes), saturated at 255,
	// which is a bound all the same. An engine running fewer than that
	// can start a request at once as far as its slots go, so the
	// hot-spot guard does not hold it to the in-flight bound it keeps for
	// engines of unknown capacity (route/load.go). 0 is unknown: not seen
	// running yet, or Slots known.
	MinSlots uint8
	// HasLoad reports that Running and Waiting are the engine's counts:
	// its last scrape published them. An engine that publishes none
	// (no such gauges on its /metrics, a generic OpenAI server) or whose
	// scrape fails reports 0 and 0, which say nothing: it never reads
	// as idle to the burst rule (hashPick).
	HasLoad bool
}

// Merge returns l with its unknown fields taken from o: an engine's
// /metrics (l) with what its info endpoint (o) adds.
func (l EngineLoad) Merge(o EngineLoad) EngineLoad {
	if !l.HasLoad && o.HasLoad {
		l.Running, l.Waiting, l.HasLoad = o.Running, o.Waiting, true
	}
	if l.Slots == 0 {
		l.Slots = o.Slots
	}
	if l.KVUsage == 0 {
		l.KVUsage = o.KVUsage
	}
	if l.MinSlots == 0 {
		l.MinSlots = o.MinSlots
	}
	return l
}

// Forget returns l as known once the engine's /metrics stops answering:
// what the engine is configured with (Slots) stays, its gauges become
// unknown. A field not named here is a gauge and is forgotten. MinSlots
// is what the engine was seen to run, not a gauge, and stays too.
func (l EngineLoad) Forget() EngineLoad {
	return EngineLoad{Slots: l.Slots, MinSlots: l.MinSlots}
}

// The wire tags of EngineLoad's fields. A tag's number never changes
// meaning; a new field takes the next one.
const (
	wireRunning  = 1 // Running, present iff HasLoad
	wireWaiting  = 2 // Waiting, present iff HasLoad
	wireSlots    = 3 // Slots, present when known
	wireKVUsage  = 4 // KVUsage, present when known
	wireMinSlots = 5 // MinSlots, present when known
)

// KVFull is KVUsage's whole cache.
const KVFull = 10000

// AppendWire appends l's wire form: a one-byte length, then each known
// field as a tag byte and the value as an unsigned varint, in increasing
// tag order. A field at its zero (unknown) is left out, so an engine that
// publishes little costs few bytes.
//
// The section is how a field reaches routers of every version without a
// new mesh wire version: DecodeWire skips a tag it does not know (every
// value is a varint, so it knows the value's end), and a router that
// does not send a field leaves it unknown at the receiver. That is also
// why every field's zero must mean unknown.
func (l EngineLoad) AppendWire(dst []byte) []byte {
	return AppendEngineWire(dst, l, LoRAs{})
}

// AppendEngineWire appends the section of l and a replica's LoRA
// adapters (a): l's fields, then a's (LoRAs' tags follow EngineLoad's),
// which a router that does not know them skips.
func AppendEngineWire(dst []byte, l EngineLoad, a LoRAs) []byte {
	n := len(dst)
	dst = append(dst, 0)
	if l.HasLoad {
		dst = appendWireField(dst, wireRunning, l.Running)
		dst = appendWireField(dst, wireWaiting, l.Waiting)
	}
	if l.Slots > 0 {
		dst = appendWireField(dst, wireSlots, l.Slots)
	}
	if l.KVUsage > 0 {
		dst = appendWireField(dst, wireKVUsage, int32(l.KVUsage))
	}
	if l.MinSlots > 0 {
		dst = appendWireField(dst, wireMinSlots, int32(l.MinSlots))
	}
	dst = a.appendWire(dst)
	// A section is at most 255 bytes (its length is one byte): the
	// fields, a tag and at most 5 bytes of varint each, and LoRAs'
	// bounded entries stay under it (TestEngineWireFits).
	dst[n] = byte(len(dst) - n - 1)
	return dst
}

func appendWireField(dst []byte, tag byte, v int32) []byte {
	return binary.AppendUvarint(append(dst, tag), uint64(max(v, 0)))
}

var errEngineWire = errors.New("engine load: truncated")

// DecodeWire reads one section that AppendWire wrote at the start of b
// into l and returns its length. It refuses a value out of its field's
// range, tags out of increasing order (so that a section has one
// reading), and a varint that runs past the section; it skips a tag it
// does not know (LoRAs' among them: DecodeEngineWire reads those). The
// bytes come from the network.
func (l *EngineLoad) DecodeWire(b []byte) (int, error) {
	var out EngineLoad
	n, err := decodeSection(b, func(tag byte, v uint64) error { return out.field(tag, v) })
	if err != nil {
		return 0, err
	}
	*l = out
	return n, nil
}

// DecodeEngineWire reads one section that AppendEngineWire wrote at the
// start of b: the engine's load, its LoRA adapters, and the section's
// length. It checks LoRAs' tags as strictly as EngineLoad's.
func DecodeEngineWire(b []byte) (EngineLoad, LoRAs, int, error) {
	var l EngineLoad
	var d loraDecoder
	n, err := decodeSection(b, func(tag byte, v uint64) error {
		if ok, err := d.field(tag, v); ok {
			return err
		}
		return l.field(tag, v)
	})
	if err != nil {
		return EngineLoad{}, LoRAs{}, 0, err
	}
	a, err := d.done()
	if err != nil {
		return EngineLoad{}, LoRAs{}, 0, err
	}
	return l, a, n, nil
}

// decodeSection walks the fields of the section at the start of b,
// handing each tag and value to field, and returns the section's
// length: the one reading of a section's framing, shared by every
// decoder of it.
func decodeSection(b []byte, field func(tag byte, v uint64) error) (int, error) {
	if len(b) < 1 || int(b[0]) > len(b)-1 {
		return 0, errEngineWire
	}
	n := 1 + int(b[0])
	sec := b[1:n]
	last := byte(0)
	for len(sec) > 0 {
		tag := sec[0]
		if tag <= last {
			return 0, fmt.Errorf("engine load: tag %d after %d", tag, last)
		}
		last = tag
		v, k := binary.Uvarint(sec[1:])
		if k <= 0 {
			return 0, fmt.Errorf("engine load: tag %d: bad varint", tag)
		}
		sec = sec[1+k:]
		if err := field(tag, v); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// field reads one of EngineLoad's tags into l; a tag it does not know is
// skipped.
func (l *EngineLoad) field(tag byte, v uint64) error {
	var count bool // the tag is a count in [0, MaxInt32]
	switch tag {
	case wireRunning:
		l.Running, l.HasLoad, count = int32(min(v, math.MaxInt32)), true, true
	case wireWaiting:
		l.Waiting, l.HasLoad, count = int32(min(v, math.MaxInt32)), true, true
	case wireSlots:
		l.Slots, count = int32(min(v, math.MaxInt32)), true
	case wireKVUsage:
		if v > KVFull {
			return fmt.Errorf("engine load: KV usage %d over %d", v, KVFull)
		}
		l.KVUsage = uint16(v)
	case wireMinSlots:
		if v > math.MaxUint8 {
			return fmt.Errorf("engine load: min slots %d over %d", v, math.MaxUint8)
		}
		l.MinSlots = uint8(v)
	}
	if count && v > math.MaxInt32 {
		return fmt.Errorf("engine load: tag %d: count %d out of range", tag, v)
	}
	return nil
}
