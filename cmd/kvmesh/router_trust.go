package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
)

// Issue 24, "secure by default": the hint headers routers put on the
// requests they forward to each other (proxy/trust.go) steer a request to
// a replica and skip the client's API key, so a router believes them only
// from a peer that proves itself: by the hop MAC (under a key derived
// from --gossip-key-file) or by a client certificate of the peer CA
// (peer mutual TLS). A router with neither ignores them, which is right
// for a router alone; a router that joins others without either would
// leave its mesh open to anyone who reaches an API port (and its gossip
// to anyone who reaches the gossip port), so it refuses to start unless
// told --insecure-mesh.

// errInsecureMesh is why a router that would join an unauthenticated
// mesh does not start.
var errInsecureMesh = errors.New("router: --join makes this router part of a multi-router mesh, but it has no way to authenticate its peers: " +
	"set --gossip-key-file (KVMESH_GOSSIP_KEY_FILE) to a file with the same key on every router " +
	"(16, 24 or 32 bytes, e.g. `head -c 32 /dev/urandom | base64 > gossip.key`), " +
	"or peer mutual TLS (--tls-cert/--tls-key, --peer-tls-ca, --peer-tls-cert/--peer-tls-key), " +
	"or, only on a network you fully trust, --insecure-mesh (KVMESH_INSECURE_MESH=true)")

// peerMTLS reports whether the router's peers authenticate their hops to
// it by certificate and it authenticates its own: it serves TLS that
// verifies the peer CA's client certificates, and presents one.
func peerMTLS(cfg *routerConfig) bool {
	return cfg.tlsCert != "" && cfg.peerTLSCA != "" && cfg.peerCert != ""
}

// meshAuthenticated reports whether the router can tell its peers'
// requests from a client's: a gossip key or peer mutual TLS.
func meshAuthenticated(cfg *routerConfig) bool {
	return len(cfg.gossipKey) > 0 || peerMTLS(cfg)
}

// checkMeshAuth refuses a router that joins a mesh it cannot
// authenticate, unless --insecure-mesh. A router without --join needs no
// key: alone, it believes no hint header (the first router of a mesh,
// which the others join, is told by the others' keys: they refuse to
// join it without one, and it ignores their hops until it has the key).
func checkMeshAuth(cfg *routerConfig) error {
	if len(cfg.join) > 0 && !meshAuthenticated(cfg) && !cfg.insecureMesh {
		return errInsecureMesh
	}
	return nil
}

// logMeshAuth says at start whom the router believes about hints.
func logMeshAuth(log hclog.Logger, cfg *routerConfig) {
	switch {
	case meshAuthenticated(cfg):
	case cfg.insecureMesh:
		log.Warn("--insecure-mesh: no gossip key and no peer mutual TLS, so gossip is unauthenticated and this router believes the X-Kvmesh-Hop hint headers of anyone who reaches its API (they choose the replica and skip the per-client cap); use only on a network you fully trust")
	default:
		log.Info("no gossip key and no peer mutual TLS: this router ignores X-Kvmesh-Hop hint headers (a router alone needs none); routers that join it need --gossip-key-file or peer mutual TLS on every router")
	}
}

// tempGossipKey writes a fresh random 32-byte gossip key, base64, to a
// file only this user reads, for a local mesh that starts its own routers
// (the demo); the caller removes it.
func tempGossipKey() (string, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("gossip key: %w", err)
	}
	f, err := os.CreateTemp("", "kvmesh-gossip-*.key")
	if err != nil {
		return "", fmt.Errorf("gossip key: %w", err)
	}
	_, werr := f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n")
	if err := errors.Join(werr, f.Close()); err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("gossip key %s: %w", f.Name(), err)
	}
	return f.Name(), nil
}
