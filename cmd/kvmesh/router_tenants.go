package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/prometheus/client_golang/prometheus"
)

// tenantConfig is the tenants' token budgets' flags (package quota).
type tenantConfig struct {
	input, output int64
	file          string
	window        time.Duration
	staleShare    bool
	// interval is how often the usage is gossiped (tests shorten it).
	interval time.Duration
	// wrapUsage, in tests, stands between the ledger and the mesh (a
	// partition of the usage gossip).
	wrapUsage func(mesh.Usage) mesh.Usage
}

// tenantFlags binds the budgets' flags: off unless a budget is given.
func tenantFlags(fs *flag.FlagSet, cfg *routerConfig) {
	t := &cfg.tenants
	fs.Int64Var(&t.input, "tenant-input-tokens", 0, "each tenant's budget of input (prompt) tokens per --tenant-window, across the whole mesh (0: no limit); over it, 429 rate_limit_exceeded with Retry-After. A tenant is the API key, else X-Kvmesh-Tenant, else the bearer key, else the client's address")
	fs.Int64Var(&t.output, "tenant-output-tokens", 0, "each tenant's budget of output (completion) tokens per --tenant-window, across the whole mesh (0: no limit); a request reserves its max_tokens until its usage is known")
	fs.StringVar(&t.file, "tenant-budgets", "", "file of per-tenant budgets overriding the defaults, one per line: NAME INPUT OUTPUT (tokens per window, - for no limit; NAME * sets the defaults); NAME is the tenant's API key, X-Kvmesh-Tenant value or address, and labels its metrics; reloaded on SIGHUP (a file that does not read keeps the budgets in force)")
	fs.DurationVar(&t.window, "tenant-window", quota.DefaultWindow, "the budgets' sliding window; every router of the mesh must use the same")
	fs.BoolVar(&t.staleShare, "tenant-stale-share", false, "count a router whose usage has not been heard for 3 s (but within the window) as using at least its share of each budget: a partition then overshoots no budget, at the price of that share held back for a window after a router stops for good")
}

func checkTenantFlags(cfg *routerConfig) error {
	if t := cfg.tenants; t.input < 0 || t.output < 0 || t.window < time.Second {
		return errors.New("router: --tenant-input-tokens and --tenant-output-tokens must not be negative, --tenant-window at least 1s")
	}
	return nil
}

// tenantLedger is the router's budgets (nil: none configured). With a
// budgets file it is there even when the file sets no budget yet, so
// that a reload (reloadBudgets) can set one.
func tenantLedger(cfg *routerConfig, reg prometheus.Registerer) (*quota.Ledger, error) {
	t := cfg.tenants
	def, tenants, _, err := readBudgets(t)
	if err != nil {
		return nil, err
	}
	qc := quota.Config{Window: t.window, Default: def, StaleShare: t.staleShare,
		Interval: t.interval, Registerer: reg, Tenants: tenants}
	if !qc.Enabled() && t.file == "" {
		return nil, nil
	}
	return quota.New(qc)
}

// readBudgets is the default budget (the flags', unless the budgets file
// has a * line) and the file's overrides, by the tenant hashes each name
// stands for, and how many names the file has.
func readBudgets(t tenantConfig) (quota.Limit, map[uint64]quota.Tenant, int, error) {
	def, tenants := quota.Limit{Input: t.input, Output: t.output}, map[uint64]quota.Tenant{}
	if t.file == "" {
		return def, tenants, 0, nil
	}
	f, err := os.Open(t.file)
	if err != nil {
		return def, nil, 0, fmt.Errorf("router: --tenant-budgets: %w", err)
	}
	fileDef, names, err := quota.ParseFile(f)
	f.Close()
	if err != nil {
		return def, nil, 0, fmt.Errorf("router: --tenant-budgets %s: %w", t.file, err)
	}
	if fileDef != nil {
		def = *fileDef
	}
	for name, l := range names {
		for _, k := range proxy.TenantKeys(name) {
			tenants[k] = quota.Tenant{Name: name, Limit: l}
		}
	}
	return def, tenants, len(names), nil
}

// reloadBudgets reads the budgets file again into l (SIGHUP); a file
// that does not read keeps the budgets l has. It returns how many
// tenants the file names.
func reloadBudgets(t tenantConfig, l *quota.Ledger) (int, error) {
	def, tenants, n, err := readBudgets(t)
	if err == nil {
		err = l.SetBudgets(def, tenants)
	}
	return n, err
}

// meshUsage is what the mesh gossips of the ledger (nil: nothing).
func meshUsage(cfg *routerConfig, l *quota.Ledger) mesh.Usage {
	if l == nil {
		return nil
	}
	var u mesh.Usage = l
	if cfg.tenants.wrapUsage != nil {
		u = cfg.tenants.wrapUsage(u)
	}
	return u
}
