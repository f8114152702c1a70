//go:build fault

package fault

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	numRouters  = 4
	numReplicas = 5
	apiPort     = 8080
	adminPort   = 9090
	gossipPort  = 7946
	replicaPort = 8000
	// failedPeerTimeout is what the suite sets the routers' failed-peer
	// timeout to (--failed-peer-timeout), so a partition can outlast it.
	failedPeerTimeout = 5 * time.Second
)

// declaredAt is the topology: replica -> the routers declaring it. Every
// replica but p5 has two declarers, so its owner can fail over; p5 has one,
// so its router's death leaves it with no live declarer.
var declaredAt = map[int][]int{1: {1, 2}, 2: {2, 3}, 3: {3, 4}, 4: {4, 1}, 5: {2}}

func routerHost(i int) string { return fmt.Sprintf("r%d.kvf", i) }
func routerName(i int) string { return fmt.Sprintf("r%d", i) }
func replicaURL(k int) string { return fmt.Sprintf("http://%s:%d", replicaIP(k), replicaPort) }
func routerAPI(i int) string  { return fmt.Sprintf("http://%s:%d", routerIP(i), apiPort) }

// proc is one process of the suite, started in its namespace.
type proc struct {
	name, ns string
	args     []string
	env      []string
	log      string

	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
}

func (p *proc) running() bool {
	if p == nil || p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// up reports whether the process runs and is not stopped.
func (p *proc) up() bool { return p.running() && !p.paused }

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) start() error {
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "\n=== %s start %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(p.args, " "))
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.ns}, p.args...)...)
	cmd.Env = append(cleanEnv(), p.env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.done, p.paused = cmd, make(chan struct{}), false
	go func(done chan struct{}) {
		_ = cmd.Wait()
		f.Close()
		close(done)
	}(p.done)
	return nil
}

// signal sends sig; SIGKILL and SIGTERM wait (up to wait) for the exit.
func (p *proc) signal(sig syscall.Signal, wait time.Duration) (time.Duration, error) {
	if !p.running() {
		return 0, fmt.Errorf("%s is not running", p.name)
	}
	t0 := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		return 0, fmt.Errorf("signal %s: %w", p.name, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		p.paused = true
		return 0, nil
	case syscall.SIGCONT:
		p.paused = false
		return 0, nil
	}
	if sig == syscall.SIGKILL {
		p.paused = false
	}
	select {
	case <-p.done:
		return time.Since(t0), nil
	case <-time.After(wait):
		_ = p.cmd.Process.Kill()
		<-p.done
		return time.Since(t0), fmt.Errorf("%s did not exit within %s of %s; killed", p.name, wait, sig)
	}
}

// rssKB reads VmRSS of the process, 0 when it cannot.
func (p *proc) rssKB() int64 {
	if !p.running() {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n
			}
		}
	}
	return 0
}

// cluster is the running mesh: routers, replicas, and what each router
// declares now.
type cluster struct {
	dir, bin string
	flags    map[string]bool // the router's flags in this build

	routers  [numRouters + 1]*proc
	replicas [numReplicas + 1]*proc
	declares map[int][]int // router -> replicas it declares
	http     *http.Client
}

var flagRE = regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`)

func newCluster(dir, bin string) (*cluster, error) {
	out, _ := exec.Command(bin, "router", "--help").CombinedOutput()
	c := &cluster{dir: dir, bin: bin, flags: map[string]bool{}, declares: map[int][]int{},
		http: &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}}
	for _, m := range flagRE.FindAllStringSubmatch(string(out), -1) {
		c.flags[m[1]] = true
	}
	if !c.flags["name"] {
		return nil, fmt.Errorf("%s router --help lists no flags:\n%s", bin, out)
	}
	for k, rs := range declaredAt {
		for _, r := range rs {
			c.declares[r] = append(c.declares[r], k)
		}
	}
	key := []byte("kvmesh-fault-suite-32-byte-key!!")
	if err := os.WriteFile(filepath.Join(dir, "gossip.key"), key, 0o600); err != nil {
		return nil, err
	}
	for k := 1; k <= numReplicas; k++ {
		c.replicas[k] = &proc{
			name: fmt.Sprintf("p%d", k), ns: replicaNS(k), args: []string{os.Args[0], "-test.run=^$"},
			env: []string{"KVF_ROLE=replica", fmt.Sprintf("KVF_LISTEN=%s:%d", replicaIP(k), replicaPort),
				"KVF_IDS=" + filepath.Join(dir, fmt.Sprintf("p%d.ids", k))},
			log: filepath.Join(dir, fmt.Sprintf("p%d.log", k)),
		}
	}
	for i := 1; i <= numRouters; i++ {
		c.routers[i] = &proc{name: routerName(i), ns: routerNS(i), log: filepath.Join(dir, routerName(i)+".log")}
	}
	return c, nil
}

// missingFlags lists the flags the suite wants that this build lacks.
func (c *cluster) missingFlags() []string {
	var out []string
	for _, f := range []string{"failed-peer-timeout", "drain-timeout", "admin-listen"} {
		if !c.flags[f] {
			out = append(out, f)
		}
	}
	return out
}

// routerArgs builds router i's command line from what it declares now.
func (c *cluster) routerArgs(i int) []string {
	region := "eu"
	if i > numRouters/2 {
		region = "us"
	}
	var seeds []string
	for j := 1; j <= numRouters; j++ {
		if j != i {
			seeds = append(seeds, fmt.Sprintf("%s:%d", routerHost(j), gossipPort))
		}
	}
	args := []string{c.bin, "router", "--name", routerName(i), "--region", region,
		"--listen", fmt.Sprintf("%s:%d", routerIP(i), apiPort),
		"--gossip-bind", fmt.Sprintf("%s:%d", routerIP(i), gossipPort),
		"--join", strings.Join(seeds, ","),
		"--gossip-key-file", filepath.Join(c.dir, "gossip.key"),
		"--health-interval", "500ms", "--gossip-profile", "lan", "--log-level", "info"}
	for _, k := range c.declares[i] {
		args = append(args, "--replica", replicaURL(k))
	}
	if c.flags["failed-peer-timeout"] {
		args = append(args, "--failed-peer-timeout", failedPeerTimeout.String())
	}
	if c.flags["drain-timeout"] {
		args = append(args, "--drain-timeout", "20s")
	}
	if c.flags["admin-listen"] {
		args = append(args, "--admin-listen", fmt.Sprintf("%s:%d", routerIP(i), adminPort))
	}
	return args
}

func (c *cluster) startRouter(i int) error {
	p := c.routers[i]
	p.args = c.routerArgs(i)
	return p.start()
}

func (c *cluster) startAll() error {
	for k := 1; k <= numReplicas; k++ {
		if err := c.replicas[k].start(); err != nil {
			return err
		}
	}
	for i := 1; i <= numRouters; i++ {
		if err := c.startRouter(i); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) stopAll() {
	for _, p := range append(c.routers[1:], c.replicas[1:]...) {
		if p.running() {
			if p.paused {
				_, _ = p.signal(syscall.SIGCONT, 0)
			}
			_, _ = p.signal(syscall.SIGKILL, 5*time.Second)
		}
	}
}

// debugBase is where router i serves /debug/mesh.
func (c *cluster) debugBase(i int) string {
	if c.flags["admin-listen"] {
		return fmt.Sprintf("http://%s:%d", routerIP(i), adminPort)
	}
	return routerAPI(i)
}

type memberView struct {
	Name  string `json:"name"`
	State string `json:"state"`
}

type replicaView struct {
	ID         string   `json:"id"`
	Owner      string   `json:"owner"`
	DeclaredBy []string `json:"declared_by"`
	Healthy    bool     `json:"healthy"`
	Epoch      uint64   `json:"summary_epoch"`
	Version    uint64   `json:"summary_version"`
	Owned      bool     `json:"owned"`
}

type meshView struct {
	Name     string        `json:"name"`
	Members  []memberView  `json:"members"`
	Replicas []replicaView `json:"replicas"`
}

func (v *meshView) replica(id string) *replicaView {
	for i := range v.Replicas {
		if v.Replicas[i].ID == id {
			return &v.Replicas[i]
		}
	}
	return nil
}

func (v *meshView) alive(name string) bool {
	for _, m := range v.Members {
		if m.Name == name {
			return m.State == "alive"
		}
	}
	return false
}

func (c *cluster) view(i int) (*meshView, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.debugBase(i)+"/debug/mesh", nil)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("r%d /debug/mesh: %s", i, resp.Status)
	}
	var v meshView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, fmt.Errorf("r%d /debug/mesh: %w", i, err)
	}
	return &v, nil
}

// liveDeclarers lists the running, unstopped routers declaring replica k.
func (c *cluster) liveDeclarers(k int) []string {
	var out []string
	for i := 1; i <= numRouters; i++ {
		if c.routers[i].up() && slices.Contains(c.declares[i], k) {
			out = append(out, routerName(i))
		}
	}
	return out
}

// converged checks every live router's view against the processes as they
// are: live routers alive and the others not; each replica with a live
// declarer owned by one of them, the same owner everywhere, healthy exactly
// when its process is up, and declared by no live router that does not
// declare it; a replica with no live declarer absent or unowned and
// unhealthy (out of the candidate list).
func (c *cluster) converged() error {
	owners := map[int]string{}
	for i := 1; i <= numRouters; i++ {
		if !c.routers[i].up() {
			continue
		}
		v, err := c.view(i)
		if err != nil {
			return err
		}
		for j := 1; j <= numRouters; j++ {
			if want := c.routers[j].up(); v.alive(routerName(j)) != want {
				return fmt.Errorf("r%d sees r%d alive=%v, want %v", i, j, !want, want)
			}
		}
		for k := 1; k <= numReplicas; k++ {
			live := c.liveDeclarers(k)
			rv := v.replica(replicaURL(k))
			if len(live) == 0 {
				if rv != nil && (rv.Owner != "" || rv.Healthy) {
					return fmt.Errorf("r%d: p%d has no live declarer but owner=%q healthy=%v", i, k, rv.Owner, rv.Healthy)
				}
				continue
			}
			if rv == nil {
				return fmt.Errorf("r%d does not know p%d", i, k)
			}
			if !slices.Contains(live, rv.Owner) {
				return fmt.Errorf("r%d: p%d owner %q not among live declarers %v", i, k, rv.Owner, live)
			}
			if o, ok := owners[k]; ok && o != rv.Owner {
				return fmt.Errorf("routers disagree on p%d's owner: %s vs %s", k, o, rv.Owner)
			}
			owners[k] = rv.Owner
			if want := c.replicas[k].up(); rv.Healthy != want {
				return fmt.Errorf("r%d: p%d healthy=%v, want %v", i, k, rv.Healthy, want)
			}
			for _, d := range rv.DeclaredBy {
				j, _ := strconv.Atoi(strings.TrimPrefix(d, "r"))
				if j >= 1 && j <= numRouters && c.routers[j].up() && !slices.Contains(c.declares[j], k) {
					return fmt.Errorf("r%d: p%d declared_by %v keeps %s, which does not declare it", i, k, rv.DeclaredBy, d)
				}
			}
		}
	}
	return nil
}

// waitFor polls check every 200 ms until it returns nil or bound passes;
// it returns the time taken and the last error.
func waitFor(bound time.Duration, check func() error) (time.Duration, error) {
	t0 := time.Now()
	var err error
	for time.Since(t0) < bound {
		if err = check(); err == nil {
			return time.Since(t0), nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(t0), fmt.Errorf("not within %s: %w", bound, err)
}

// healthz asks router i for /healthz and times the answer.
func (c *cluster) healthz(i int) (time.Duration, error) {
	t0 := time.Now()
	resp, err := c.http.Get(routerAPI(i) + "/healthz")
	if err != nil {
		return time.Since(t0), err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return time.Since(t0), errors.New(resp.Status)
	}
	return time.Since(t0), nil
}

// ready reports an error unless router i's /readyz answers 200.
func (c *cluster) ready(i int) error {
	resp, err := c.http.Get(routerAPI(i) + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// nft loads an nftables script in namespace ns.
func nft(ns, script string) error {
	cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("nft in %s: %w: %s\n%s", ns, err, out, script)
	}
	return nil
}

// faultTable is the suite's nftables table; clearFaults deletes it.
const faultTable = "table inet kvf"

// partition drops all traffic between the routers of side a and those of b.
func (c *cluster) partition(a, b []int) error {
	ips := func(side []int) string {
		var s []string
		for _, i := range side {
			s = append(s, routerIP(i))
		}
		return strings.Join(s, ", ")
	}
	for _, pair := range [][2][]int{{a, b}, {b, a}} {
		for _, i := range pair[0] {
			script := fmt.Sprintf(`%s {
  chain in { type filter hook input priority 0; ip saddr { %s } drop; }
  chain out { type filter hook output priority 0; ip daddr { %s } drop; }
}
`, faultTable, ips(pair[1]), ips(pair[1]))
			if err := nft(routerNS(i), script); err != nil {
				return err
			}
		}
	}
	return nil
}

// loss drops udpPct % of UDP (gossip) and tcpPct % of TCP packets arriving
// at every router. (tc netem would also delay; this kernel has no netem.)
func (c *cluster) loss(udpPct, tcpPct int) error {
	for i := 1; i <= numRouters; i++ {
		script := fmt.Sprintf(`%s {
  chain in { type filter hook input priority 0;
    meta l4proto udp numgen random mod 100 < %d drop
    meta l4proto tcp numgen random mod 100 < %d drop
  }
}
`, faultTable, udpPct, tcpPct)
		if err := nft(routerNS(i), script); err != nil {
			return err
		}
	}
	return nil
}

func (c *cluster) clearFaults() {
	for i := 1; i <= numRouters; i++ {
		_ = exec.Command("ip", "netns", "exec", routerNS(i), "nft", "delete", "table", "inet", "kvf").Run()
	}
}

// rssSampler records each router's peak VmRSS while it runs.
type rssSampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak map[string]int64 // kB
}

func (c *cluster) sampleRSS() *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{}), peak: map[string]int64{}}
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			for i := 1; i <= numRouters; i++ {
				p := c.routers[i]
				if kb := p.rssKB(); kb > 0 {
					s.mu.Lock()
					s.peak[p.name] = max(s.peak[p.name], kb)
					s.mu.Unlock()
				}
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// finish stops sampling and returns the highest peak (MB) and whose.
func (s *rssSampler) finish() (float64, string) {
	close(s.stop)
	<-s.done
	var best int64
	var who string
	names := make([]string, 0, len(s.peak))
	for n := range s.peak {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if s.peak[n] > best {
			best, who = s.peak[n], n
		}
	}
	return float64(best) / 1024, who
}

// generations counts, over every replica's id log, how many times each
// request id was accepted for generation.
func (c *cluster) generations() (map[string]int, error) {
	counts := map[string]int{}
	for k := 1; k <= numReplicas; k++ {
		f, err := os.Open(filepath.Join(c.dir, fmt.Sprintf("p%d.ids", k)))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			counts[sc.Text()]++
		}
		f.Close()
	}
	return counts, nil
}
