package kvevents

import (
	"encoding/binary"
	"net"
	"sync"

	"github.com/kvmesh/kvmesh/internal/zmtp"
)

// Publisher publishes batches as vLLM's ZMQ publisher does: a PUB of
// [topic, seq, payload] and, when given a replay listener, a ROUTER
// answering [empty, start seq] with every buffered batch from that
// sequence on and the end marker. The replica simulator publishes with
// it; tests stand it in for vLLM.
type Publisher struct {
	topic []byte
	form  Form
	pub   *zmtp.Server
	rep   *zmtp.Server

	mu   sync.Mutex
	seq  uint64
	ring [][2][]byte // [seq, payload], the last len(ring) batches
	head int         // next slot of ring
	n    int         // filled slots
}

// NewPublisher publishes on ln (and answers replays on replay, if not
// nil), keeping the last buffer batches for replay (vLLM's buffer_steps).
func NewPublisher(ln, replay net.Listener, topic string, form Form, buffer int) *Publisher {
	p := &Publisher{topic: []byte(topic), form: form, ring: make([][2][]byte, max(buffer, 1))}
	p.pub = zmtp.Publish(ln, zmtp.Limits{})
	if replay != nil {
		p.rep = zmtp.Answer(replay, zmtp.Limits{}, p.answer)
	}
	return p
}

// Subscribers counts the subscribers connected.
func (p *Publisher) Subscribers() int { return p.pub.Subscribers() }

// Publish sends one batch under the next sequence number.
func (p *Publisher) Publish(b Batch) error {
	payload, err := EncodeBatch(b, p.form)
	if err != nil {
		return err
	}
	p.mu.Lock()
	seq := binary.BigEndian.AppendUint64(nil, p.seq)
	p.seq++
	p.ring[p.head] = [2][]byte{seq, payload}
	p.head = (p.head + 1) % len(p.ring)
	p.n = min(p.n+1, len(p.ring))
	// Sent under the lock, so that subscribers see sequence order.
	p.pub.Send(p.topic, seq, payload)
	p.mu.Unlock()
	return nil
}

// Skip consumes a sequence number without sending it: a batch lost on
// the way, for tests of gaps (it is still in the replay buffer).
func (p *Publisher) Skip(b Batch) error {
	payload, err := EncodeBatch(b, p.form)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ring[p.head] = [2][]byte{binary.BigEndian.AppendUint64(nil, p.seq), payload}
	p.seq++
	p.head = (p.head + 1) % len(p.ring)
	p.n = min(p.n+1, len(p.ring))
	return nil
}

func (p *Publisher) answer(req [][]byte) [][][]byte {
	if len(req) == 3 { // a ROUTER in front strips only the identity
		req = req[1:]
	}
	end := [][]byte{{}, binary.BigEndian.AppendUint64(nil, endSeq), {}}
	if len(req) != 2 || len(req[1]) != 8 {
		return [][][]byte{end}
	}
	from := binary.BigEndian.Uint64(req[1])
	p.mu.Lock()
	var out [][][]byte
	for i := range p.n {
		e := p.ring[(p.head-p.n+i+len(p.ring))%len(p.ring)]
		if binary.BigEndian.Uint64(e[0]) >= from {
			out = append(out, [][]byte{{}, e[0], e[1]})
		}
	}
	p.mu.Unlock()
	return append(out, end)
}

// Close stops publishing and closes every connection.
func (p *Publisher) Close() error {
	err := p.pub.Close()
	if p.rep != nil {
		if e := p.rep.Close(); err == nil {
			err = e
		}
	}
	return err
}
