package discover

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/discover/dnstest"
	"github.com/kvmesh/kvmesh/internal/panics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func startDNS(t *testing.T) *dnstest.Server {
	t.Helper()
	s, err := dnstest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestDNSAddressRecords: HOST:PORT lists one replica per A and AAAA
// record, follows changes on the next lookup, and reads a name that is
// gone as no replicas.
func TestDNSAddressRecords(t *testing.T) {
	srv := startDNS(t)
	d, err := NewDNS("replicas.kvmesh.test:8000", "http", NewResolver(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		ips  []string
		want []string
	}{
		{[]string{"10.0.0.2", "10.0.0.1", "fd00::1"}, []string{"http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://[fd00::1]:8000"}},
		{[]string{"10.0.0.2"}, []string{"http://10.0.0.2:8000"}},
		{nil, []string{}}, // NXDOMAIN
	}
	for i, s := range steps {
		srv.SetIPs("replicas.kvmesh.test", s.ips...)
		got, err := d.List(t.Context())
		if err != nil || !slices.Equal(got, s.want) {
			t.Errorf("step %d: %v %v, want %v", i, got, err, s.want)
		}
	}
}

// TestDNSSRV: _service._proto.name lists one replica per SRV target
// address and port; a target without addresses is skipped.
func TestDNSSRV(t *testing.T) {
	srv := startDNS(t)
	srv.SetSRV("_openai._tcp.kvmesh.test", dnstest.Target{Host: "r1.kvmesh.test", Port: 9001},
		dnstest.Target{Host: "r2.kvmesh.test", Port: 9002}, dnstest.Target{Host: "gone.kvmesh.test", Port: 9003})
	srv.SetIPs("r1.kvmesh.test", "127.0.0.1")
	srv.SetIPs("r2.kvmesh.test", "127.0.0.2")
	d, err := NewDNS("_openai._tcp.kvmesh.test", "https", NewResolver(srv.Addr))
	if err != nil {
		t.Fatal(err)
	}
	got, err := d.List(t.Context())
	if want := []string{"https://127.0.0.1:9001", "https://127.0.0.2:9002"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("got %v %v, want %v", got, err, want)
	}
	srv.SetSRV("_openai._tcp.kvmesh.test")
	if got, err := d.List(t.Context()); err != nil || len(got) != 0 {
		t.Errorf("after removal: %v %v", got, err)
	}
}

// TestDNSServerDown: a resolver that gets no answer is an error (the
// caller keeps its last list), not an empty list.
func TestDNSServerDown(t *testing.T) {
	srv := startDNS(t)
	addr := srv.Addr
	srv.Close()
	d, _ := NewDNS("replicas.kvmesh.test:8000", "http", NewResolver(addr))
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if got, err := d.List(ctx); err == nil {
		t.Errorf("no error from a dead DNS server: %v", got)
	}
}

func TestNewDNS(t *testing.T) {
	tests := []struct {
		target, scheme string
		ok             bool
	}{
		{"svc.ns.svc.cluster.local:8000", "http", true},
		{"[::1]:8000", "http", true},
		{"_http._tcp.svc.ns.svc.cluster.local", "http", true},
		{"svc.ns", "http", false},    // no port
		{"svc:0", "http", false},     // bad port
		{"svc:99999", "http", false}, // bad port
		{":8000", "http", false},     // no host
		{"_http.svc", "http", false}, // not _service._proto.name
		{"svc:8000", "grpc", false},  // scheme
		{"_http._tcp.x", "https", true},
	}
	for _, tc := range tests {
		if _, err := NewDNS(tc.target, tc.scheme, nil); (err == nil) != tc.ok {
			t.Errorf("%q %q: %v", tc.target, tc.scheme, err)
		}
	}
}

// scripted is a Source that returns the results a test feeds it.
type scripted struct {
	results     chan result
	invalidated chan struct{}
}

type result struct {
	list     []string
	err      error
	panicked bool // List panics
}

func (s *scripted) Name() string { return "scripted" }
func (s *scripted) List(ctx context.Context) ([]string, error) {
	select {
	case r := <-s.results:
		if r.panicked {
			panic("test: a bug in a listing")
		}
		return r.list, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (s *scripted) Invalidate() { s.invalidated <- struct{}{} }

// watchFeed runs Watch over src, feeding it feed one listing per poke,
// then stops it and returns the lists update passed to updates, joined.
func watchFeed(t *testing.T, src *scripted, feed []result, update func([]string), rec *panics.Recorder, updates chan []string) []string {
	t.Helper()
	poke := make(chan struct{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		Watch(ctx, src, time.Hour, poke, update, nil, rec)
		close(done)
	}()
	for i, r := range feed {
		if i > 0 {
			poke <- struct{}{}
		}
		src.results <- r
	}
	poke <- struct{}{}
	cancel()
	<-done
	close(updates)
	var got []string
	for l := range updates {
		got = append(got, strings.Join(l, " "))
	}
	return got
}

// TestWatch: updates come for the first list and for each change only; a
// failed listing keeps the last list; a poke lists again at once and
// invalidates the source.
func TestWatch(t *testing.T) {
	src := &scripted{results: make(chan result), invalidated: make(chan struct{}, 10)}
	updates := make(chan []string, 10)
	feed := []result{
		{list: []string{}},
		{list: []string{"http://a"}},
		{err: errors.New("timeout")},
		{list: []string{"http://a"}},
		{list: []string{"http://a", "http://b"}},
	}
	got := watchFeed(t, src, feed, func(l []string) { updates <- l }, nil, updates)
	if want := []string{"", "http://a", "http://a http://b"}; !slices.Equal(got, want) {
		t.Errorf("updates %q, want %q", got, want)
	}
	if len(src.invalidated) != len(feed) {
		t.Errorf("%d invalidations, want %d", len(src.invalidated), len(feed))
	}
}

// TestWatchPanicContained: a listing that panics is counted as
// where="discovery" and keeps the last list, as a failed one does; an
// update that panics is counted and applied again at the next listing
// of the same list. The watcher serves on either way.
func TestWatchPanicContained(t *testing.T) {
	src := &scripted{results: make(chan result), invalidated: make(chan struct{}, 10)}
	rec := panics.New(nil, nil)
	updates := make(chan []string, 10)
	var calls int
	update := func(l []string) {
		calls++
		if calls == 2 {
			panic("test: a bug in an update")
		}
		updates <- l
	}
	feed := []result{
		{list: []string{"http://a"}},
		{panicked: true},
		{list: []string{"http://a", "http://b"}}, // its update panics
		{list: []string{"http://a", "http://b"}}, // applied again
	}
	got := watchFeed(t, src, feed, update, rec, updates)
	if want := []string{"http://a", "http://a http://b"}; !slices.Equal(got, want) {
		t.Errorf("updates %q, want %q", got, want)
	}
	if n := testutil.ToFloat64(rec.Counter(panics.Discovery)); n != 2 {
		t.Errorf("%v panics counted, want 2", n)
	}
}

// TestFile: the file is read again when it changes (modification time or
// size) or when invalidated, bad lines are skipped, and a missing file is
// an error.
func TestFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "replicas")
	write := func(s string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	f := NewFile(p, nil)
	if _, err := f.List(t.Context()); err == nil {
		t.Error("missing file listed")
	}
	t0 := time.Now().Add(-time.Hour)
	write("# replicas\nhttp://b:1/\n\nhttp://a:1\nnot a url\nftp://c\nhttp://a:1\n", t0)
	list := func() []string {
		t.Helper()
		l, err := f.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if got := list(); !slices.Equal(got, []string{"http://a:1", "http://b:1"}) {
		t.Errorf("got %v", got)
	}
	write("http://x:1\nhttp://y:1\nhttp://z:1\n", t0.Add(time.Second)) // changed
	if got := list(); !slices.Equal(got, []string{"http://x:1", "http://y:1", "http://z:1"}) {
		t.Errorf("after change: %v", got)
	}
	write("http://q:1\nhttp://r:1\nhttp://s:1\n", t0.Add(time.Second)) // same size and time
	if got := list(); !slices.Equal(got, []string{"http://x:1", "http://y:1", "http://z:1"}) {
		t.Errorf("re-read an unchanged-looking file: %v", got)
	}
	f.Invalidate() // SIGHUP
	if got := list(); !slices.Equal(got, []string{"http://q:1", "http://r:1", "http://s:1"}) {
		t.Errorf("after invalidate: %v", got)
	}
	write(strings.Repeat("#", maxFileBytes+1), t0.Add(2*time.Second))
	if _, err := f.List(t.Context()); err == nil {
		t.Error("oversized file listed")
	}
}

func TestParseList(t *testing.T) {
	urls, bad := ParseList([]byte(" http://h:1/ \r\n#c\nhttps://h:2\nh:3\n"))
	if !slices.Equal(urls, []string{"http://h:1", "https://h:2"}) || !slices.Equal(bad, []string{"h:3"}) {
		t.Errorf("urls %v bad %v", urls, bad)
	}
	if urls, _ := ParseList(nil); urls == nil || len(urls) != 0 {
		t.Errorf("empty file: %#v", urls)
	}
}

// FuzzParseList: a replica file of any bytes yields only http(s) URLs
// without trailing slashes, sorted and unique.
func FuzzParseList(f *testing.F) {
	f.Add([]byte("http://a:1/\n# c\nhttps://b\nftp://x\n"))
	f.Add([]byte("\xff\x00http://[::1]:8000\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		urls, _ := ParseList(b)
		if !slices.IsSorted(urls) || len(slices.Compact(slices.Clone(urls))) != len(urls) {
			t.Fatalf("not sorted and unique: %q", urls)
		}
		for _, u := range urls {
			if (!strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://")) || strings.HasSuffix(u, "/") {
				t.Fatalf("bad URL %q", u)
			}
		}
	})
}
