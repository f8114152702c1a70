//go:build fault

package fault

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The network: one namespace per process, veth pairs to a bridge in a hub
// namespace. No address exists outside these namespaces.
const (
	nsPrefix = "kvf-"
	hubNS    = "kvf-hub"
	clientNS = "kvf-c"
	clientIP = "10.77.0.2"
	// attackerIP is a second address of the client namespace: floods come
	// from it, so per-client caps tell them from the load.
	attackerIP = "10.77.0.3"
	bridge     = "kvfbr0"
)

// nodeNS lists every namespace but the hub with its address.
func nodeNS() map[string]string {
	m := map[string]string{clientNS: clientIP}
	for i := 1; i <= numRouters; i++ {
		m[routerNS(i)] = routerIP(i)
	}
	for i := 1; i <= numReplicas; i++ {
		m[replicaNS(i)] = replicaIP(i)
	}
	return m
}

func routerNS(i int) string  { return fmt.Sprintf("%sr%d", nsPrefix, i) }
func replicaNS(i int) string { return fmt.Sprintf("%sp%d", nsPrefix, i) }
func routerIP(i int) string  { return fmt.Sprintf("10.77.0.%d", 10+i) }
func replicaIP(i int) string { return fmt.Sprintf("10.77.0.%d", 20+i) }

// TestMain has three roles. Started by `go test` it is the outer process:
// it builds kvmesh, creates the network, re-runs this binary inside the
// client namespace (the inner process, which runs the tests) and always
// removes the network afterwards. With KVF_ROLE=replica it is a simulated
// replica (see replica_test.go).
func TestMain(m *testing.M) {
	switch os.Getenv("KVF_ROLE") {
	case "replica":
		os.Exit(replicaMain())
	case "inner":
		os.Exit(innerMain(m))
	}
	os.Exit(outerMain())
}

func outerMain() int {
	if os.Geteuid() != 0 {
		fmt.Println("fault suite: SKIP: needs root (network namespaces, nftables)")
		return 0
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "fault suite: %s not found; run internal/lab/fault/run.sh, which installs iproute2 and nftables\n", tool)
			return 1
		}
	}
	dir, err := os.MkdirTemp("", "kvf-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fault suite:", err)
		return 1
	}
	keep := os.Getenv("KVF_KEEP") != ""
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	bin := os.Getenv("KVF_KVMESH")
	if bin == "" {
		bin = filepath.Join(dir, "kvmesh")
		b := exec.Command("go", "build", "-o", bin, "github.com/kvmesh/kvmesh/cmd/kvmesh")
		b.Stdout, b.Stderr = os.Stderr, os.Stderr
		if err := b.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "fault suite: building kvmesh:", err)
			return 1
		}
	}
	teardown()
	// Teardown runs on every way out: return, panic, SIGINT, SIGTERM.
	// (run.sh repeats it in a trap, for a SIGKILL from `go test -timeout`.)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	var inner *exec.Cmd
	go func() {
		s := <-sig
		fmt.Fprintln(os.Stderr, "fault suite: got", s, "- removing the network")
		if inner != nil && inner.Process != nil {
			_ = inner.Process.Kill()
		}
		teardown()
		os.Exit(1)
	}()
	defer teardown()
	if err := setup(); err != nil {
		fmt.Fprintln(os.Stderr, "fault suite: network setup:", err)
		return 1
	}
	inner = exec.Command("ip", append([]string{"netns", "exec", clientNS, os.Args[0]}, os.Args[1:]...)...)
	inner.Env = append(cleanEnv(), "KVF_ROLE=inner", "KVF_DIR="+dir, "KVF_KVMESH="+bin)
	if d := os.Getenv("KVF_DOC"); d != "" {
		if !filepath.IsAbs(d) {
			d = filepath.Join("..", "..", "..", d) // go test runs in internal/lab/fault; the path is from the repo root
		}
		if abs, err := filepath.Abs(d); err == nil {
			inner.Env = append(inner.Env, "KVF_DOC="+abs)
		}
	}
	inner.Stdout, inner.Stderr = os.Stdout, os.Stderr
	err = inner.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		fmt.Fprintf(os.Stderr, "fault suite: failed; process logs in %s (kept)\n", dir)
		keep = true
		return max(ee.ExitCode(), 1)
	default:
		fmt.Fprintln(os.Stderr, "fault suite:", err)
		return 1
	}
}

// cleanEnv is the environment without the suite's and kvmesh's own
// variables, so a child sees only what it is given.
func cleanEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KVF_") && !strings.HasPrefix(kv, "KVMESH_") {
			out = append(out, kv)
		}
	}
	return out
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func setup() error {
	hosts := "127.0.0.1 localhost\n"
	for i := 1; i <= numRouters; i++ {
		hosts += fmt.Sprintf("%s %s\n", routerIP(i), routerHost(i))
	}
	cmds := [][]string{
		{"ip", "netns", "add", hubNS},
		{"ip", "-n", hubNS, "link", "set", "lo", "up"},
		{"ip", "-n", hubNS, "link", "add", bridge, "type", "bridge"},
		{"ip", "-n", hubNS, "link", "set", bridge, "up"},
	}
	for ns, ip := range nodeNS() {
		peer := "v" + strings.TrimPrefix(ns, nsPrefix)
		cmds = append(cmds,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", hubNS, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", hubNS, "link", "set", peer, "master", bridge},
			[]string{"ip", "-n", hubNS, "link", "set", peer, "up"},
			[]string{"ip", "-n", ns, "addr", "add", ip + "/24", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
		)
		// `ip netns exec` bind-mounts /etc/netns/<ns>/hosts over
		// /etc/hosts: the routers' seeds are DNS names, re-resolved.
		d := filepath.Join("/etc/netns", ns)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(d, "hosts"), []byte(hosts), 0o644); err != nil {
			return err
		}
	}
	cmds = append(cmds, []string{"ip", "-n", clientNS, "addr", "add", attackerIP + "/24", "dev", "eth0"})
	for _, c := range cmds {
		if err := run(c[0], c[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// teardown kills every process left in the suite's namespaces and deletes
// them. It is safe to call at any time, any number of times.
func teardown() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], nsPrefix) {
			continue
		}
		ns := f[0]
		pids, _ := exec.Command("ip", "netns", "pids", ns).Output()
		for _, p := range strings.Fields(string(pids)) {
			if pid, err := strconv.Atoi(p); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		// A killed process may hold the namespace for a moment.
		for i := 0; i < 20; i++ {
			if exec.Command("ip", "netns", "del", ns).Run() == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = os.RemoveAll(filepath.Join("/etc/netns", ns))
	}
}
