// Command flood measures a real `kvmesh router` process under the floods
// of issue 8: N connections that send a request's headers and then a body
// byte every few seconds, 100 requests announcing 16 MB bodies that never
// come, and 60 gossip TCP streams announcing 20 MB encrypted frames from
// a stranger without the key. It reports the router's RSS (now and peak,
// from /proc) and /healthz latency while the floods hold.
//
//	go build -o /tmp/kvmesh ./cmd/kvmesh
//	go run ./internal/lab/e2e/flood --kvmesh /tmp/kvmesh --slow 10000 -- --max-inflight-per-client 0 --max-conns 12000
//
// Arguments after -- go to `kvmesh router`. Linux only (reads /proc);
// raise `ulimit -n` above twice --slow.
package main

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// rss reads VmRSS and VmHWM (peak) of pid in MB.
func rss(pid int) (now, peak float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			now = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		}
	}
	return now, peak
}

func run() error {
	bin := flag.String("kvmesh", "kvmesh", "the kvmesh binary")
	slow := flag.Int("slow", 10000, "slow-body connections")
	announce := flag.Int("announce", 100, "connections announcing a 16 MB body")
	gossip := flag.Int("gossip", 60, "gossip streams announcing a 20 MB encrypted frame")
	hold := flag.Duration("hold", 20*time.Second, "how long to hold the floods while measuring")
	flag.Parse()

	apiPort, err := freePort()
	if err != nil {
		return err
	}
	gossipPort, err := freePort()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kvmesh-flood")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	keyFile := filepath.Join(dir, "gossip.key")
	if err := os.WriteFile(keyFile, []byte("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n"), 0o600); err != nil {
		return err
	}
	adminPort, err := freePort()
	if err != nil {
		return err
	}
	admin := fmt.Sprintf("127.0.0.1:%d", adminPort)
	api := fmt.Sprintf("127.0.0.1:%d", apiPort)
	gossipAddr := fmt.Sprintf("127.0.0.1:%d", gossipPort)
	args := append([]string{"router", "--name", "flood", "--listen", api, "--gossip-bind", gossipAddr,
		"--admin-listen", admin, "--gossip-key-file", keyFile, "--log-level", "error"}, flag.Args()...)
	cmd := exec.Command(*bin, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pid := cmd.Process.Pid

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	healthz := func() (time.Duration, error) {
		t0 := time.Now()
		resp, err := client.Get("http://" + api + "/healthz")
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("/healthz %d", resp.StatusCode)
		}
		return time.Since(t0), nil
	}
	for i := 0; ; i++ {
		if _, err := healthz(); err == nil {
			break
		}
		if i == 100 {
			return fmt.Errorf("router never answered /healthz")
		}
		time.Sleep(100 * time.Millisecond)
	}
	base, _ := rss(pid)
	fmt.Printf("router pid %d, flags %q, RSS at start %.0f MB\n", pid, flag.Args(), base)

	var (
		mu       sync.Mutex
		conns    []net.Conn
		closedBy atomic.Int64 // connections the router answered or closed
		answers  sync.Map     // status line -> count
	)
	watch := func(c net.Conn) {
		// Whatever the router answers (408, 429, 503) or a close ends it.
		line, err := bufio.NewReader(c).ReadString('\n')
		closedBy.Add(1)
		key := strings.TrimSpace(line)
		if err != nil && key == "" {
			key = "closed"
		}
		n, _ := answers.LoadOrStore(key, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	}
	open := func(addr, head string) (net.Conn, error) {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return nil, err
		}
		if _, err := io.WriteString(c, head); err != nil {
			c.Close()
			return nil, err
		}
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
		return c, nil
	}
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()

	// 1. Announced 16 MB bodies.
	for range *announce {
		c, err := open(api, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 16777216\r\n\r\n{\"model\":\"m\",")
		if err != nil {
			return fmt.Errorf("announce: %w", err)
		}
		go watch(c)
	}
	// 2. Slow bodies: a byte every 5 s.
	var slowConns []net.Conn
	dialErrs := 0
	for range *slow {
		c, err := open(api, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{")
		if err != nil {
			dialErrs++
			continue
		}
		slowConns = append(slowConns, c)
		go watch(c)
	}
	stopTrickle := make(chan struct{})
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stopTrickle:
				return
			case <-t.C:
				for _, c := range slowConns {
					_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
					_, _ = c.Write([]byte(" "))
				}
			}
		}
	}()
	defer close(stopTrickle)
	// 3. Gossip streams from a stranger: 20 MB encrypted frames.
	junk := make([]byte, 1<<20)
	var gossipRefused atomic.Int64
	for range *gossip {
		c, err := open(gossipAddr, "")
		if err != nil {
			return fmt.Errorf("gossip: %w", err)
		}
		go func() {
			hdr := []byte{10, 0, 0, 0, 0}
			binary.BigEndian.PutUint32(hdr[1:], 20<<20)
			_ = c.SetWriteDeadline(time.Now().Add(*hold))
			if _, err := c.Write(hdr); err != nil {
				gossipRefused.Add(1)
				return
			}
			for range 20 {
				if _, err := c.Write(junk); err != nil {
					gossipRefused.Add(1)
					return
				}
			}
		}()
	}
	fmt.Printf("flood: %d announced 16 MB bodies, %d slow bodies (%d dials failed), %d gossip streams\n", *announce, len(slowConns), dialErrs, *gossip)

	var lat []time.Duration
	probeErrs := 0
	var peak float64
	deadline := time.Now().Add(*hold)
	for time.Now().Before(deadline) {
		d, err := healthz()
		if err != nil {
			if probeErrs++; probeErrs <= 3 {
				fmt.Println("  /healthz:", err)
			}
		} else {
			lat = append(lat, d)
		}
		_, hwm := rss(pid)
		peak = max(peak, hwm)
		time.Sleep(200 * time.Millisecond)
	}
	now, hwm := rss(pid)
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	held := len(conns) - int(closedBy.Load())
	fmt.Printf("after %v: router RSS %.0f MB now, %.0f MB peak; /healthz p50 %v p99 %v max %v, %d probe errors\n",
		*hold, now, max(peak, hwm), pct(0.5).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond), pct(1).Round(100*time.Microsecond), probeErrs)
	fmt.Printf("connections still held by the router: %d of %d; answered/closed by it: %d; gossip streams cut: %d of %d\n",
		held, len(conns), closedBy.Load(), gossipRefused.Load(), *gossip)
	if resp, err := client.Get("http://" + admin + "/metrics"); err == nil {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			for _, m := range []string{"go_memstats_heap_inuse_bytes ", "go_memstats_stack_inuse_bytes ", "go_goroutines "} {
				if strings.HasPrefix(sc.Text(), m) {
					fmt.Println("  router", sc.Text())
				}
			}
		}
		resp.Body.Close()
	}
	answers.Range(func(k, v any) bool {
		fmt.Printf("  %6d × %s\n", v.(*atomic.Int64).Load(), k)
		return true
	})
	return nil
}
