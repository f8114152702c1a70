package main

import (
	"errors"
	"flag"

	"github.com/kvmesh/kvmesh/proxy/admit"
)

// admitFlags binds the admission's flags (package admit): on by default,
// and a pass-through until the engines' own signals say a model's
// replicas are saturated.
func admitFlags(fs *flag.FlagSet, cfg *routerConfig) {
	fs.IntVar(&cfg.admission.MaxWaiting, "admit-max-waiting", admit.DefaultMaxWaiting, "requests a replica may queue beyond its slots (vLLM max_num_seqs) before it counts as saturated; while every replica of a model is, its requests wait in the router's queue by priority and tenant (0: admission off, every request goes to the engines at once)")
	fs.Float64Var(&cfg.admission.MaxKVUsage, "admit-max-kv-usage", 0, "KV cache share (0 to 1, from vLLM's kv_cache_usage_perc or SGLang's token_usage) at which a replica counts as saturated whatever its slots (0: KV usage not read; the reading is a scrape old, so a full one holds a queue back until the next --engine-load-interval)")
	fs.IntVar(&cfg.admission.MaxQueue, "admit-queue", admit.DefaultMaxQueue, "most requests waiting in the router's queue per model; when full, a lower class or the tenant over its share is shed (429/503 with Retry-After)")
	fs.DurationVar(&cfg.admission.Timeout, "admit-queue-timeout", admit.DefaultTimeout, "longest a request waits in the router's queue before it is shed with 503 and Retry-After (a client may ask for less with "+admit.HeaderQueueTimeout+")")
}

func checkAdmitFlags(cfg *routerConfig) error {
	if a := cfg.admission; a.MaxWaiting < 0 || a.MaxQueue < 1 || a.Timeout <= 0 || !(a.MaxKVUsage >= 0 && a.MaxKVUsage <= 1) {
		return errors.New("router: --admit-max-waiting must be ≥ 0, --admit-queue ≥ 1, --admit-queue-timeout positive and --admit-max-kv-usage from 0 to 1")
	}
	return nil
}

// admissionConfig is the proxy's admission config (nil: off).
func (cfg *routerConfig) admissionConfig() *admit.Config {
	if cfg.admission.MaxWaiting == 0 {
		return nil
	}
	c := cfg.admission
	return &c
}
