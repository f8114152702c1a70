package main

import (
	"io"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy"
)

// TestUpstreamIdleTimeoutFlag: --upstream-idle-timeout defaults to the
// proxy's default, takes a duration (also from the environment), 0 turns
// it off (a negative proxy setting; the proxy's 0 would mean its
// default), and a negative duration is refused.
func TestUpstreamIdleTimeoutFlag(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		want  time.Duration // the flag
		proxy time.Duration // what the proxy gets
	}{
		{"default", nil, nil, proxy.DefaultUpstreamIdleTimeout, proxy.DefaultUpstreamIdleTimeout},
		{"set", []string{"--upstream-idle-timeout", "2m"}, nil, 2 * time.Minute, 2 * time.Minute},
		{"from the environment", nil, map[string]string{"KVMESH_UPSTREAM_IDLE_TIMEOUT": "90s"}, 90 * time.Second, 90 * time.Second},
		{"off", []string{"--upstream-idle-timeout", "0"}, nil, 0, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := parseRouterFlags(append([]string{"--name", "r"}, tc.args...), getenv, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if c.upstreamIdleTimeout != tc.want {
				t.Errorf("flag %v, want %v", c.upstreamIdleTimeout, tc.want)
			}
			if got := upstreamIdle(c.upstreamIdleTimeout); got != tc.proxy {
				t.Errorf("proxy setting %v, want %v", got, tc.proxy)
			}
		})
	}
	if _, err := parseRouterFlags([]string{"--name", "r", "--upstream-idle-timeout", "-1s"}, func(string) (string, bool) { return "", false }, io.Discard); err == nil {
		t.Error("a negative --upstream-idle-timeout was accepted")
	}
}
