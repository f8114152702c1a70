package main

import (
	"context"
	"encoding/json"
	"github.com/kvmesh/kvmesh/internal/lab/replicasim"
	"github.com/prometheus/client_golang/prometheus"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/kvmesh/kvmesh/internal/kvevents"
	"github.com/kvmesh/kvmesh/mesh"
	"github.com/kvmesh/kvmesh/proxy"
	"github.com/kvmesh/kvmesh/proxy/admit"
	"github.com/kvmesh/kvmesh/summary"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
)

// exampleFiles are the monitoring examples whose metric names must exist.
var exampleFiles = []string{
	"../../examples/grafana/kvmesh-dashboard.json",
	"../../examples/prometheus/kvmesh-alerts.yml",
}

// TestRouterStatusAndExampleMetrics runs two routers in one mesh, sends a
// request through each, then checks that GET / serves the status page
// with both routers, and that every kvmesh_* metric (and label) the
// Grafana dashboard and the alert rules name is in a router's registry.
func TestRouterStatusAndExampleMetrics(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var hits sync.Map
	var reps []*httptest.Server
	for _, n := range []string{"s1", "s2"} {
		reps = append(reps, e2eReplica(n, &hits))
	}
	defer func() {
		for _, s := range reps {
			s.Close()
		}
	}()
	// A replica-sim serving a LoRA adapter beside them, for the LoRA
	// series (kvmesh_replica_lora_*), which only an engine with LoRA has.
	lora, err := replicasim.New(replicasim.Config{Model: "lora-base", LoRAAdapters: []string{"lora-x"}, TimeScale: 1000, DefaultMaxTokens: 4},
		hclog.NewNullLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	loraSrv := httptest.NewServer(lora.Handler())
	defer func() {
		_ = lora.Close()
		loraSrv.Close()
	}()
	logs := &lockedWriter{}
	base := routerConfig{
		region: "local", listen: "127.0.0.1:0", gossipBind: "127.0.0.1:0", logLevel: hclog.Warn, logOutput: logs,
		maxBodyBytes: proxy.DefaultMaxBodyBytes, capacityBlocks: 4096, loadFactor: 1.25,
		timing: mesh.TestTiming(), healthInterval: 50 * time.Millisecond, contract: summary.DefaultContract(), gossipKey: testGossipKey,
		adminListen: "127.0.0.1:0", admission: admit.Config{MaxWaiting: admit.DefaultMaxWaiting}, tenants: tenantConfig{input: 1 << 40, window: time.Minute},
	}
	ca := base
	ca.name, ca.replicas = "a", []string{reps[0].URL, loraSrv.URL}
	// Router a follows a KV-event publisher for its replica, so that the
	// kvmesh_kv_event* families the README names have series.
	kvln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pub := kvevents.NewPublisher(kvln, nil, "kv-events", kvevents.FormMap, 16)
	defer pub.Close()
	ca.kvEvents.given = map[string]kvevents.Config{reps[0].URL: {Endpoint: "tcp://" + kvln.Addr().String(), Topic: "kv-events"}}
	a, err := startRouter(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	cb := base
	cb.name, cb.replicas, cb.join = "b", []string{reps[1].URL}, []string{a.mesh.GossipAddr()}
	b, err := startRouter(ctx, cb)
	if err != nil {
		a.shutdown()
		t.Fatal(err)
	}
	routers := []*router{a, b}
	defer func() {
		for _, r := range routers {
			if err := r.shutdown(); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}
		if t.Failed() {
			t.Log(logs.String())
		}
	}()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	for _, r := range routers {
		eventually(t, "both routers to see both replicas", func() bool {
			return len(r.mesh.Candidates("m", nil)) == 2 && r.health.Ready()
		})
	}
	eventually(t, "a to see the LoRA adapter", func() bool { return len(a.mesh.Candidates("lora-x", nil)) == 1 })
	resp, err := client.Post(a.api+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"lora-x","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the adapter's request: status %d", resp.StatusCode)
	}
	for _, r := range routers {
		resp, err := client.Post(r.api+"/v1/chat/completions", "application/json", strings.NewReader(chatRequest("hello from "+r.name)))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", r.name, resp.StatusCode)
		}
	}

	t.Run("status page", func(t *testing.T) {
		for _, r := range routers {
			admin := "http://" + r.adminLn.Addr().String()
			resp, err := client.Get(admin + "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
				t.Fatalf("%s: GET / status %d, %s", r.name, resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			for _, want := range []string{`data-member="a" data-state="alive"`, `data-member="b" data-state="alive"`,
				`data-replica="` + reps[0].URL + `"`, `data-replica="` + reps[1].URL + `"`, `data-reason="prefix"`} {
				if !strings.Contains(string(body), want) {
					t.Errorf("%s: the status page lacks %s", r.name, want)
				}
			}
			// The API port serves no status page, and the rest of the
			// admin address is still the proxy's.
			resp, err = client.Get(r.api + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 404 {
				t.Errorf("%s: GET / on the API: %d, want 404", r.name, resp.StatusCode)
			}
			resp, err = client.Get(admin + "/nothing-here")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 404 {
				t.Errorf("%s: GET /nothing-here: %d, want the proxy's 404", r.name, resp.StatusCode)
			}
		}
	})

	t.Run("example metrics exist", func(t *testing.T) {
		// kvmesh_gossip_streams_refused_total has no series until a
		// stream is refused: announce an oversized encrypted frame.
		refuseGossipStream(t, a.mesh.GossipAddr())
		var refs []metricRef
		for _, f := range exampleFiles {
			refs = append(refs, exampleRefs(t, f)...)
		}
		if len(refs) < 10 {
			t.Fatalf("only %d metric references found in the examples", len(refs))
		}
		// Some series appear only after gossip has run for a while
		// (summary ages, message counts): wait for them, bounded.
		var known map[string]familyInfo
		for range 250 {
			known = gatherFamilies(t, routers)
			if len(checkRefs(refs, known)) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		for _, problem := range checkRefs(refs, known) {
			t.Error(problem)
		}
		// The README's metrics table lists exactly the registry's kvmesh_*
		// families.
		readme, err := os.ReadFile("../../README.md")
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]bool{}
		for _, n := range metricName.FindAllString(string(readme), -1) {
			listed[n] = true
			if _, ok := known[n]; !ok {
				t.Errorf("README.md names %s, which is not in the router's registry", n)
			}
		}
		for n := range known {
			if strings.HasPrefix(n, "kvmesh_") && !listed[n] {
				t.Errorf("README.md does not list %s", n)
			}
		}
	})

	// The status page reads the newer families by name too: each shows
	// once the live registry has it (the refused stream above included).
	t.Run("status page shows the newer figures", func(t *testing.T) {
		want := []string{`id="prediction"`, `data-pred-count="`, `data-forgotten="`, `data-rejected="none"`,
			`data-engine-running="0"`, `data-full-copies="new_peer"`, `data-stream-refused="frame_too_large"`,
			`data-admission-queued="high 0 · normal 0 · low 0"`}
		var body string
		missing := want
		for range 250 {
			resp, err := client.Get("http://" + a.adminLn.Addr().String() + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body, missing = string(b), nil
			for _, w := range want {
				if !strings.Contains(body, w) {
					missing = append(missing, w)
				}
			}
			if len(missing) == 0 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("the status page lacks %q:\n%s", missing, body)
	})
}

// refuseGossipStream opens a gossip TCP stream announcing an encrypted
// frame over memberlist's limit, which the router's stream guard refuses
// unread (reason frame_too_large).
func refuseGossipStream(t *testing.T, addr string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte{10, 0xff, 0xff, 0xff, 0xff}); err != nil { // encryptMsg, length
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, c) // until the guard closes it
}

// familyInfo is what a registry exposes of one metric family.
type familyInfo struct {
	typ    dto.MetricType
	labels map[string]map[string]bool // label name -> values seen
}

func gatherFamilies(t *testing.T, routers []*router) map[string]familyInfo {
	t.Helper()
	out := map[string]familyInfo{}
	for _, r := range routers {
		fams, err := r.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			fi, ok := out[f.GetName()]
			if !ok {
				fi = familyInfo{typ: f.GetType(), labels: map[string]map[string]bool{}}
				out[f.GetName()] = fi
			}
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if fi.labels[l.GetName()] == nil {
						fi.labels[l.GetName()] = map[string]bool{}
					}
					fi.labels[l.GetName()][l.GetValue()] = true
				}
			}
		}
	}
	return out
}

// metricRef is one use of a kvmesh_* metric in an example file.
type metricRef struct {
	file, name string
	matchers   [][3]string // label, operator, value
	grouping   []string    // labels of by (...) clauses in the same expression
}

var (
	metricName   = regexp.MustCompile(`kvmesh_[a-z0-9_]+`)
	selectorBody = regexp.MustCompile(`^\{([^}]*)\}`)
	matcher      = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?`)
	byClause     = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	// literalAlternation is a =~ value made of plain values only
	// ("a|b|c"), whose every value can be checked.
	literalAlternation = regexp.MustCompile(`^[a-zA-Z0-9_-]+(\|[a-zA-Z0-9_-]+)*$`)
)

// exampleRefs finds every kvmesh_* name in a file, with the label matchers
// right after it and the grouping labels of its expression. Grafana's JSON
// is decoded first so the expressions read as written, unescaped.
func exampleRefs(t *testing.T, path string) []metricRef {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var exprs []string
	if filepath.Ext(path) == ".json" {
		var d struct {
			Panels []struct {
				ID      int    `json:"id"`
				Type    string `json:"type"`
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
			Templating struct {
				List []struct {
					Definition string `json:"definition"`
				} `json:"list"`
			} `json:"templating"`
		}
		if err := json.Unmarshal(b, &d); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		ids := map[int]bool{}
		for _, p := range d.Panels {
			if ids[p.ID] {
				t.Errorf("%s: panel id %d repeats", path, p.ID)
			}
			ids[p.ID] = true
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", path, p.Title)
			}
			for _, tg := range p.Targets {
				exprs = append(exprs, tg.Expr)
			}
		}
		for _, v := range d.Templating.List {
			exprs = append(exprs, v.Definition)
		}
	} else {
		// Alert rules: each rule's text, from one "- alert:" to the next.
		text := string(b)
		alerts := strings.Count(text, "- alert:")
		if alerts == 0 || strings.Count(text, "expr:") != alerts {
			t.Errorf("%s: %d alerts but %d exprs", path, alerts, strings.Count(text, "expr:"))
		}
		exprs = strings.Split(text, "- alert:")
	}
	var refs []metricRef
	for _, e := range exprs {
		var grouping []string
		for _, m := range byClause.FindAllStringSubmatch(e, -1) {
			for l := range strings.SplitSeq(m[1], ",") {
				if l = strings.TrimSpace(l); l != "" {
					grouping = append(grouping, l)
				}
			}
		}
		for _, loc := range metricName.FindAllStringIndex(e, -1) {
			r := metricRef{file: filepath.Base(path), name: e[loc[0]:loc[1]], grouping: grouping}
			if sel := selectorBody.FindStringSubmatch(e[loc[1]:]); sel != nil {
				rest := sel[1]
				for strings.TrimSpace(rest) != "" {
					m := matcher.FindStringSubmatch(rest)
					if m == nil {
						t.Errorf("%s: cannot read the matchers of %s{%s}", path, r.name, sel[1])
						break
					}
					r.matchers = append(r.matchers, [3]string{m[1], m[2], m[3]})
					rest = rest[len(m[0]):]
				}
			}
			refs = append(refs, r)
		}
	}
	return refs
}

// targetLabels are added by Prometheus at scrape time, not by the router.
var targetLabels = []string{"instance", "job"}

// checkRefs lists the references that name no metric, or a label (or an
// exact label value) the metric does not have.
func checkRefs(refs []metricRef, known map[string]familyInfo) []string {
	allLabels := map[string]bool{"le": true}
	for _, fi := range known {
		for l := range fi.labels {
			allLabels[l] = true
		}
	}
	var problems []string
	for _, r := range refs {
		fi, ok := known[r.name]
		extra := []string{}
		if !ok {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if h, found := known[strings.TrimSuffix(r.name, suffix)]; found && strings.HasSuffix(r.name, suffix) && h.typ == dto.MetricType_HISTOGRAM {
					fi, ok = h, true
					if suffix == "_bucket" {
						extra = append(extra, "le")
					}
				}
			}
		}
		if !ok {
			problems = append(problems, r.file+": "+r.name+" is not in the router's registry")
			continue
		}
		for _, m := range r.matchers {
			label, op, value := m[0], m[1], m[2]
			switch {
			case slices.Contains(targetLabels, label) || slices.Contains(extra, label):
			case fi.labels[label] == nil:
				problems = append(problems, r.file+": "+r.name+" has no label "+label)
			case (op == "=" || op == "!=") && !fi.labels[label][value]:
				problems = append(problems, r.file+": "+r.name+` never has `+label+`="`+value+`"`)
			case (op == "=~" || op == "!~") && literalAlternation.MatchString(value):
				// reason=~"overflow|send_error": each alternative is a value.
				for v := range strings.SplitSeq(value, "|") {
					if !fi.labels[label][v] {
						problems = append(problems, r.file+": "+r.name+` never has `+label+`="`+v+`"`)
					}
				}
			}
		}
		for _, l := range r.grouping {
			if !allLabels[l] && !slices.Contains(targetLabels, l) {
				problems = append(problems, r.file+": grouping by "+l+", which no kvmesh metric has")
			}
		}
	}
	slices.Sort(problems)
	return slices.Compact(problems)
}

// TestKubernetesEnvNamesRouterFlags: every KVMESH_* variable the
// Kubernetes manifests set names a `kvmesh router` flag (applyEnv ignores
// the others silently, so a typo would go unnoticed).
func TestKubernetesEnvNamesRouterFlags(t *testing.T) {
	var help strings.Builder
	_, _ = parseRouterFlags([]string{"-h"}, func(string) (string, bool) { return "", false }, &help)
	files, err := filepath.Glob("../../examples/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	envName := regexp.MustCompile(`(?m)^\s*- name: KVMESH_([A-Za-z0-9_]+)\s*$`)
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range envName.FindAllStringSubmatch(string(b), -1) {
			seen++
			flag := strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))
			known := regexp.MustCompile(`(?m)^  -` + regexp.QuoteMeta(flag) + `(\s|$)`).MatchString(help.String())
			switch {
			case m[1] != strings.ToUpper(m[1]):
				t.Errorf("%s: KVMESH_%s is not upper case; applyEnv would never read it", filepath.Base(f), m[1])
			case !known:
				t.Errorf("%s: KVMESH_%s names no kvmesh router flag", filepath.Base(f), m[1])
			}
		}
	}
	if seen < 10 {
		t.Errorf("only %d KVMESH_* variables found in the manifests", seen)
	}
}

// TestCheckRefsFlagsWrongNames: the example check fails on a metric, label,
// label value or grouping the registry does not have, in either file kind.
func TestCheckRefsFlagsWrongNames(t *testing.T) {
	known := map[string]familyInfo{
		"kvmesh_summary_full_copies_total": {typ: dto.MetricType_COUNTER,
			labels: map[string]map[string]bool{"reason": {"overflow": true, "send_error": true}}},
		"kvmesh_cache_prediction_error_blocks": {typ: dto.MetricType_HISTOGRAM, labels: map[string]map[string]bool{}},
		"kvmesh_forgotten_blocks_total":        {typ: dto.MetricType_COUNTER, labels: map[string]map[string]bool{}},
	}
	tests := []struct {
		name, expr string
		want       string // in the one problem expected; "" for none
	}{
		{"all known", `sum by (job, reason) (rate(kvmesh_summary_full_copies_total{reason=~"overflow|send_error",instance=~"$instance"}[5m]))`, ""},
		{"histogram bucket", `histogram_quantile(0.9, sum by (le) (rate(kvmesh_cache_prediction_error_blocks_bucket{le!="1"}[5m])))`, ""},
		{"unknown metric", `rate(kvmesh_forgoten_blocks_total[5m])`, "kvmesh_forgoten_blocks_total is not in the router's registry"},
		{"bucket of a counter", `rate(kvmesh_forgotten_blocks_total_bucket[5m])`, "is not in the router's registry"},
		{"unknown label", `kvmesh_summary_full_copies_total{cause="overflow"}`, "has no label cause"},
		{"unknown value", `kvmesh_summary_full_copies_total{reason="overflw"}`, `never has reason="overflw"`},
		{"unknown negated value", `kvmesh_summary_full_copies_total{reason!="overflw"}`, `never has reason="overflw"`},
		{"unknown value in an alternation", `kvmesh_summary_full_copies_total{reason=~"overflow|backpressure"}`, `never has reason="backpressure"`},
		{"regex not checked", `kvmesh_summary_full_copies_total{reason=~"over.*"}`, ""},
		{"unknown grouping", `sum by (peer) (kvmesh_forgotten_blocks_total)`, "grouping by peer"},
	}
	for _, tc := range tests {
		for _, kind := range []string{"json", "yml"} {
			t.Run(tc.name+"/"+kind, func(t *testing.T) {
				path := filepath.Join(t.TempDir(), "example."+kind)
				var body []byte
				if kind == "json" {
					body, _ = json.Marshal(map[string]any{"panels": []any{map[string]any{"id": 1, "type": "timeseries", "title": "p",
						"targets": []any{map[string]any{"expr": tc.expr}}}}})
				} else {
					body = []byte("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: >-\n          " + tc.expr + "\n")
				}
				if err := os.WriteFile(path, body, 0o600); err != nil {
					t.Fatal(err)
				}
				problems := checkRefs(exampleRefs(t, path), known)
				switch {
				case tc.want == "" && len(problems) != 0:
					t.Errorf("problems %q, want none", problems)
				case tc.want != "" && (len(problems) != 1 || !strings.Contains(problems[0], tc.want)):
					t.Errorf("problems %q, want one with %q", problems, tc.want)
				}
			})
		}
	}
}
