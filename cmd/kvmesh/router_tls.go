package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync/atomic"
)

// certFile is a certificate and key pair read from files, re-read on
// reload (SIGHUP) so a rotated certificate needs no restart.
type certFile struct {
	certPath, keyPath string
	cert              atomic.Pointer[tls.Certificate]
}

func loadCertFile(certPath, keyPath string) (*certFile, error) {
	c := &certFile{certPath: certPath, keyPath: keyPath}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *certFile) reload() error {
	cert, err := tls.LoadX509KeyPair(c.certPath, c.keyPath)
	if err != nil {
		return fmt.Errorf("router: certificate %s / key %s: %w", c.certPath, c.keyPath, err)
	}
	c.cert.Store(&cert)
	return nil
}

func (c *certFile) get() *tls.Certificate { return c.cert.Load() }

// readCAPool reads PEM certificates into a pool.
func readCAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("router: CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("router: CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

// serverTLS is the API's TLS configuration. With a peer CA, a client
// certificate signed by it is verified when given (peers present one
// with --peer-tls-cert); clients without one are served as usual.
func serverTLS(cert *certFile, peerCA *x509.CertPool) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return cert.get(), nil
		},
	}
	if peerCA != nil {
		c.ClientAuth, c.ClientCAs = tls.VerifyClientCertIfGiven, peerCA
	}
	return c
}

// peerTLS is the TLS configuration of requests to peers and replicas:
// the system roots plus the peer CA, and the client certificate for
// mutual TLS when given.
func peerTLS(peerCA *x509.CertPool, caPath string, client *certFile) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if peerCA != nil {
		roots, err := x509.SystemCertPool()
		if err != nil || roots == nil {
			roots = x509.NewCertPool()
		}
		b, err := os.ReadFile(caPath)
		if err != nil {
			return nil, fmt.Errorf("router: peer CA: %w", err)
		}
		roots.AppendCertsFromPEM(b)
		c.RootCAs = roots
	}
	if client != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return client.get(), nil }
	}
	return c, nil
}
