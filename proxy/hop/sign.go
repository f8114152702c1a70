package hop

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headers of a hop: the hints of the deciding router.
const (
	// HeaderReplica names the replica the deciding router chose.
	HeaderReplica = "X-Kvmesh-Replica"
	// HeaderHop marks a forwarded request: its receiver never forwards it
	// again.
	HeaderHop = "X-Kvmesh-Hop"
	// HeaderMatch is the deciding router's predicted prefix match in blocks.
	HeaderMatch = "X-Kvmesh-Match"
)

// Headers authenticating a forwarded request's hints.
const (
	// HeaderHopTime is the forwarding router's clock (Unix seconds).
	HeaderHopTime = "X-Kvmesh-Hop-Time"
	// HeaderHopMAC is base64 HMAC-SHA256, under a key derived from the
	// mesh's gossip key, of the hints, method, path and HeaderHopTime.
	HeaderHopMAC = "X-Kvmesh-Hop-Mac"
)

// Skew is how far a hop's timestamp may be from this router's clock:
// a captured forwarded request cannot be replayed after it (and with
// --peer-tls-ca none can be captured).
const Skew = 60 * time.Second

// Key derives the key that authenticates hints from the mesh's gossip
// key, so the gossip key itself is used by one primitive only.
func Key(gossipKey []byte) []byte {
	if len(gossipKey) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, gossipKey)
	m.Write([]byte("kvmesh hop mac v1"))
	return m.Sum(nil)
}

func hintMAC(key []byte, method, path, replica, hop, match, ts string) []byte {
	m := hmac.New(sha256.New, key)
	for _, s := range []string{method, path, replica, hop, match, ts} {
		m.Write([]byte(s))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// Signer signs and verifies what routers send each other: a hop's hints
// and a lookup's question. Without a key nothing is signed and nothing
// verifies.
type Signer struct {
	// Key is Key of the mesh's gossip key (nil: none).
	Key []byte
	// Now is the clock of the stamps (time.Now if nil).
	Now func() time.Time
}

func (s *Signer) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Sign sets the hint headers of a request forwarded to a replica's
// owner, with their MAC when the mesh has a key. concurrent and fork are
// the deciding router's route.Request.Concurrent and ForkBlocks: an owner
// that re-picks (the hinted replica gone or over the bound) decides with
// them, as the deciding router would have.
func (s *Signer) Sign(out *http.Request, replica string, match, concurrent, fork int) {
	s.SignLeg(out, replica, match, concurrent, fork, LegNone)
}

// SignLeg is Sign for one leg of a disaggregated request: the owner
// serves it among its replicas of the leg's role (Leg).
func (s *Signer) SignLeg(out *http.Request, replica string, match, concurrent, fork int, leg Leg) {
	h := out.Header
	ms, hv := strconv.Itoa(match), ValueLeg(concurrent, fork, leg)
	h.Set(HeaderReplica, replica)
	h.Set(HeaderHop, hv)
	h.Set(HeaderMatch, ms)
	if len(s.Key) == 0 {
		return
	}
	s.Stamp(h, func(ts string) []byte { return hintMAC(s.Key, out.Method, out.URL.Path, replica, hv, ms, ts) })
}

// Stamp sets the time and the MAC (mac of that time) that authenticate a
// request between routers: a hop, or a lookup.
func (s *Signer) Stamp(h http.Header, mac func(ts string) []byte) {
	ts := strconv.FormatInt(s.now().Unix(), 10)
	h.Set(HeaderHopTime, ts)
	h.Set(HeaderHopMAC, base64.RawStdEncoding.EncodeToString(mac(ts)))
}

// VerifyStamp checks what Stamp set: a time within Skew of this
// router's clock and its MAC.
func (s *Signer) VerifyStamp(h http.Header, mac func(ts string) []byte) bool {
	ts := h.Get(HeaderHopTime)
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	if d := s.now().Sub(time.Unix(sec, 0)); d > Skew || d < -Skew {
		return false
	}
	got, err := base64.RawStdEncoding.DecodeString(h.Get(HeaderHopMAC))
	return err == nil && hmac.Equal(got, mac(ts))
}

// maxHopCount bounds the counts a hop header carries.
const maxHopCount = 1 << 20

// maxHopValue bounds the length of a hop header's value Parse reads:
// "1;c=1048576;f=1048576" is 21 bytes, and a later version's fields
// leave room; a longer value, a stranger's or a broken one, is read as
// "1" without looking further.
const maxHopValue = 64

// Value is X-Kvmesh-Hop's value: "1", then ";c=N" and ";f=M" for a
// deciding router's Concurrent and ForkBlocks when they say anything.
// Owners of earlier versions only test that the header is present, and
// the MAC covers the whole value.
func Value(concurrent, fork int) string {
	v := "1"
	if concurrent > 1 {
		v += ";c=" + strconv.Itoa(min(concurrent, maxHopCount))
	}
	if fork > 0 {
		v += ";f=" + strconv.Itoa(min(fork, maxHopCount))
	}
	return v
}

// Leg is which leg of a prefill/decode disaggregated request a hop is
// (its hop value's "l" field): the deciding router split the request,
// so the owner sends the body as it is, among its replicas of the leg's
// role. Owners of earlier versions skip the field and serve the leg as
// a whole request, among replicas that are all whole to them (they
// gossip no role).
type Leg byte

// The legs.
const (
	// LegNone: a whole request.
	LegNone Leg = 0
	// LegPrefill: the prefill leg; the owner may decide again among its
	// prefill replicas.
	LegPrefill Leg = 'p'
	// LegDecode: the decode leg; the owner may decide again among its
	// decode replicas.
	LegDecode Leg = 'd'
	// LegPinned: a prefill leg bound to the hinted replica (its
	// decode leg names it); the owner sends it there or nowhere.
	LegPinned Leg = 'x'
)

// ValueLeg is Value with leg's field.
func ValueLeg(concurrent, fork int, leg Leg) string {
	v := Value(concurrent, fork)
	switch leg {
	case LegPrefill, LegDecode, LegPinned:
		v += ";l=" + string(rune(leg))
	}
	return v
}

// ParseLeg reads the leg of a hop header's value as strictly as Parse
// reads its counts: LegNone unless one "l" field names a leg.
func ParseLeg(v string) Leg {
	if len(v) > maxHopValue {
		return LegNone
	}
	first, rest, _ := strings.Cut(v, ";")
	if first != "1" {
		return LegNone
	}
	leg, seen := LegNone, false
	for f := range strings.SplitSeq(rest, ";") {
		k, val, _ := strings.Cut(f, "=")
		if k != "l" {
			continue
		}
		if seen {
			return LegNone // twice
		}
		seen = true
		switch val {
		case "p", "d", "x":
			leg = Leg(val[0])
		}
	}
	return leg
}

// Parse reads the counts of a hop header's value, strictly: the value
// is "1" and fields "k=N", N in decimal without sign or leading zero, at
// most maxHopCount. A count that is malformed, out of range or given
// twice is 0 (unknown); a value over maxHopValue bytes, or not "1"
// first, carries none. A field of another name is a later version's and
// is skipped. The owner bounds what it does with them anyway (the fork
// to the request's blocks; the concurrency only compares).
func Parse(v string) (concurrent, fork int) {
	if len(v) > maxHopValue {
		return 0, 0
	}
	first, rest, _ := strings.Cut(v, ";")
	if first != "1" {
		return 0, 0
	}
	seenC, seenF := false, false
	for f := range strings.SplitSeq(rest, ";") {
		k, val, _ := strings.Cut(f, "=")
		var seen *bool
		var dst *int
		switch k {
		case "c":
			seen, dst = &seenC, &concurrent
		case "f":
			seen, dst = &seenF, &fork
		default:
			continue
		}
		n, ok := hopCount(val)
		if *seen || !ok {
			n = 0 // twice or malformed: unknown
		}
		*seen, *dst = true, n
	}
	return concurrent, fork
}

// hopCount parses a count as Value writes it: decimal digits, no sign,
// no leading zero, at most maxHopCount.
func hopCount(s string) (int, bool) {
	if s == "" || len(s) > 7 || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, n <= maxHopCount
}

// Verify reports whether r carries hints signed with the key within
// Skew of this router's clock.
func (s *Signer) Verify(r *http.Request) bool {
	h := r.Header
	return h.Get(HeaderHop) != "" && s.VerifyStamp(h, func(ts string) []byte {
		return hintMAC(s.Key, r.Method, r.URL.Path, h.Get(HeaderReplica), h.Get(HeaderHop), h.Get(HeaderMatch), ts)
	})
}

// lookupMAC authenticates a lookup of response id at path with the mesh's
// hop key: method, path and id are bound, and the time as for hops.
func lookupMAC(key []byte, path, id, ts string) []byte {
	return hintMAC(key, http.MethodGet, path, id, "lookup", "", ts)
}

// SignLookup stamps a lookup of response id at path, a GET from one router
// to another.
func (s *Signer) SignLookup(h http.Header, path, id string) {
	s.Stamp(h, func(ts string) []byte { return lookupMAC(s.Key, path, id, ts) })
}

// VerifyLookup checks what SignLookup set.
func (s *Signer) VerifyLookup(h http.Header, path, id string) bool {
	return s.VerifyStamp(h, func(ts string) []byte { return lookupMAC(s.Key, path, id, ts) })
}
