package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/ratelog"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/upstream"
)

// edgeFlags binds the flags that bound what strangers can make the
// router hold, and its TLS, authentication and admin split.
func edgeFlags(fs *flag.FlagSet, cfg *routerConfig) {
	fs.StringVar(&cfg.adminListen, "admin-listen", "127.0.0.1:9090", `HOST:PORT serving /metrics, /debug/mesh, /healthz and /readyz, apart from the API ("" disables)`)
	fs.StringVar(&cfg.tlsCert, "tls-cert", "", "PEM certificate of the API (with --tls-key: serve HTTPS; reloaded on SIGHUP)")
	fs.StringVar(&cfg.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&cfg.peerTLSCA, "peer-tls-ca", "", "PEM CA that signs the routers' API certificates: forwarding then uses TLS only (never plain HTTP), and a client certificate it signed authenticates a peer")
	fs.StringVar(&cfg.peerCert, "peer-tls-cert", "", "PEM client certificate presented to peers when forwarding (mutual TLS)")
	fs.StringVar(&cfg.peerKey, "peer-tls-key", "", "PEM private key of --peer-tls-cert")
	fs.StringVar(&cfg.apiKeyFile, "api-key-file", "", "file of client bearer keys, one per line (# comments): /v1 then needs 'Authorization: Bearer KEY' (401 otherwise); reloaded on SIGHUP")
	fs.IntVar(&cfg.maxConns, "max-conns", proxy.DefaultMaxConns, "most open API connections; more are answered 503 with Retry-After and closed (0: no cap)")
	fs.IntVar(&cfg.maxInflightPerClient, "max-inflight-per-client", proxy.DefaultMaxInflightPerClient, "most concurrent inference requests from one client IP; more get 429 with Retry-After (0: no cap; use 0 behind an L7 load balancer)")
	fs.DurationVar(&cfg.headerTimeout, "header-timeout", 10*time.Second, "time a client has to send a request's headers")
	fs.DurationVar(&cfg.bodyTimeout, "body-timeout", proxy.DefaultBodyTimeout, "time a client has to send a request's body (then 408 and the connection is closed)")
	fs.IntVar(&cfg.clientSendBuffer, "client-send-buffer", proxy.DefaultClientSendBuffer, "send buffer (SO_SNDBUF) of each API connection in bytes: bounds the kernel memory a client that reads nothing pins until --write-timeout (0: the kernel's default, autotuned up to tcp_wmem's maximum, 4 MB on Linux)")
	fs.IntVar(&cfg.upstreamRecvBuffer, "upstream-recv-buffer", upstream.DefaultUpstreamRecvBuffer, "receive buffer (SO_RCVBUF) of each connection to a replica or a peer router in bytes, set before connect: bounds the kernel memory a stream stalled by its client pins on the router's side of the replica's connection until --write-timeout, and caps that connection at a buffer per round trip (256 KiB at 100 ms: 2.5 MB/s) (0: the kernel's default, autotuned up to tcp_rmem's maximum, 6 MB on Linux)")
	fs.DurationVar(&cfg.writeTimeout, "write-timeout", proxy.DefaultWriteTimeout, "time a client may take no byte of its response (a stalled stream reader); its request is then ended (499) and its connection closed, which cancels the generation")
	fs.DurationVar(&cfg.stallWindow, "stall-window", proxy.DefaultStallWindow, "time an owned replica with requests in flight may show no progress (no response byte, no request ending, its engine's progress counters still: tokens generated, prompt tokens prefilled, forward passes) beyond twice the prefill the router expects of the requests waiting for their first byte (their uncached blocks at the replica's prefill rate, learned from its earlier first bytes), before it is ejected as stalled and those requests ended: retried on another replica when nothing reached the client yet, else ended with an error event; re-admitted once its engine progresses again (0: no stall detection)")
	fs.DurationVar(&cfg.upstreamIdleTimeout, "upstream-idle-timeout", proxy.DefaultUpstreamIdleTimeout, "time an upstream (a replica, or a peer router on a hop) may send no byte of a response body once its first byte arrived (before it, the 10-minute response header timeout); the response is then ended (an SSE stream with an error event, another body by aborting the client's connection) and the upstream connection closed (0: none)")
	fs.DurationVar(&cfg.idleTimeout, "idle-timeout", 2*time.Minute, "time an idle keep-alive connection is kept")
	fs.DurationVar(&cfg.retryBudget, "retry-budget", proxy.DefaultRetryBudget, "time from a request's first upstream attempt within which another may start (only requests that never reached a replica are retried)")
	fs.IntVar(&cfg.maxAttempts, "max-attempts", 3, "most upstream attempts per request")
	fs.BoolVar(&cfg.noStreamLoop, "no-stream-loop", false, "relay every stream on its request's goroutine: turns off the Linux stream loop, which relays SSE streams from owned replicas to plain HTTP/1.1 clients by their sockets (epoll)")
	fs.DurationVar(&cfg.drainTimeout, "drain-timeout", defaultDrainTimeout, "on SIGTERM, time the whole shutdown takes at most, counted from the signal: the router leaves the mesh (at most a quarter of it, and 2s), stops accepting, lets in-flight requests (streams included) finish, then exits 0")
	fs.Int64Var(&cfg.gcHeadroom, "gc-headroom", defaultGCHeadroom, "bytes the heap may grow beyond Go's default GOGC=100 goal so that the garbage collector runs less often: the GC percent is up to 400 while the live heap is small and falls towards 100 as it grows (0: off; a GOGC in the environment turns it off too; GOMEMLIMIT still applies)")
	fs.IntVar(&cfg.gossipStreams.MaxStreams, "gossip-max-streams", mesh.DefaultMaxStreams, "most inbound gossip TCP streams read at once; more are closed unread")
	fs.Int64Var(&cfg.gossipStreams.BudgetBytes, "gossip-stream-budget", mesh.DefaultStreamBytes, "bytes inbound gossip streams may make the router buffer at once, before they are authenticated")
}

func checkEdgeFlags(cfg *routerConfig) error {
	if (cfg.tlsCert == "") != (cfg.tlsKey == "") {
		return errors.New("router: --tls-cert and --tls-key go together")
	}
	if (cfg.peerCert == "") != (cfg.peerKey == "") {
		return errors.New("router: --peer-tls-cert and --peer-tls-key go together")
	}
	if cfg.maxConns < 0 || cfg.maxInflightPerClient < 0 || cfg.maxAttempts < 1 {
		return errors.New("router: --max-conns and --max-inflight-per-client must be ≥ 0, --max-attempts ≥ 1")
	}
	if cfg.clientSendBuffer != 0 && (cfg.clientSendBuffer < minClientSendBuffer || cfg.clientSendBuffer > maxClientSendBuffer) {
		return fmt.Errorf("router: --client-send-buffer %d must be 0 (the kernel's) or %d to %d bytes", cfg.clientSendBuffer, minClientSendBuffer, maxClientSendBuffer)
	}
	if cfg.upstreamRecvBuffer != 0 && (cfg.upstreamRecvBuffer < minClientSendBuffer || cfg.upstreamRecvBuffer > maxClientSendBuffer) {
		return fmt.Errorf("router: --upstream-recv-buffer %d must be 0 (the kernel's) or %d to %d bytes", cfg.upstreamRecvBuffer, minClientSendBuffer, maxClientSendBuffer)
	}
	for name, d := range map[string]time.Duration{"header-timeout": cfg.headerTimeout, "body-timeout": cfg.bodyTimeout,
		"idle-timeout": cfg.idleTimeout, "retry-budget": cfg.retryBudget, "drain-timeout": cfg.drainTimeout, "write-timeout": cfg.writeTimeout} {
		if d <= 0 {
			return fmt.Errorf("router: --%s must be positive", name)
		}
	}
	if cfg.stallWindow < 0 {
		return errors.New("router: --stall-window must be ≥ 0 (0: no stall detection)")
	}
	if cfg.upstreamIdleTimeout < 0 {
		return errors.New("router: --upstream-idle-timeout must be ≥ 0 (0: none)")
	}
	if cfg.gossipStreams.MaxStreams < 1 || cfg.gossipStreams.BudgetBytes < 1<<20 {
		return errors.New("router: --gossip-max-streams must be ≥ 1 and --gossip-stream-budget ≥ 1 MiB")
	}
	return nil
}

// Bounds of --client-send-buffer and --upstream-recv-buffer: below 16 KB
// a stream's every event waits on the other side's acknowledgements (or
// window updates); over 64 MB is no bound.
const (
	minClientSendBuffer = 16 << 10
	maxClientSendBuffer = 64 << 20
)

// routerEdges is what the edge flags load: certificates, keys, CA.
type routerEdges struct {
	serverTLS    *tls.Config // nil: plain HTTP
	cert         *certFile
	peerCA       *x509.CertPool
	peerTLS      *tls.Config
	peerCert     *certFile
	keys         *proxy.KeySet
	drainTimeout time.Duration
	junk         *ratelog.Limiter
}

func loadEdges(cfg routerConfig, log hclog.Logger) (routerEdges, error) {
	e := routerEdges{drainTimeout: cfg.drainTimeout, junk: ratelog.New(10, time.Second)}
	if e.drainTimeout <= 0 {
		e.drainTimeout = defaultDrainTimeout
	}
	var err error
	if cfg.peerTLSCA != "" {
		if e.peerCA, err = readCAPool(cfg.peerTLSCA); err != nil {
			return e, err
		}
	}
	if cfg.tlsCert != "" {
		if e.cert, err = loadCertFile(cfg.tlsCert, cfg.tlsKey); err != nil {
			return e, err
		}
		e.serverTLS = serverTLS(e.cert, e.peerCA)
	}
	if cfg.peerCert != "" {
		if e.peerCert, err = loadCertFile(cfg.peerCert, cfg.peerKey); err != nil {
			return e, err
		}
	}
	if e.peerCA != nil || e.peerCert != nil {
		if e.peerTLS, err = peerTLS(e.peerCA, cfg.peerTLSCA, e.peerCert); err != nil {
			return e, err
		}
	}
	if cfg.apiKeyFile != "" {
		if e.keys, err = proxy.LoadKeySet(cfg.apiKeyFile); err != nil {
			return e, fmt.Errorf("router: %w", err)
		}
		log.Info("client API keys loaded", "keys", e.keys.Len())
	}
	return e, nil
}

// edgeListener caps the API's connections, bounds their send buffers
// and adds TLS.
func (r *router) edgeListener(ln net.Listener, maxConns, sendBuf int) net.Listener {
	lim := proxy.LimitConns(ln, maxConns, r.edges.serverTLS, func(remote string) {
		r.proxy.ConnRefused()
		if ok, n := r.edges.junk.Allow(); ok {
			r.log.Warn("connection limit reached; refusing connections", "remote", remote, "suppressed_since_last", n)
		}
	})
	lim.SetSendBuffer(sendBuf)
	if r.edges.serverTLS != nil {
		return tls.NewListener(lim, r.edges.serverTLS)
	}
	return lim
}

// apiServer is the API's http.Server. It has no ReadTimeout or
// WriteTimeout: a generation streams for minutes, and net/http cancels a
// request whose connection hits a read deadline while it is being served.
// The proxy bounds each body read instead (--body-timeout), and each
// write of a response (--write-timeout).
func (r *router) apiServer(cfg routerConfig, h http.Handler) *http.Server {
	header, idle := cfg.headerTimeout, cfg.idleTimeout
	if header <= 0 {
		header = 10 * time.Second
	}
	if idle <= 0 {
		idle = 2 * time.Minute
	}
	w := ratelog.Writer{W: r.log.Named("http").StandardWriter(&hclog.StandardLoggerOptions{InferLevels: true}), L: ratelog.New(10, time.Second)}
	r.quiet = newQuiescer(r.draining.Load)
	return &http.Server{
		Handler:           r.quiet.handler(h),
		ConnState:         r.quiet.connState,
		ConnContext:       proxy.ConnContext, // the stream loop writes to the client's connection
		ReadHeaderTimeout: header,
		IdleTimeout:       idle,
		MaxHeaderBytes:    1 << 20,
		TLSConfig:         r.edges.serverTLS,
		ErrorLog:          log.New(w, "", 0), // TLS handshake junk and the like, throttled
	}
}

// serve runs srv on ln; a failure other than shutdown is reported on
// serveErr, which stops the router.
func (r *router) serve(what string, srv *http.Server, ln net.Listener) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			r.serveErr <- fmt.Errorf("router: %s listener on %s failed: %w", what, ln.Addr(), err)
		}
	}()
}

// run waits for the end: ctx cancelled (SIGTERM) or a listener failing,
// and reloads keys and certificates on hup.
func (r *router) run(ctx context.Context, hup <-chan os.Signal) error {
	for {
		select {
		case <-ctx.Done():
			return r.shutdown()
		case err := <-r.serveErr:
			r.log.Error("stopping the router", "error", err)
			return errors.Join(err, r.shutdown())
		case <-hup:
			r.reload()
		}
	}
}

// reload re-reads the API keys, certificates and tenant budgets; what
// fails to load keeps its previous value.
func (r *router) reload() {
	if r.tenants.file != "" && r.budgets != nil {
		if n, err := reloadBudgets(r.tenants, r.budgets); err != nil {
			r.log.Error("reload failed; keeping the previous tenant budgets", "file", r.tenants.file, "error", err)
		} else {
			r.log.Info("reloaded the tenant budgets", "file", r.tenants.file, "tenants", n)
		}
	}
	for what, f := range map[string]func() error{
		"api keys":        func() error { return reloadIf(r.edges.keys != nil, func() error { return r.edges.keys.Reload() }) },
		"API certificate": func() error { return reloadIf(r.edges.cert != nil, func() error { return r.edges.cert.reload() }) },
		"peer certificate": func() error {
			return reloadIf(r.edges.peerCert != nil, func() error { return r.edges.peerCert.reload() })
		},
	} {
		if err := f(); err != nil {
			r.log.Error("reload failed; keeping the previous "+what, "error", err)
		}
	}
	r.log.Info("reloaded keys and certificates")
}

func reloadIf(ok bool, f func() error) error {
	if !ok {
		return nil
	}
	return f()
}

// ready is /readyz: 200 only while the router serves (not draining, its
// health checks have run) and at least one replica of the mesh is
// healthy, so a load balancer or Kubernetes sends it traffic it can route.
func (r *router) ready() bool {
	if r.draining.Load() || !r.health.Ready() {
		return false
	}
	for _, model := range r.mesh.Models() {
		if len(r.mesh.Candidates(model, nil)) > 0 {
			return true
		}
	}
	return false
}

// modelsKnown: the first health checks are done and some model is known,
// so a model missing from the mesh is really missing (404), not unknown
// yet (503).
func (r *router) modelsKnown() bool {
	return r.health.Ready() && len(r.mesh.Models()) > 0
}
