package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/discover"
	"github.com/kvmesh/kvmesh/internal/engine"
	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy/health"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
)

// replicaSources is where a router learns its replicas beyond the static
// --replica list, and how it reads their engines.
type replicaSources struct {
	engine       engine.Kind
	dns          string        // HOST:PORT or _service._proto.name
	dnsServer    string        // HOST:PORT of the DNS server ("": the system's)
	dnsScheme    string        // scheme of discovered replicas
	dnsInterval  time.Duration // re-resolve period
	file         string        // one URL per line
	filePoll     time.Duration // how often the file's mtime is checked
	hupSignals   bool          // reload the file on SIGHUP
	loadInterval time.Duration // engine load scrape period (0: the checker's default)
}

// replicaFlags registers the discovery and engine flags on fs; the
// returned function validates them after parsing.
func replicaFlags(fs *flag.FlagSet, src *replicaSources) func() error {
	eng := fs.String("engine", "auto", "engine behind the replicas, read through its own endpoints and metric names: auto (detected per replica from /metrics), vllm, sglang, llamacpp, tgi or openai (none of these)")
	fs.StringVar(&src.dns, "replica-dns", "", "discover replicas in DNS: HOST:PORT (one replica per A/AAAA record of HOST, e.g. a Kubernetes headless Service) or _service._proto.name (SRV records)")
	fs.StringVar(&src.dnsServer, "replica-dns-server", "", "HOST:PORT of the DNS server for --replica-dns (default: the system's resolver)")
	fs.StringVar(&src.dnsScheme, "replica-dns-scheme", "http", "scheme of replicas found in DNS: http or https")
	fs.DurationVar(&src.dnsInterval, "replica-dns-interval", 5*time.Second, "how often --replica-dns is resolved again")
	fs.DurationVar(&src.loadInterval, "engine-load-interval", time.Second, "how often each healthy replica's /metrics is read for its running and waiting requests")
	fs.StringVar(&src.file, "replica-file", "", "file listing replica base URLs, one per line (# comments); reloaded when it changes and on SIGHUP")
	return func() error {
		k, err := engine.ParseKind(*eng)
		if err != nil {
			return fmt.Errorf("router: --engine: %w", err)
		}
		src.engine = k
		if src.dnsInterval <= 0 {
			return errors.New("router: --replica-dns-interval must be positive")
		}
		if src.loadInterval <= 0 {
			return errors.New("router: --engine-load-interval must be positive")
		}
		if src.dns != "" {
			if _, err := discover.NewDNS(src.dns, src.dnsScheme, nil); err != nil {
				return fmt.Errorf("router: --replica-dns: %w", err)
			}
		}
		if src.filePoll <= 0 {
			src.filePoll = time.Second
		}
		src.hupSignals = true
		return nil
	}
}

// replicaSet joins the replica sources (static, DNS, file) into the set
// the health checker checks, and keeps the mesh in step with the
// checker: a replica is declared once it passes a check and withdrawn
// when no source lists it any more. Withdrawal only stops new requests;
// the proxy does not cut streams already running on the replica.
type replicaSet struct {
	log    hclog.Logger
	mesh   *mesh.Mesh
	health *health.Checker

	// onDeclare and onWithdraw, when set, hear of each replica declared
	// and withdrawn (KV-event subscriptions follow them); called under
	// mu, they must not block.
	onDeclare, onWithdraw func(id string)

	updateMu sync.Mutex // serialises update; never held by onStatus

	mu       sync.Mutex
	sources  map[string][]string           // IDs by source name
	specs    map[string]replicaSpec        // the latest declaration of each ID (router_roles.go)
	declared map[string]mesh.ReplicaStatus // last status given to the mesh
	roles    *roleGauge
	// splits: the router splits requests (--pd-protocol); without it a
	// prefill or decode replica serves nothing, which is logged.
	splits bool
}

func newReplicaSet(m *mesh.Mesh, log hclog.Logger, reg prometheus.Registerer, splits bool) *replicaSet {
	return &replicaSet{log: log, mesh: m, sources: map[string][]string{}, specs: map[string]replicaSpec{},
		declared: map[string]mesh.ReplicaStatus{}, roles: newRoleGauge(reg), splits: splits}
}

// onStatus is the health checker's callback: it declares a replica at
// its first report (the checker reports only admitted replicas) and
// passes every status on to the mesh.
func (s *replicaSet) onStatus(id string, st health.ReplicaStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp, ok := s.specs[id]; ok && sp.declared {
		// The declaration's role wins over the engine's; a prefill
		// replica's port, when it gives one.
		st.Role = sp.role
		if sp.bootstrap != 0 || sp.role != route.RolePrefill {
			st.Bootstrap = sp.bootstrap
		}
	}
	last, ok := s.declared[id]
	if !ok {
		if !st.Healthy {
			return
		}
		s.mesh.DeclareReplica(id)
		s.log.Info("replica declared", "replica", id, "engine", st.Engine, "role", st.Role)
		if s.onDeclare != nil {
			s.onDeclare(id)
		}
	}
	if (!ok || last.Role != st.Role) && st.Role != route.RoleBoth && !s.splits {
		s.log.Warn("a prefill or decode replica serves nothing while requests are not split (--pd-protocol off)", "replica", id, "role", st.Role)
	}
	s.roles.show(id, st.Role)
	s.declared[id] = st
	s.mesh.UpdateReplica(id, st)
}

// update replaces source's list of declarations (URLs, each with its
// role if it says one: router_roles.go), hands the union of all sources'
// replicas to the health checker and withdraws the replicas no source
// lists any more.
func (s *replicaSet) update(source string, entries []string) {
	s.updateMu.Lock()
	defer s.updateMu.Unlock()
	ids := make([]string, 0, len(entries))
	s.mu.Lock()
	for _, e := range entries {
		sp, err := parseReplicaSpec(e)
		if err != nil {
			s.log.Warn("skipping a replica declaration", "source", source, "error", err)
			continue
		}
		if old, ok := s.specs[sp.id]; ok && old != sp {
			s.log.Info("replica declared anew", "replica", sp.id, "role", sp.role, "declared_role", sp.declared)
		}
		s.specs[sp.id] = sp
		ids = append(ids, sp.id)
	}
	s.sources[source] = ids
	union := map[string]bool{}
	for _, l := range s.sources {
		for _, id := range l {
			union[id] = true
		}
	}
	s.mu.Unlock()
	all := slices.Sorted(maps.Keys(union))
	// After SetReplicas returns the checker reports nothing more on the
	// replicas it dropped, so they cannot be declared again below.
	s.health.SetReplicas(all)
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, last := range s.declared {
		if union[id] {
			continue
		}
		// Drain, then withdraw: as owner this router gossips the replica
		// unhealthy at once, so peers stop sending it new requests even
		// if another router still declares it (and takes it over);
		// streams already running on it are not touched.
		last.Healthy = false
		s.mesh.UpdateReplica(id, last)
		s.mesh.WithdrawReplica(id)
		delete(s.declared, id)
		delete(s.specs, id)
		s.roles.drop(id)
		s.log.Info("replica drained and withdrawn", "replica", id)
		if s.onWithdraw != nil {
			s.onWithdraw(id)
		}
	}
}

// runDiscovery watches the DNS and file sources until ctx is done.
func runDiscovery(ctx context.Context, src replicaSources, set *replicaSet, log hclog.Logger, rec *panics.Recorder) {
	var wg sync.WaitGroup
	if src.dns != "" {
		scheme := src.dnsScheme
		if scheme == "" {
			scheme = "http"
		}
		d, err := discover.NewDNS(src.dns, scheme, discover.NewResolver(src.dnsServer))
		if err != nil { // validated with the flags
			log.Error("replica DNS", "error", err)
		} else {
			wg.Go(func() {
				discover.Watch(ctx, d, src.dnsInterval, nil, func(ids []string) { set.update("dns", ids) }, log, rec)
			})
		}
	}
	if src.file != "" {
		poke := make(chan struct{}, 1)
		if src.hupSignals {
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			wg.Go(func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-hup:
						log.Info("SIGHUP: reloading the replica file", "file", src.file)
						select {
						case poke <- struct{}{}:
						default:
						}
					}
				}
			})
		}
		f := discover.NewFile(src.file, log)
		wg.Go(func() {
			discover.Watch(ctx, f, src.filePoll, poke, func(ids []string) { set.update("file", ids) }, log, rec)
		})
	}
	wg.Wait()
}
