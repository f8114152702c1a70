//go:build unix

package main

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/summary"
)

// TestRouterReplicaFileSIGHUP: SIGHUP reloads the replica file even when
// its change left the modification time and size as they were.
func TestRouterReplicaFileSIGHUP(t *testing.T) {
	// The test's own subscription keeps a SIGHUP sent before the router
	// subscribes from ending the test process; after the test SIGHUP is
	// ignored, not left to its default action: the last one sent may
	// still be on its way when the test returns (a loaded machine ended
	// the whole test binary with "signal: hangup" once).
	hup := make(chan os.Signal, 16)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Ignore(syscall.SIGHUP)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fast := replicasim.Config{TimeScale: 1000, DefaultMaxTokens: 4}
	r1, r2 := startCountingSim(t, "r1", fast), startCountingSim(t, "r2", fast)
	defer r1.close()
	defer r2.close()
	if len(r1.srv.URL) != len(r2.srv.URL) {
		t.Skipf("URLs of different lengths: %s %s", r1.srv.URL, r2.srv.URL)
	}
	file := filepath.Join(t.TempDir(), "replicas")
	mod := time.Now().Add(-time.Hour)
	write := func(s string) {
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(file, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	write(r1.srv.URL + "\n")
	cfg := routerConfig{
		name: "a", region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: &lockedWriter{},
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(),
		sources: replicaSources{file: file, filePoll: 20 * time.Millisecond, hupSignals: true},
	}
	r, err := startRouter(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.shutdown(); err != nil {
			t.Error(err)
		}
	}()
	eventually(t, "r1 from the file", func() bool { return hasCandidate(r, simModel, r1.srv.URL) })
	write(r2.srv.URL + "\n") // same size, same modification time: polling cannot tell
	eventually(t, "r2 after SIGHUP", func() bool {
		_ = syscall.Kill(os.Getpid(), syscall.SIGHUP)
		return hasCandidate(r, simModel, r2.srv.URL) && !hasCandidate(r, simModel, r1.srv.URL)
	})
}
