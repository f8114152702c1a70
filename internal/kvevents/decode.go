// Package kvevents reads an engine's KV-cache events: vLLM's ZMQ
// publisher (multipart [topic, 8-byte big-endian sequence, msgpack
// EventBatch]) and its replay endpoint. decode.go turns a payload into
// events, subscriber.go keeps one subscription going (sequence numbers,
// replay of gaps, reconnection), encode.go writes the same format (the
// replica simulator publishes it, tests feed it).
//
// Two encodings of an event are read, since releases differ: vLLM 0.32
// encodes each event as a msgpack map tagged by "type"
// ({"type": "BlockStored", "block_hashes": [...], ...}); older releases
// encode it as an array whose first element is the tag
// (["BlockStored", block_hashes, parent_block_hash, token_ids,
// block_size, lora_id, medium, ...]). The batch is an array
// [ts, events, data_parallel_rank?] (or, to be lenient, a map of the same
// names). Block hashes are integers (64-bit) or, in releases that hash
// with sha256 bytes, byte strings, which are folded to 64 bits.
package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
	"github.com/zeebo/xxh3"
)

// Kind is an event's type.
type Kind uint8

// The events this package reads; others are skipped (Batch.Skipped).
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "unknown"
}

// Event is one KV-cache event.
type Event struct {
	Kind Kind
	// Hashes are the blocks stored or removed, in chain order for a
	// BlockStored (each the parent of the next).
	Hashes []uint64
	// Parent is the block before Hashes[0] (BlockStored with HasParent;
	// without, Hashes[0] starts a prompt).
	Parent    uint64
	HasParent bool
	// BlockSize is the tokens per block (BlockStored); Tokens the number
	// of token ids the event carried.
	BlockSize, Tokens int
	// Medium is where the blocks live ("GPU", "CPU", ...; "" if not said).
	Medium string
}

// Batch is one published message's events.
type Batch struct {
	// TS is the engine's wall-clock time of the batch, seconds since the
	// epoch.
	TS     float64
	Events []Event
	// Skipped counts events of kinds this package does not read.
	Skipped int
}

// Limits on one payload, so that a hostile one holds little.
const (
	MaxEvents = 1 << 16 // per batch
	MaxHashes = 1 << 16 // per event
	maxDepth  = 16      // nesting of values skipped unread
)

// ErrMalformed marks a payload that is not an event batch.
var ErrMalformed = errors.New("kvevents: malformed event batch")

func bad(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
}

// DecodeBatch decodes one EventBatch payload. Events of unknown kinds
// are skipped and counted; fields a later release adds are skipped.
func DecodeBatch(payload []byte) (Batch, error) {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	var b Batch
	c, err := d.PeekCode()
	if err != nil {
		return b, bad("empty")
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil || n < 2 {
			return b, bad("batch array of %d", n)
		}
		if b.TS, err = decodeFloat(d); err != nil {
			return b, err
		}
		if err := decodeEvents(d, &b); err != nil {
			return b, err
		}
		for i := 2; i < n; i++ { // data_parallel_rank and later fields
			if err := skip(d, 0); err != nil {
				return b, err
			}
		}
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return b, bad("batch map")
		}
		seen := false
		for range n {
			k, err := decodeKey(d)
			if err != nil {
				return b, err
			}
			switch k {
			case "ts":
				if b.TS, err = decodeFloat(d); err != nil {
					return b, err
				}
			case "events":
				if err := decodeEvents(d, &b); err != nil {
					return b, err
				}
				seen = true
			default:
				if err := skip(d, 0); err != nil {
					return b, err
				}
			}
		}
		if !seen {
			return b, bad("batch without events")
		}
	default:
		return b, bad("batch of code %#x", c)
	}
	if _, err := d.PeekCode(); err == nil {
		return b, bad("trailing bytes")
	}
	return b, nil
}

func decodeEvents(d *msgpack.Decoder, b *Batch) error {
	n, err := d.DecodeArrayLen()
	if err != nil || n < 0 {
		return bad("events")
	}
	if n > MaxEvents {
		return bad("%d events (limit %d)", n, MaxEvents)
	}
	for range n {
		e, known, err := decodeEvent(d)
		if err != nil {
			return err
		}
		if known {
			b.Events = append(b.Events, e)
		} else {
			b.Skipped++
		}
	}
	return nil
}

func kindOf(tag string) Kind {
	switch tag {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

// Field order of the array encoding (msgspec array_like with tag first).
var arrayFields = map[Kind][]string{
	BlockStored:      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"},
	BlockRemoved:     {"block_hashes", "medium"},
	AllBlocksCleared: {},
}

func decodeEvent(d *msgpack.Decoder) (Event, bool, error) {
	var e Event
	c, err := d.PeekCode()
	if err != nil {
		return e, false, bad("truncated event")
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil || n < 0 {
			return e, false, bad("event map")
		}
		unknown := false
		for range n {
			k, err := decodeKey(d)
			if err != nil {
				return e, false, err
			}
			if k == "type" {
				tag, err := decodeKey(d)
				if err != nil {
					return e, false, err
				}
				if e.Kind = kindOf(tag); e.Kind == 0 {
					unknown = true
				}
				continue
			}
			if err := e.field(d, k); err != nil {
				return e, false, err
			}
		}
		if e.Kind == 0 && !unknown {
			return e, false, bad("event without a type")
		}
		return e, !unknown, nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil || n < 1 {
			return e, false, bad("event array")
		}
		tag, err := decodeKey(d)
		if err != nil {
			return e, false, err
		}
		e.Kind = kindOf(tag)
		names := arrayFields[e.Kind]
		for i := 1; i < n; i++ {
			name := ""
			if e.Kind != 0 && i-1 < len(names) {
				name = names[i-1]
			}
			if err := e.field(d, name); err != nil {
				return e, false, err
			}
		}
		return e, e.Kind != 0, nil
	}
	return e, false, bad("event of code %#x", c)
}

// field decodes the value of one named field into e (unknown names are
// skipped).
func (e *Event) field(d *msgpack.Decoder, name string) error {
	var err error
	switch name {
	case "block_hashes":
		n, lerr := d.DecodeArrayLen()
		if lerr != nil || n < 0 {
			return bad("block_hashes")
		}
		if n > MaxHashes {
			return bad("%d block hashes (limit %d)", n, MaxHashes)
		}
		e.Hashes = make([]uint64, 0, min(n, 1024))
		for range n {
			h, err := decodeHash(d)
			if err != nil {
				return err
			}
			e.Hashes = append(e.Hashes, h)
		}
	case "parent_block_hash":
		if c, _ := d.PeekCode(); c == msgpcode.Nil {
			return d.DecodeNil()
		}
		e.Parent, err = decodeHash(d)
		e.HasParent = err == nil
	case "token_ids":
		n, lerr := d.DecodeArrayLen()
		if lerr != nil || n < 0 {
			return bad("token_ids")
		}
		e.Tokens = n
		for range n {
			if err := skip(d, 1); err != nil {
				return err
			}
		}
	case "block_size":
		var v int64
		if v, err = d.DecodeInt64(); err == nil && (v < 0 || v > 1<<20) {
			return bad("block_size %d", v)
		}
		e.BlockSize = int(v)
	case "medium":
		if c, _ := d.PeekCode(); c == msgpcode.Nil {
			return d.DecodeNil()
		}
		e.Medium, err = decodeKey(d)
	default:
		return skip(d, 0)
	}
	if err != nil {
		return bad("%s: %v", name, err)
	}
	return nil
}

// decodeHash reads a block hash: an integer, or bytes folded to 64 bits.
func decodeHash(d *msgpack.Decoder) (uint64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, bad("truncated hash")
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		n, err := d.DecodeBytesLen()
		if err != nil || n < 0 || n > 1024 {
			return 0, bad("hash bytes")
		}
		buf := make([]byte, n)
		if err := d.ReadFull(buf); err != nil {
			return 0, bad("hash bytes")
		}
		return xxh3.Hash(buf), nil
	}
	if !isInt(c) {
		return 0, bad("hash of code %#x", c)
	}
	return d.DecodeUint64()
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64)
}

func decodeFloat(d *msgpack.Decoder) (float64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, bad("truncated ts")
	}
	if c == msgpcode.Float || c == msgpcode.Double || isInt(c) {
		f, err := d.DecodeFloat64()
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, bad("ts")
		}
		return f, nil
	}
	return 0, bad("ts of code %#x", c)
}

// decodeKey reads a short string (a key or a tag).
func decodeKey(d *msgpack.Decoder) (string, error) {
	c, err := d.PeekCode()
	if err != nil || !(msgpcode.IsString(c) || msgpcode.IsBin(c)) {
		return "", bad("expected a string")
	}
	n, err := d.DecodeBytesLen()
	if err != nil || n < 0 || n > 256 {
		return "", bad("string of %d bytes", n)
	}
	buf := make([]byte, n)
	if err := d.ReadFull(buf); err != nil {
		return "", bad("truncated string")
	}
	return string(buf), nil
}

// skip passes over one value, with the nesting bounded (the library's
// Skip recurses as deep as the input nests).
func skip(d *msgpack.Decoder, depth int) error {
	if depth > maxDepth {
		return bad("nested deeper than %d", maxDepth)
	}
	c, err := d.PeekCode()
	if err != nil {
		return bad("truncated")
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return bad("array")
		}
		for range n {
			if err := skip(d, depth+1); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return bad("map")
		}
		for range 2 * n {
			if err := skip(d, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if err := d.Skip(); err != nil {
		return bad("value: %v", err)
	}
	return nil
}
