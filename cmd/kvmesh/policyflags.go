package main

import (
	"errors"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/route"
)

// routeProfiles are the named sets of route.Policy tunables. "default" is
// route.DefaultPolicy, the values docs/DESIGN.md justifies over the whole
// simulation grid.
var routeProfiles = map[string]func() route.Policy{
	"default": route.DefaultPolicy,
}

// policyFlags binds every tunable of route.Policy to a flag set, so the
// router, the simulator and the benchmark configure the routing rule
// alike (and, through applyEnv, from KVMESH_<FLAG>). A profile gives the
// starting values; a flag given on the command line or in the environment
// overrides its field.
type policyFlags struct {
	profile string
	fields  []*policyField
}

// policyField is one tunable: a flag that remembers whether it was set.
type policyField struct {
	name, usage string
	// field is the route.Policy field it sets (route.PolicyError.Field).
	field string
	isInt bool
	val   float64
	set   bool
	get   func(route.Policy) float64
	put   func(*route.Policy, float64)
}

func (f *policyField) String() string {
	if f == nil {
		return ""
	}
	return strconv.FormatFloat(f.val, 'g', -1, 64)
}

// Set implements flag.Value.
func (f *policyField) Set(s string) error {
	v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return fmt.Errorf("not a number: %q", s)
	}
	if f.isInt && v != float64(int(v)) {
		return fmt.Errorf("not an integer: %q", s)
	}
	if v < 0 {
		return fmt.Errorf("negative: %q", s)
	}
	f.val, f.set = v, true
	return nil
}

// bindPolicyFlags defines --route-profile and one flag per route.Policy
// tunable on fs, with the default profile's values as defaults.
func bindPolicyFlags(fs *flag.FlagSet) *policyFlags {
	pf := &policyFlags{}
	names := make([]string, 0, len(routeProfiles))
	for n := range routeProfiles {
		names = append(names, n)
	}
	sort.Strings(names)
	fs.StringVar(&pf.profile, "route-profile", "default", "named set of routing tunables ("+strings.Join(names, ", ")+"); the flags below override single fields")
	def := route.DefaultPolicy()
	add := func(name, field string, isInt bool, usage string, get func(route.Policy) float64, put func(*route.Policy, float64)) {
		f := &policyField{name: name, field: field, usage: usage, isInt: isInt, val: get(def), get: get, put: put}
		pf.fields = append(pf.fields, f)
		fs.Var(f, name, "route: "+usage)
	}
	add("load-factor", "LoadFactor", false, "bounded-load factor on queued prefill for cold placement (consistent hashing with bounded loads)",
		func(p route.Policy) float64 { return p.LoadFactor }, func(p *route.Policy, v float64) { p.LoadFactor = v })
	add("inflight-factor", "InFlightFactor", false, "hot-spot guard: in-flight bound as a multiple of the mean (plus one per replica); replicas with a free slot are exempt",
		func(p route.Policy) float64 { return p.InFlightFactor }, func(p *route.Policy, v float64) { p.InFlightFactor = v })
	add("key-blocks", "KeyBlocks", true, "minimum depth in blocks of a cold request's placement key",
		func(p route.Policy) float64 { return float64(p.KeyBlocks) }, func(p *route.Policy, v float64) { p.KeyBlocks = int(v) })
	add("min-excess-blocks", "MinExcessBlocks", true, "blocks beyond the common prefix a match must hold to count",
		func(p route.Policy) float64 { return float64(p.MinExcessBlocks) }, func(p *route.Policy, v float64) { p.MinExcessBlocks = int(v) })
	add("default-block-ms", "DefaultBlockMs", false, "prefill time per block when the view has no measured one",
		func(p route.Policy) float64 { return p.DefaultBlockMs }, func(p *route.Policy, v float64) { p.DefaultBlockMs = v })
	add("recompute-weight", "RecomputeWeight", false, "score of a block the replica lacks, in units of its prefill time; a warm request moves only when the wait saved exceeds this times the prefill added",
		func(p route.Policy) float64 { return p.RecomputeWeight }, func(p *route.Policy, v float64) { p.RecomputeWeight = v })
	add("default-seq-ms", "DefaultSeqMs", false, "time a request holds a sequence slot before the router has measured it",
		func(p route.Policy) float64 { return p.DefaultSeqMs }, func(p *route.Policy, v float64) { p.DefaultSeqMs = v })
	add("warm-share", "WarmShare", false, "share of cold requests (by key) a warming replica takes while it can start them: one holding under half its tier's mean of cached blocks, new or emptied by a restart (0: no warm-up)",
		func(p route.Policy) float64 { return p.WarmShare }, func(p *route.Policy, v float64) { p.WarmShare = v })
	return pf
}

// Policy returns the profile with the flags that were set applied.
func (pf *policyFlags) Policy() (route.Policy, error) {
	mk, ok := routeProfiles[pf.profile]
	if !ok {
		return route.Policy{}, fmt.Errorf("unknown --route-profile %q", pf.profile)
	}
	p := mk()
	for _, f := range pf.fields {
		if f.set {
			f.put(&p, f.val)
		}
	}
	if err := p.Validate(); err != nil {
		// Name the flag the user sets rather than the Go field.
		var pe *route.PolicyError
		if errors.As(err, &pe) {
			for _, f := range pf.fields {
				if f.field == pe.Field {
					return p, fmt.Errorf("--%s %v, want %s", f.name, pe.Value, pe.Want)
				}
			}
		}
		return p, err
	}
	return p, nil
}

// args returns the route flags that were set, as command-line arguments,
// so a command that starts routers (demo) can pass them on.
func (pf *policyFlags) args() []string {
	out := []string{"--route-profile", pf.profile}
	for _, f := range pf.fields {
		if f.set {
			out = append(out, "--"+f.name, f.String())
		}
	}
	return out
}
