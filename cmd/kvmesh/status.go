package main

import (
	"fmt"
	"net/http"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/status"
	"github.com/kvmesh/kvmesh/proxy/quota"
	"github.com/prometheus/client_golang/prometheus"
)

// withStatusPage serves the status page at GET / (exactly "/") on the
// handler that serves /metrics, and everything else as next does. It
// lives apart from startRouter so it can move to the admin listener.
func withStatusPage(next http.Handler, name string, m status.Mesh, g prometheus.Gatherer, budgets *quota.Ledger, log hclog.Logger) (http.Handler, error) {
	cfg := status.Config{Router: name, Mesh: m, Gatherer: g, Logger: log}
	if budgets != nil {
		cfg.Tenants = budgets.Status
	}
	page, err := status.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("router: status page: %w", err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" {
			page.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	}), nil
}
