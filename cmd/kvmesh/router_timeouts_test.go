package main

import (
	"io"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/hop"
)

// TestOffTimeoutFlags: --hop-dispatch-timeout and --upstream-idle-timeout
// default to the proxy's defaults, take a duration (also from the
// environment), and 0 turns them off (a negative proxy setting; the
// proxy's 0 would mean its default); a negative --upstream-idle-timeout
// is refused.
func TestOffTimeoutFlags(t *testing.T) {
	hopTimeout := func(c routerConfig) time.Duration { return c.hopDispatchTimeout }
	idle := func(c routerConfig) time.Duration { return c.upstreamIdleTimeout }
	tests := []struct {
		name  string
		flag  func(routerConfig) time.Duration
		args  []string
		env   map[string]string
		want  time.Duration // the flag
		proxy time.Duration // what the proxy gets
	}{
		{"hop default", hopTimeout, nil, nil, hop.DefaultDispatchTimeout, hop.DefaultDispatchTimeout},
		{"hop set", hopTimeout, []string{"--hop-dispatch-timeout", "2s"}, nil, 2 * time.Second, 2 * time.Second},
		{"hop from the environment", hopTimeout, nil, map[string]string{"KVMESH_HOP_DISPATCH_TIMEOUT": "750ms"}, 750 * time.Millisecond, 750 * time.Millisecond},
		{"hop off", hopTimeout, []string{"--hop-dispatch-timeout", "0"}, nil, 0, -1},
		{"idle default", idle, nil, nil, proxy.DefaultUpstreamIdleTimeout, proxy.DefaultUpstreamIdleTimeout},
		{"idle set", idle, []string{"--upstream-idle-timeout", "2m"}, nil, 2 * time.Minute, 2 * time.Minute},
		{"idle from the environment", idle, nil, map[string]string{"KVMESH_UPSTREAM_IDLE_TIMEOUT": "90s"}, 90 * time.Second, 90 * time.Second},
		{"idle off", idle, []string{"--upstream-idle-timeout", "0"}, nil, 0, -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			c, err := parseRouterFlags(append([]string{"--name", "r"}, tc.args...), getenv, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if got := tc.flag(c); got != tc.want {
				t.Errorf("flag %v, want %v", got, tc.want)
			}
			if got := offTimeout(tc.flag(c)); got != tc.proxy {
				t.Errorf("proxy setting %v, want %v", got, tc.proxy)
			}
		})
	}
	if _, err := parseRouterFlags([]string{"--name", "r", "--upstream-idle-timeout", "-1s"}, func(string) (string, bool) { return "", false }, io.Discard); err == nil {
		t.Error("a negative --upstream-idle-timeout was accepted")
	}
}
