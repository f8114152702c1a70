package mesh

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeUsage is a Usage that sends its name and records what it merged.
type fakeUsage struct {
	name string
	mu   sync.Mutex
	from map[string]int
}

func (f *fakeUsage) AppendGossip(dst []byte, _ time.Time) []byte { return append(dst, f.name...) }

func (f *fakeUsage) MergeGossip(origin string, boot uint64, b []byte, _ time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if string(b) != origin || boot == 0 {
		return fmt.Errorf("from %s (boot %d): %q", origin, boot, b)
	}
	f.from[origin]++
	return nil
}

func (f *fakeUsage) heard(origin string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.from[origin]
}

// TestRollingUpgradeUsage: routers that read the tenants' usage send it
// to each other every interval; a router from before it (wireEngine) is
// sent none and refuses nothing.
func TestRollingUpgradeUsage(t *testing.T) {
	old := wireEngine
	us := map[string]*fakeUsage{}
	with := func(name string, mod func(*Config)) func(*Config) {
		us[name] = &fakeUsage{name: name, from: map[string]int{}}
		return func(c *Config) {
			if mod != nil {
				mod(c)
			}
			c.Usage, c.UsageInterval = us[name], 20*time.Millisecond
		}
	}
	a := newRouter(t, "a", with("a", nil))
	b := newRouter(t, "b", with("b", func(c *Config) { joining(a)(c); c.wire = &old }))
	c := newRouter(t, "c", with("c", joining(a)))
	for _, r := range []*testRouter{a, b, c} {
		eventually(t, wait, "three members at "+r.cfg.Name, func() error {
			if n := members(r.Mesh); n != 3 {
				return fmt.Errorf("%d members", n)
			}
			return nil
		})
	}
	eventually(t, wait, "a and c hear each other's usage, again and again", func() error {
		if us["a"].heard("c") < 5 || us["c"].heard("a") < 5 {
			return fmt.Errorf("a heard c %d times, c heard a %d times", us["a"].heard("c"), us["c"].heard("a"))
		}
		return nil
	})
	if n := us["b"].heard("a") + us["b"].heard("c"); n != 0 {
		t.Fatalf("the old router was sent usage %d times", n)
	}
	for _, r := range []*testRouter{a, b, c} {
		if n := testutil.ToFloat64(r.met.dropped.WithLabelValues(dropDecode)); n != 0 {
			t.Fatalf("%s refused %v messages", r.cfg.Name, n)
		}
	}
	if n := testutil.ToFloat64(a.met.messages.WithLabelValues("usage", "in")); n < 5 {
		t.Fatalf("a counted %v usage messages in", n)
	}
}
