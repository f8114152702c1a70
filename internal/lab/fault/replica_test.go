//go:build fault

package fault

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
)

// headerRequestID carries the load generator's request id through the
// routers (they forward client headers) to the replica, which logs it.
const headerRequestID = "X-Request-Id"

// replicaMain runs one simulated replica, the same engine as `kvmesh
// replica-sim`, behind a recorder that appends the id of every generation
// request it accepted (body read in full) to KVF_IDS, one line each. The
// file outlives a kill -9, so the suite counts generations per request id
// across all replicas and restarts: an id twice is a duplicate generation.
func replicaMain() int {
	listen, idsPath := os.Getenv("KVF_LISTEN"), os.Getenv("KVF_IDS")
	log := hclog.New(&hclog.LoggerOptions{Name: "replica", Level: hclog.Info, Output: os.Stderr})
	sim, err := replicasim.New(replicasim.Config{
		Model: "kvmesh-sim", DecodeMsPerToken: 10, DefaultMaxTokens: 8, KVBlocks: 4096,
	}, log, nil)
	if err != nil {
		log.Error("replica", "error", err)
		return 1
	}
	f, err := os.OpenFile(idsPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		log.Error("ids file", "error", err)
		return 1
	}
	var mu sync.Mutex
	inner := sim.Handler()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(headerRequestID)
		if r.Method == http.MethodPost && id != "" {
			body, err := io.ReadAll(io.LimitReader(r.Body, 8<<20))
			if err != nil {
				http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
				return
			}
			mu.Lock()
			_, _ = f.WriteString(id + "\n")
			mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		inner.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		log.Error("listen", "error", err)
		return 1
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = sim.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	fmt.Fprintln(os.Stderr, "replica listening on", ln.Addr())
	if err := srv.Serve(ln); err != nil && err != http.ErrServerClosed {
		log.Error("serve", "error", err)
		return 1
	}
	return 0
}
