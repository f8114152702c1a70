// Package discover lists the replicas a router fronts from sources that
// change while it runs: a DNS name (A/AAAA records with a port, or SRV
// records, as a Kubernetes headless Service publishes its pods) and a
// file of URLs. Watch polls a source and reports each new list.
package discover

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/panics"
)

// Source lists replica base URLs.
type Source interface {
	// Name says where the list comes from, for logs.
	Name() string
	// List returns the replicas now, sorted. An error leaves the caller's
	// last list in place.
	List(ctx context.Context) ([]string, error)
}

// Bounds on one listing.
const (
	// MaxReplicas is the most replicas one listing may return; more is
	// an error (the last list stays), not a silent cut.
	MaxReplicas = 4096
	// listTimeout bounds one listing (a DNS server that never answers).
	listTimeout = 10 * time.Second
)

// Watch lists src at once, then every interval and whenever poke
// receives, and calls update with every list that differs from the last
// one (the first always). A failed listing keeps the last list: a DNS
// server that times out or a file being rewritten must not empty the
// router. A listing or an update that panics is recovered and counted in
// rec (nil: a recorder of Watch's own, not registered) as a failed
// listing is: the last list stays, and the next listing (at its time)
// updates again, so the watcher outlives a bug rather than the router
// dying of it. It returns when ctx is done.
func Watch(ctx context.Context, src Source, interval time.Duration, poke <-chan struct{}, update func([]string), log hclog.Logger, rec *panics.Recorder) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if rec == nil {
		rec = panics.New(nil, log)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var last []string
	first, failing := true, false
	for {
		lctx, cancel := context.WithTimeout(ctx, listTimeout)
		var l []string
		var err error
		if rec.Guard(panics.Discovery, func() { l, err = src.List(lctx) }) {
			err = errListPanicked
		}
		cancel()
		if err == nil && len(l) > MaxReplicas {
			err = fmt.Errorf("%d replicas listed, more than %d", len(l), MaxReplicas)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if !failing {
				log.Warn("listing replicas failed; keeping the last list", "source", src.Name(), "error", err)
			}
			failing = true
		default:
			if failing {
				log.Info("listing replicas works again", "source", src.Name())
			}
			failing = false
			if first || !slices.Equal(l, last) {
				log.Info("replicas listed", "source", src.Name(), "replicas", strings.Join(l, ","))
				if !rec.Guard(panics.Discovery, func() { update(slices.Clone(l)) }) {
					last, first = l, false
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-poke:
			if inv, ok := src.(interface{ Invalidate() }); ok {
				inv.Invalidate()
			}
		}
	}
}

// errListPanicked is a listing that panicked (counted and logged by the
// recorder).
var errListPanicked = errors.New("listing panicked")

// NewResolver returns a resolver that asks the DNS server at server
// (HOST:PORT) instead of the system's ("" returns the system resolver).
// Go's own resolver is used either way, so nothing is cached between
// lookups.
func NewResolver(server string) *net.Resolver {
	if server == "" {
		return &net.Resolver{PreferGo: true}
	}
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		},
	}
}

// DNS lists the replicas behind a DNS name. HOST:PORT resolves HOST's A
// and AAAA records, one replica per address at PORT (a Kubernetes
// headless Service); _service._proto.name resolves SRV records, one
// replica per target address and port.
type DNS struct {
	target     string
	srv        bool
	host, port string
	scheme     string
	resolver   *net.Resolver
}

// NewDNS parses target (HOST:PORT or _service._proto.name) for replicas
// reached with scheme (http or https) through resolver (nil: the
// system's).
func NewDNS(target, scheme string, resolver *net.Resolver) (*DNS, error) {
	if resolver == nil {
		resolver = NewResolver("")
	}
	if scheme != "http" && scheme != "https" {
		return nil, fmt.Errorf("replica DNS %q: scheme %q is not http or https", target, scheme)
	}
	d := &DNS{target: target, scheme: scheme, resolver: resolver}
	if strings.HasPrefix(target, "_") {
		if labels := strings.Split(strings.TrimSuffix(target, "."), "."); len(labels) < 3 || !strings.HasPrefix(labels[1], "_") {
			return nil, fmt.Errorf("replica DNS %q: an SRV name is _service._proto.name", target)
		}
		d.srv = true
		return d, nil
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		return nil, fmt.Errorf("replica DNS %q: want HOST:PORT or _service._proto.name: %w", target, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 || host == "" {
		return nil, fmt.Errorf("replica DNS %q: want HOST:PORT with a port in 1-65535", target)
	}
	d.host, d.port = host, port
	return d, nil
}

// Name is the DNS target.
func (d *DNS) Name() string { return "dns " + d.target }

// List resolves the target now. A name that does not exist (NXDOMAIN)
// is an empty list, not an error: a Service scaled to zero has no
// records.
func (d *DNS) List(ctx context.Context) ([]string, error) {
	var hostPorts []string
	if d.srv {
		_, srvs, err := d.resolver.LookupSRV(ctx, "", "", d.target)
		if notFound(err) {
			return []string{}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("resolve SRV %s: %w", d.target, err)
		}
		for _, s := range srvs {
			ips, err := d.lookupIP(ctx, s.Target)
			if err != nil {
				return nil, err
			}
			for _, ip := range ips {
				hostPorts = append(hostPorts, net.JoinHostPort(ip, strconv.Itoa(int(s.Port))))
			}
		}
	} else {
		ips, err := d.lookupIP(ctx, d.host)
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			hostPorts = append(hostPorts, net.JoinHostPort(ip, d.port))
		}
	}
	out := make([]string, 0, len(hostPorts))
	for _, hp := range hostPorts {
		out = append(out, d.scheme+"://"+hp)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// lookupIP resolves host's addresses (none when it does not exist).
func (d *DNS) lookupIP(ctx context.Context, host string) ([]string, error) {
	if ip := net.ParseIP(host); ip != nil {
		return []string{ip.String()}, nil
	}
	addrs, err := d.resolver.LookupIPAddr(ctx, host)
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", host, err)
	}
	ips := make([]string, 0, len(addrs))
	for _, a := range addrs {
		ips = append(ips, a.IP.String())
	}
	return ips, nil
}

func notFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// maxFileBytes bounds a replica file.
const maxFileBytes = 1 << 20

// File lists the replicas in a file: one base URL per line; blank lines
// and lines starting with # are skipped. List re-reads the file only when
// its modification time or size changed (or after Invalidate, which
// Watch calls on a poke, e.g. SIGHUP).
type File struct {
	path string
	log  hclog.Logger

	mu      sync.Mutex
	mod     time.Time
	size    int64
	cached  []string
	current bool
}

// NewFile returns the source of the file at path; bad lines are logged
// to log and skipped.
func NewFile(path string, log hclog.Logger) *File {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &File{path: path, log: log}
}

// Name is the file's path.
func (f *File) Name() string { return "file " + f.path }

// Invalidate makes the next List read the file even if it looks unchanged.
func (f *File) Invalidate() {
	f.mu.Lock()
	f.current = false
	f.mu.Unlock()
}

// List returns the file's replicas.
func (f *File) List(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err != nil {
		return nil, fmt.Errorf("replica file: %w", err)
	}
	if f.current && fi.ModTime().Equal(f.mod) && fi.Size() == f.size {
		return slices.Clone(f.cached), nil
	}
	fh, err := os.Open(f.path)
	if err != nil {
		return nil, fmt.Errorf("replica file: %w", err)
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, maxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("replica file %s: %w", f.path, err)
	}
	if len(b) > maxFileBytes {
		return nil, fmt.Errorf("replica file %s: over %d bytes", f.path, maxFileBytes)
	}
	l, bad := ParseList(b)
	for _, line := range bad {
		f.log.Warn("replica file: skipping a line that is not an http(s) URL", "file", f.path, "line", line)
	}
	f.mod, f.size, f.cached, f.current = fi.ModTime(), fi.Size(), l, true
	return slices.Clone(l), nil
}

// ParseList reads one replica base URL per line (trailing slashes
// dropped; blank lines and # comments skipped), sorted and without
// duplicates; bad holds the lines that are not http(s) URLs.
func ParseList(b []byte) (urls, bad []string) {
	urls = []string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), maxFileBytes)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		u, err := ParseReplicaURL(line)
		if err != nil {
			bad = append(bad, line)
			continue
		}
		urls = append(urls, u)
	}
	slices.Sort(urls)
	return slices.Compact(urls), bad
}

// ParseReplicaURL checks that s is an http(s) base URL and returns it
// without trailing slashes (the form replica IDs take).
func ParseReplicaURL(s string) (string, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q is not an http(s) URL", s)
	}
	return strings.TrimRight(s, "/"), nil
}
