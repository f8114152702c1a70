package mesh

import (
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"
	"github.com/kvmesh/kvmesh/summary"
	"github.com/prometheus/client_golang/prometheus"
)

// Timing holds the intervals of membership and gossip.
type Timing struct {
	// GossipInterval is memberlist's gossip tick (user broadcasts ride it).
	GossipInterval time.Duration
	// PushPullInterval is the full-state anti-entropy period.
	PushPullInterval time.Duration
	// ProbeInterval and ProbeTimeout drive failure detection.
	ProbeInterval, ProbeTimeout time.Duration
	// StateInterval is how often an owner gossips each replica's state and
	// summary delta.
	StateInterval time.Duration
	// LoadInterval is how often at most an owner sends its peers a load
	// beacon (beacon.go): the in-flight and pending prefill counts of the
	// owned replicas whose load changed since the last one, over UDP, best
	// effort, sent when a load changes (an idle owner sends none and does
	// no work for them). Between two states a peer's routers would otherwise decide
	// on the load as of the owner's last state, and herd onto the replica
	// that looked least loaded. 0 sends none (the load then travels with
	// the states only).
	LoadInterval time.Duration
	// StaleAfter is how long a copy counts for routing after its owner's
	// last state or delta.
	StaleAfter time.Duration
	// SuspicionMult scales memberlist's suspicion timeout.
	SuspicionMult int
	// TCPTimeout bounds push/pull and reliable sends.
	TCPTimeout time.Duration
	// ReconnectInterval is how often a router re-joins failed peers and
	// the seeds not all in the mesh; 0 means 30 probe intervals.
	ReconnectInterval time.Duration
	// FailedPeerTimeout is how long a failed peer is remembered and
	// re-joined; 0 means 30 minutes. Seeds are re-joined regardless.
	FailedPeerTimeout time.Duration
	// DeclarationTTL is how long a peer's declaration of a replica lives
	// after the last state its router sent about it; 0 means six
	// declaration periods (declEveryTicks state intervals).
	DeclarationTTL time.Duration
}

// LANTiming returns memberlist's LAN defaults with kvmesh's state period.
func LANTiming() Timing {
	c := memberlist.DefaultLANConfig()
	return Timing{
		GossipInterval: c.GossipInterval, PushPullInterval: c.PushPullInterval,
		ProbeInterval: c.ProbeInterval, ProbeTimeout: c.ProbeTimeout,
		StateInterval: 200 * time.Millisecond, LoadInterval: 25 * time.Millisecond, StaleAfter: 10 * time.Second,
		SuspicionMult: c.SuspicionMult, TCPTimeout: c.TCPTimeout,
		ReconnectInterval: 10 * time.Second, FailedPeerTimeout: defaultFailedPeerTimeout,
	}
}

// TestTiming returns fast timings for in-process tests (serf's test
// config, relaxed a little for the race detector on small machines).
func TestTiming() Timing {
	return Timing{
		GossipInterval: 20 * time.Millisecond, PushPullInterval: time.Second,
		ProbeInterval: 100 * time.Millisecond, ProbeTimeout: 50 * time.Millisecond,
		StateInterval: 50 * time.Millisecond, LoadInterval: 10 * time.Millisecond, StaleAfter: time.Second,
		SuspicionMult: 3, TCPTimeout: time.Second,
		ReconnectInterval: 300 * time.Millisecond, FailedPeerTimeout: defaultFailedPeerTimeout,
	}
}

// Config configures one router's membership in the mesh.
type Config struct {
	// Name is the router's unique name in the mesh.
	Name string
	// Region groups routers by network distance (tier 0 = same region).
	Region string
	// APIAddr is this router's advertised HTTP base URL, where peers
	// forward requests for its replicas.
	APIAddr string
	// BindAddr is the gossip "host:port" (port 0 picks one).
	BindAddr string
	// AdvertiseAddr is an optional "host:port" peers should use.
	AdvertiseAddr string
	// Join lists seeds: "host:port" or a DNS name resolving to routers.
	Join []string
	// SecretKey, when set (16, 24 or 32 bytes), encrypts and
	// authenticates gossip.
	SecretKey []byte
	// Contract is the hashing contract; peers with another are refused.
	Contract summary.Contract
	// DefaultCapacityBlocks sizes summaries of replicas whose engine did
	// not report a capacity.
	DefaultCapacityBlocks int
	// FalsePositiveRate of owned summaries; 0 means the summary default.
	FalsePositiveRate float64
	// Timing of membership and gossip; zero means LANTiming.
	Timing Timing
	// Transport, when set, replaces memberlist's network transport.
	Transport memberlist.NodeAwareTransport
	// Streams bounds inbound gossip streams (transport.go); zero fields
	// take the defaults. Unused with Transport.
	Streams StreamLimits
	// Logger receives the mesh's and memberlist's logs; nil discards.
	Logger hclog.Logger
	// Registerer receives the mesh's metrics; nil registers nowhere.
	Registerer prometheus.Registerer
	// Usage, when set, is the tenants' token usage the mesh carries
	// (usage.go): this router's, sent to every peer that reads it each
	// UsageInterval, and the peers', merged as they arrive.
	Usage Usage
	// UsageInterval is how often Usage is gossiped (default
	// DefaultUsageInterval).
	UsageInterval time.Duration

	// wire, when set (tests), is the wire version this router advertises,
	// decodes and encodes at most, as a router of that version would: a
	// router before a wire addition, in one process with newer ones.
	wire *wireVersion
	// beaconPause, when set (tests), replaces the beacon loop's wait for
	// the rest of a LoadInterval (pauseTimer.pause): a test holds the
	// loop there while a load changes.
	beaconPause func(time.Duration) bool
}

func (c *Config) validate() error {
	if c.Name == "" || len(c.Name) > maxNameLen {
		return fmt.Errorf("mesh: router name %q must be 1..%d bytes", c.Name, maxNameLen)
	}
	if len(c.Region) > 64 || len(c.APIAddr) > 256 {
		return errors.New("mesh: region (64) or API address (256) too long")
	}
	if err := c.Contract.Validate(); err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	if c.SecretKey != nil {
		if err := memberlist.ValidateKey(c.SecretKey); err != nil {
			return fmt.Errorf("mesh: secret key: %w", err)
		}
	}
	if c.Timing == (Timing{}) {
		c.Timing = LANTiming()
	}
	t := &c.Timing
	if t.StateInterval <= 0 || t.StaleAfter <= 0 || t.GossipInterval <= 0 || t.ProbeInterval <= 0 ||
		t.ProbeTimeout <= 0 || t.PushPullInterval <= 0 || t.TCPTimeout <= 0 || t.SuspicionMult <= 0 {
		return fmt.Errorf("mesh: timing %+v has a non-positive field", *t)
	}
	if t.LoadInterval < 0 || (t.LoadInterval > 0 && t.LoadInterval < minLoadInterval) {
		return fmt.Errorf("mesh: load interval %v: want 0 (no load beacons) or at least %v", t.LoadInterval, minLoadInterval)
	}
	if t.ReconnectInterval <= 0 {
		t.ReconnectInterval = 30 * t.ProbeInterval
	}
	if t.FailedPeerTimeout <= 0 {
		t.FailedPeerTimeout = defaultFailedPeerTimeout
	}
	if t.DeclarationTTL <= 0 {
		t.DeclarationTTL = 6 * declEveryTicks * t.StateInterval
	}
	if c.DefaultCapacityBlocks == 0 {
		c.DefaultCapacityBlocks = 16384
	}
	if c.FalsePositiveRate == 0 {
		c.FalsePositiveRate = summary.DefaultFalsePositiveRate
	}
	if err := (summary.Params{CapacityBlocks: c.DefaultCapacityBlocks, FalsePositiveRate: c.FalsePositiveRate}).Validate(); err != nil {
		return fmt.Errorf("mesh: default summary: %w", err)
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.UsageInterval <= 0 {
		c.UsageInterval = DefaultUsageInterval
	}
	return nil
}
