package admit

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/route"
)

// Room is a model's headroom, as read from its candidates (RoomOf).
type Room struct {
	// Open reports that some replica gives no signal of saturation (no
	// slots and no waiting count published, or fewer waiting than
	// MaxWaiting on an engine with unknown slots): the model is never
	// held back.
	Open bool
	// Free is how many more requests the replicas with known slots
	// take (the sum of each replica's Slots + MaxWaiting − InFlight, at
	// least 0 each).
	Free int
	// FreeSlots is how many of them start at once, without waiting in
	// an engine's queue (the sum of Slots − InFlight, at least 0 each):
	// the low class's room.
	FreeSlots int
	// Visible is the sum of the candidates' in-flight counts: what of
	// the router's own admitted requests the counts already show.
	Visible int
}

// Limits are the absolute limits RoomOf holds each replica to.
type Limits struct {
	// MaxWaiting is the requests a replica may queue beyond its slots.
	MaxWaiting int
	// MaxKVUsage, when positive, is the share of its KV cache (0 to 1)
	// at which an engine that reports its usage has no room, whatever
	// its slots; 0: KV usage is not read.
	MaxKVUsage float64
}

// RoomOf reads the headroom of a model from its candidates (the
// decision's, with the router's loads filled in), held to lim.
//
// With its slots known, a replica's room is Slots + MaxWaiting less the
// router's in-flight count, which follows each dispatch and each end at
// once; the engine's waiting count, a scrape old, is not held against
// it (a stale count would hold a queue back for a whole scrape interval
// while slots sit free). Without slots, the engine's waiting count is the
// only signal: MaxWaiting or more waiting is no room, fewer is open. An
// engine whose KV usage is at MaxKVUsage or above has no room either: its
// next requests would wait for memory, or push running ones out.
func RoomOf(cands []route.Candidate, lim Limits) Room {
	var r Room
	kvFull := uint16(0)
	if lim.MaxKVUsage > 0 {
		kvFull = uint16(max(min(lim.MaxKVUsage, 1)*10000, 1))
	}
	for i := range cands {
		c := &cands[i]
		r.Visible += int(max(c.InFlight, 0))
		switch {
		case kvFull > 0 && c.KVUsage >= kvFull:
		case c.Slots > 0:
			r.Free += max(int(c.Slots)+lim.MaxWaiting-int(c.InFlight), 0)
			r.FreeSlots += max(int(c.Slots)-int(c.InFlight), 0)
		case c.HasLoad && int(c.Waiting) >= lim.MaxWaiting:
		default:
			r.Open = true
		}
	}
	return r
}

// Class is a request's priority class; a lower value is served first,
// and the zero value is Normal.
type Class int8

// The classes, highest first.
const (
	High Class = iota - 1
	Normal
	Low
	// NumClasses counts the classes.
	NumClasses = 3
)

var classNames = [NumClasses]string{"high", "normal", "low"}

// idx is the class's index in arrays by class, 0 for the highest.
func (c Class) idx() int { return int(c - High) }

// classAt is the class of index i.
func classAt(i int) Class { return Class(i) + High }

func (c Class) String() string {
	if c < High || c > Low {
		return "class" + strconv.Itoa(int(c))
	}
	return classNames[c.idx()]
}

// Headers a client may send.
const (
	// HeaderPriority is the request's class: high, normal or low, or an
	// integer as vLLM's priority field reads (lower is more urgent:
	// negative is high, 0 normal, positive low).
	HeaderPriority = "X-Kvmesh-Priority"
	// HeaderQueueTimeout shortens how long the request may wait in the
	// router's queue (a Go duration such as 500ms or 2s, or seconds); it
	// never lengthens the router's own limit.
	HeaderQueueTimeout = "X-Kvmesh-Queue-Timeout"
	// HeaderTenant names the tenant when the router has no API keys.
	HeaderTenant = "X-Kvmesh-Tenant"
)

// ParseClass reads a priority: a class name, or an integer in vLLM's
// sense (lower is more urgent). ok is false for anything else.
func ParseClass(s string) (c Class, ok bool) {
	s = strings.TrimSpace(s)
	for i, n := range classNames {
		if strings.EqualFold(s, n) {
			return classAt(i), true
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return Normal, false
	}
	return ClassOfPriority(n), true
}

// ClassOfPriority maps vLLM's integer priority (default 0, lower is
// handled earlier) to a class.
func ClassOfPriority(n int) Class {
	switch {
	case n < 0:
		return High
	case n > 0:
		return Low
	}
	return Normal
}

// ParseTimeout reads HeaderQueueTimeout: a Go duration or seconds. ok is
// false for anything else, or a negative value.
func ParseTimeout(s string) (d time.Duration, ok bool) {
	s = strings.TrimSpace(s)
	if d, err := time.ParseDuration(s); err == nil {
		return d, d >= 0
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsNaN(f) || f > float64(math.MaxInt64/int64(time.Second)) {
		return 0, false
	}
	return time.Duration(f * float64(time.Second)), true
}
