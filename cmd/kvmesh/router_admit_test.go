package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/proxy/admit"
)

// TestAdmitFlags: admission is on by default with the package's
// defaults, off with --admit-max-waiting 0, read from the environment
// like every flag, and refused when out of range.
func TestAdmitFlags(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	c, err := parseRouterFlags([]string{"--name", "r"}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a := c.admissionConfig(); a == nil || a.MaxWaiting != admit.DefaultMaxWaiting || a.MaxQueue != admit.DefaultMaxQueue || a.Timeout != admit.DefaultTimeout {
		t.Errorf("default admission %+v", a)
	}
	c, err = parseRouterFlags([]string{"--name", "r", "--admit-max-waiting", "0"}, none, io.Discard)
	if err != nil || c.admissionConfig() != nil {
		t.Errorf("--admit-max-waiting 0: %+v, %v; want admission off", c.admissionConfig(), err)
	}
	env := func(k string) (string, bool) {
		if k == "KVMESH_ADMIT_QUEUE_TIMEOUT" {
			return "3s", true
		}
		return "", false
	}
	if c, err = parseRouterFlags([]string{"--name", "r"}, env, io.Discard); err != nil || c.admissionConfig().Timeout != 3*time.Second {
		t.Errorf("KVMESH_ADMIT_QUEUE_TIMEOUT=3s: %+v, %v", c.admissionConfig(), err)
	}
	for _, args := range [][]string{{"--admit-max-waiting", "-1"}, {"--admit-queue", "0"}, {"--admit-queue-timeout", "0s"}, {"--admit-max-kv-usage", "1.5"}} {
		if _, err := parseRouterFlags(append([]string{"--name", "r"}, args...), none, io.Discard); err == nil || !strings.Contains(err.Error(), "--admit") {
			t.Errorf("%v: error %v, want one naming the admission flags", args, err)
		}
	}
}
