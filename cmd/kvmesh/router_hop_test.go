package main

import (
	"io"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy"
)

// TestHopDispatchTimeoutFlag: --hop-dispatch-timeout defaults to the
// proxy's default, takes a duration (also from the environment), and 0
// turns the entry's side of the dispatch protocol off (a negative
// proxy setting; the proxy's 0 would mean its default).
func TestHopDispatchTimeoutFlag(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		want  time.Duration // the flag
		proxy time.Duration // what the proxy gets
	}{
		{"default", nil, nil, proxy.DefaultHopDispatchTimeout, proxy.DefaultHopDispatchTimeout},
		{"set", []string{"--hop-dispatch-timeout", "2s"}, nil, 2 * time.Second, 2 * time.Second},
		{"from the environment", nil, map[string]string{"KVMESH_HOP_DISPATCH_TIMEOUT": "750ms"}, 750 * time.Millisecond, 750 * time.Millisecond},
		{"off", []string{"--hop-dispatch-timeout", "0"}, nil, 0, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := parseRouterFlags(append([]string{"--name", "r"}, tc.args...), getenv, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.hopDispatchTimeout != tc.want {
				t.Errorf("flag %v, want %v", c.hopDispatchTimeout, tc.want)
			}
			if got := hopDispatchTimeout(c.hopDispatchTimeout); got != tc.proxy {
				t.Errorf("proxy setting %v, want %v", got, tc.proxy)
			}
		})
	}
}
