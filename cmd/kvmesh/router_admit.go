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
	fs.IntVar(&cfg.admission.MaxQueue, "admit-queue", admit.DefaultMaxQueue, "most requests waiting in the router's queue per model; when full, a lower class or the tenant over its share is shed (429/503 with Retry-After)")
	fs.DurationVar(&cfg.admission.Timeout, "admit-queue-timeout", admit.DefaultTimeout, "longest a request waits in the router's queue before it is shed with 503 and Retry-After (a client may ask for less with "+admit.HeaderQueueTimeout+")")
}

func checkAdmitFlags(cfg *routerConfig) error {
	if cfg.admission.MaxWaiting < 0 || cfg.admission.MaxQueue < 1 || cfg.admission.Timeout <= 0 {
		return errors.New("router: --admit-max-waiting must be ≥ 0, --admit-queue ≥ 1 and --admit-queue-timeout positive")
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
