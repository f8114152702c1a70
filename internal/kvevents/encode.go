package kvevents

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// Form is an encoding of events.
type Form uint8

// The encodings vLLM releases use (see the package comment).
const (
	FormMap   Form = iota // vLLM 0.32: each event a map tagged by "type"
	FormArray             // older releases: each event an array, tag first
)

// EncodeBatch encodes b as a vLLM EventBatch payload in form: what the
// replica simulator publishes and tests feed the decoder. Token ids are
// written as zeros, Tokens of them (the router reads only their count).
func EncodeBatch(b Batch, form Form) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	err := first(enc.EncodeArrayLen(3), enc.EncodeFloat64(b.TS), enc.EncodeArrayLen(len(b.Events)))
	for _, e := range b.Events {
		if err != nil {
			break
		}
		err = encodeEvent(enc, e, form)
	}
	if err == nil {
		err = enc.EncodeNil() // data_parallel_rank
	}
	return buf.Bytes(), err
}

func first(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func encodeEvent(enc *msgpack.Encoder, e Event, form Form) error {
	names := arrayFields[e.Kind]
	if form == FormArray {
		if err := first(enc.EncodeArrayLen(1+len(names)), enc.EncodeString(e.Kind.String())); err != nil {
			return err
		}
	} else if err := first(enc.EncodeMapLen(1+len(names)), enc.EncodeString("type"), enc.EncodeString(e.Kind.String())); err != nil {
		return err
	}
	for _, n := range names {
		if form == FormMap {
			if err := enc.EncodeString(n); err != nil {
				return err
			}
		}
		var err error
		switch n {
		case "block_hashes":
			err = enc.EncodeArrayLen(len(e.Hashes))
			for _, h := range e.Hashes {
				err = first(err, enc.EncodeUint(h))
			}
		case "parent_block_hash":
			if e.HasParent {
				err = enc.EncodeUint(e.Parent)
			} else {
				err = enc.EncodeNil()
			}
		case "token_ids":
			err = enc.EncodeArrayLen(e.Tokens)
			for range e.Tokens {
				err = first(err, enc.EncodeUint(0))
			}
		case "block_size":
			err = enc.EncodeInt(int64(e.BlockSize))
		case "lora_id":
			err = enc.EncodeNil()
		case "medium":
			if e.Medium == "" {
				err = enc.EncodeNil()
			} else {
				err = enc.EncodeString(e.Medium)
			}
		}
		if err != nil {
			return err
		}
	}
	return nil
}
