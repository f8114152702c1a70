package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/internal/discover"
	"github.com/kvmesh/kvmesh/route"
	"github.com/prometheus/client_golang/prometheus"
)

// A replica's declaration may say its part of disaggregated requests
// after its URL (--replica, and the lines of --replica-file):
//
//	http://10.0.0.5:8000                 a whole replica, or as its engine says
//	http://10.0.0.5:8000#prefill         a prefill replica
//	http://10.0.0.5:30000#prefill:8998   with SGLang's KV bootstrap port
//	http://10.0.0.6:8000#decode          a decode replica
//	http://10.0.0.7:8000#both            a whole replica, whatever its engine says
//
// A URL's fragment never reaches a server, so the suffix cannot be part
// of a replica's address; the replica's ID is the URL without it. What
// a declaration says wins over what the engine says (SGLang's
// disaggregation_mode, read by the health checks). (Not a comma: the
// flag takes comma-separated lists.)

// replicaSpec is one replica declaration.
type replicaSpec struct {
	id string
	// declared: the declaration names a role (role, bootstrap); else the
	// engine's word stands.
	declared  bool
	role      route.Role
	bootstrap uint16
}

// parseReplicaSpec reads a declaration: an http(s) base URL, then
// optionally #ROLE, and :PORT after prefill.
func parseReplicaSpec(s string) (replicaSpec, error) {
	base, frag, hasFrag := strings.Cut(strings.TrimSpace(s), "#")
	id, err := discover.ParseReplicaURL(base)
	if err != nil {
		return replicaSpec{}, err
	}
	sp := replicaSpec{id: id}
	if !hasFrag {
		return sp, nil
	}
	role, port, hasPort := strings.Cut(frag, ":")
	if sp.role, err = route.ParseRole(role); err != nil {
		return replicaSpec{}, fmt.Errorf("replica %s: %w", id, err)
	}
	sp.declared = true
	if hasPort {
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil || p == 0 || sp.role != route.RolePrefill {
			return replicaSpec{}, fmt.Errorf("replica %s: %q is not prefill:PORT (a prefill replica's KV bootstrap port)", id, frag)
		}
		sp.bootstrap = uint16(p)
	}
	return sp, nil
}

// roleGauge is kvmesh_replica_role_info: the role each replica this
// router checks serves as, 1 on its one series.
type roleGauge struct {
	g     *prometheus.GaugeVec
	shown map[string]route.Role
}

func newRoleGauge(reg prometheus.Registerer) *roleGauge {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_replica_role_info",
		Help: "The role each replica this router checks serves as in disaggregated serving (both: whole requests and either leg; prefill; decode), as declared (--replica URL#ROLE) or as its engine says; 1 on the replica's one series.",
	}, []string{"replica", "role"})
	if reg != nil {
		reg.MustRegister(g)
	}
	return &roleGauge{g: g, shown: map[string]route.Role{}}
}

// show sets replica id's series to role (its earlier role's removed).
func (rg *roleGauge) show(id string, role route.Role) {
	if old, ok := rg.shown[id]; ok && old == role {
		return
	} else if ok {
		rg.g.DeleteLabelValues(id, old.String())
	}
	rg.g.WithLabelValues(id, role.String()).Set(1)
	rg.shown[id] = role
}

// drop removes replica id's series.
func (rg *roleGauge) drop(id string) {
	if old, ok := rg.shown[id]; ok {
		rg.g.DeleteLabelValues(id, old.String())
		delete(rg.shown, id)
	}
}
