package status

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/mesh"
	dto "github.com/prometheus/client_model/go"
)

// Geometry of the inline SVG.
const (
	barWidth   = 120 // px of a full bar
	sparkWidth = 160
	sparkHigh  = 28
)

// view is everything the template shows, already formatted: the template
// only places strings (html/template escapes them).
type view struct {
	Router, Region, Generated string
	RefreshSeconds            int
	Problems                  []string

	Members      []memberRow
	MembersAlive int

	Replicas        []replicaRow
	ReplicasHealthy int
	ReplicasStale   int
	// gossiped is the engine load the owners of other routers' replicas
	// gossip (mesh.ReplicaDebug), for the rows this router's own health
	// checks do not cover.
	gossiped map[string]mesh.ReplicaDebug

	HasMetrics bool
	Window     string // span of the recent figures; "" before the second sample

	Decisions       []decisionRow
	DecisionsTotal  string
	DecisionsRecent string
	DecisionSpark   spark

	Cache    cacheView
	PredErr  predErrView
	TTFT     []ttftRow
	Gossip   gossipView
	Requests string
	Retries  string

	// Rejected lists the edge's refusals by reason (nonzero ones);
	// HasRejected says the router counts them at all.
	Rejected    []countRow
	HasRejected bool
	// HasEngines says some replica's engine reported its load here.
	HasEngines bool
	Admission  admissionView
	Tenants    tenantsView  // tenants.go
	KVEvents   []kvEventRow // kvevents.go
	Lifecycle  lifecycleView
}

type memberRow struct {
	Name, Region, State, API, Addr, RTT string
	Self, Alive                         bool
	Bar                                 string // px
}

type replicaRow struct {
	ID, Owner, DeclaredBy, Models string
	Role                          string // prefill or decode ("": a whole replica, "both")
	Health, HealthClass           string
	InFlight, Pending             string
	LoadBar                       string // px
	Summary, Age, AgeClass        string
	Owned, Warming                bool
	// Engine is the replica's engine as this router's health checks
	// last read it (HasEngine false: not checked here).
	Engine engineCell
	LoRA   loraCell // its LoRA adapters (lora.go)
}

// engineCell is one replica's engine load: requests running and waiting
// against its slots, drawn as one bar (running, then waiting after it).
type engineCell struct {
	HasEngine               bool
	Gossiped                bool   // another router's replica: as its owner gossips it
	Running, Waiting, Slots string // Slots "?" when unknown
	RunBar, WaitX, WaitBar  string // px
	Class                   string // up, warn (waiting), down (waiting and full)
	running, waiting, slots float64
}

type decisionRow struct {
	Reason, Class        string
	Total, Recent, Share string
	Bar                  string // px
	Spark                spark
}

// spark is an inline SVG polyline of a series, scaled to its maximum.
type spark struct {
	Points string
	Max    string
	Has    bool
}

type cacheView struct {
	Has                          bool
	Predicted, Reported, Prompt  string
	PredictedBar, ReportedBar    string // px
	HitRatio, PredictionError    string // since start
	RecentHit, RecentError       string // over the window
	RecentPredicted, RecentRepor string
	HitSpark                     spark
}

// countRow is a counter's value for one label value.
type ttftRow struct {
	Target, P50, P95, P99, Count string
}

type gossipView struct {
	In, Out, Queue, Resyncs, Refusals string
	Drops                             []dropRow
	// FullCopies are full summary copies sent, by reason (nonzero);
	// overflow and send_error are back-pressure and warn.
	FullCopies []countRow
	// StreamsRefused are inbound gossip streams the guard refused.
	StreamsRefused []countRow
	// DeltaPerBlock is delta bytes per log entry per peer since start,
	// RecentDeltaPerBlock over the window ("" when none).
	DeltaPerBlock, RecentDeltaPerBlock string
}

type dropRow struct {
	Reason, Count string
	Benign        bool
}

func (v *view) addMembers(ms []mesh.MemberInfo) {
	maxRTT := 1.0
	for _, m := range ms {
		maxRTT = max(maxRTT, m.RTTMs)
	}
	for _, m := range ms {
		r := memberRow{Name: m.Name, Region: m.Region, State: m.State, API: m.API, Addr: m.Addr,
			Self: m.Self, Alive: m.State == "alive", RTT: "—", Bar: "0"}
		if r.Region == "" {
			r.Region = "—"
		}
		if m.Self {
			v.Region = m.Region
		} else if m.RTTMs > 0 {
			r.RTT = fmt.Sprintf("%.1f ms", m.RTTMs)
			r.Bar = px(m.RTTMs / maxRTT)
		}
		if r.Alive {
			v.MembersAlive++
		}
		v.Members = append(v.Members, r)
	}
}

func (v *view) addReplicas(d mesh.DebugInfo, now time.Time) {
	maxLoad := 1
	for _, r := range d.Replicas {
		maxLoad = max(maxLoad, r.InFlight)
	}
	warm := warming(d.Replicas)
	for _, r := range d.Replicas {
		row := replicaRow{ID: r.ID, Owner: r.Owner, DeclaredBy: strings.Join(r.DeclaredBy, ", "),
			Models: strings.Join(r.Models, ", "), Owned: r.Owned, Role: strings.TrimPrefix(r.Role, "both"), Warming: warm[r.ID],
			InFlight: fmt.Sprint(r.InFlight), Pending: trimFloat(r.PendingPref), LoadBar: px(float64(r.InFlight) / float64(maxLoad))}
		switch {
		case r.Owner == "":
			row.Owner, row.Health, row.HealthClass = "none", "NO OWNER", "down"
		case r.Healthy:
			row.Health, row.HealthClass = "UP", "up"
			v.ReplicasHealthy++
		default:
			row.Health, row.HealthClass = "DOWN", "down"
		}
		if row.Models == "" {
			row.Models = "—"
		}
		row.Summary = "—"
		if r.Bytes > 0 {
			row.Summary = fmt.Sprintf("%s blocks · %s · v%d", humanCount(float64(r.Held)), humanBytes(float64(r.Bytes)), r.Version)
		}
		switch {
		case r.Owned:
			row.Age, row.AgeClass = "own", "up"
		case r.AgeSeconds > 0 && r.Counts:
			row.Age, row.AgeClass = humanSeconds(r.AgeSeconds), "up"
		case r.AgeSeconds > 0:
			row.Age, row.AgeClass = humanSeconds(r.AgeSeconds)+" stale", "warn"
			v.ReplicasStale++
		default:
			row.Age, row.AgeClass = "never heard", "warn"
			v.ReplicasStale++
		}
		row.LoRA = loraCellOf(r)
		v.Replicas = append(v.Replicas, row)
		if !r.Owned && r.EngineRunning+r.EngineWaiting+r.EngineSlots > 0 {
			if v.gossiped == nil {
				v.gossiped = map[string]mesh.ReplicaDebug{}
			}
			v.gossiped[r.ID] = r
		}
	}
}

// reasonOrder puts the decision reasons in the order an operator reads
// them: good, tolerable, bad.
var reasonOrder = []string{"prefix", "previous-response", "load", "pd-decode", "spill", "rehint", "fallback-cold", "fallback-stale", "none"}

func reasonClass(r string) string {
	switch r {
	case "prefix", "previous-response":
		return "up"
	case "spill", "fallback-stale", "rehint":
		return "warn"
	case "none":
		return "down"
	}
	return "info"
}

// addMetrics fills the decision, cache, latency and gossip sections from
// the current sample, the history before it and the gathered families.
func (v *view) addMetrics(cur sample, older []sample, fams []*dto.MetricFamily) {
	v.HasMetrics = true
	base, ok := baseline(older, cur.at)
	if ok {
		v.Window = humanSeconds(cur.at.Sub(base.at).Seconds())
	}
	series := append(slices.Clone(older), cur)

	// Decisions by reason.
	reasons := make([]string, 0, len(cur.decisions))
	for r := range cur.decisions {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		a, b := orderOf(reasons[i]), orderOf(reasons[j])
		if a != b {
			return a < b
		}
		return reasons[i] < reasons[j]
	})
	total := cur.decisionsTotal()
	v.DecisionsTotal = humanCount(total)
	recentTotal := 0.0
	if ok {
		recentTotal = cur.decisionsTotal() - base.decisionsTotal()
		v.DecisionsRecent = humanCount(recentTotal)
	}
	for _, r := range reasons {
		row := decisionRow{Reason: r, Class: reasonClass(r), Total: humanCount(cur.decisions[r]), Recent: "—", Share: "—", Bar: "0"}
		share, n := cur.decisions[r], total
		if ok {
			share, n = cur.decisions[r]-base.decisions[r], recentTotal
			row.Recent = humanCount(share)
		}
		if n > 0 {
			row.Share = pct(share / n)
			row.Bar = px(share / n)
		}
		row.Spark = sparkOf(series, func(a, b sample) (float64, bool) {
			dt := b.at.Sub(a.at).Seconds()
			return (b.decisions[r] - a.decisions[r]) / dt, dt > 0
		})
		row.Spark.Has = row.Spark.Has && row.Spark.Max != "0" // a flat zero says nothing
		v.Decisions = append(v.Decisions, row)
	}
	v.DecisionSpark = sparkOf(series, func(a, b sample) (float64, bool) {
		dt := b.at.Sub(a.at).Seconds()
		return (b.decisionsTotal() - a.decisionsTotal()) / dt, dt > 0
	})
	if v.DecisionSpark.Has {
		v.DecisionSpark.Max += "/s"
	}

	// Predicted against reported cached tokens, and the hit ratio.
	c := cacheView{Has: true, Predicted: humanCount(cur.predicted), Reported: humanCount(cur.reported), Prompt: humanCount(cur.prompt),
		HitRatio: "—", PredictionError: "—", RecentHit: "—", RecentError: "—", RecentPredicted: "—", RecentRepor: "—"}
	top := max(cur.predicted, cur.reported, 1)
	c.PredictedBar, c.ReportedBar = px(cur.predicted/top), px(cur.reported/top)
	if cur.prompt > 0 {
		c.HitRatio = pct(cur.reported / cur.prompt)
	}
	if cur.predicted > 0 {
		c.PredictionError = signedPct((cur.predicted - cur.reported) / cur.predicted)
	}
	if ok {
		dp, dr, dq := cur.predicted-base.predicted, cur.reported-base.reported, cur.prompt-base.prompt
		c.RecentPredicted, c.RecentRepor = humanCount(dp), humanCount(dr)
		if dq > 0 {
			c.RecentHit = pct(dr / dq)
		}
		if dp > 0 {
			c.RecentError = signedPct((dp - dr) / dp)
		}
	}
	c.HitSpark = sparkOf(series, func(a, b sample) (float64, bool) {
		dq := b.prompt - a.prompt
		return 100 * (b.reported - a.reported) / dq, dq > 0
	})
	if c.HitSpark.Has {
		c.HitSpark.Max += " %"
	}
	v.Cache = c

	// Time to first byte, recent when there is history.
	targets := make([]string, 0, len(cur.ttft))
	for t := range cur.ttft {
		targets = append(targets, t)
	}
	slices.Sort(targets)
	for _, t := range targets {
		h := cur.ttft[t]
		if ok {
			if b, found := base.ttft[t]; found {
				h = h.sub(b)
			}
		}
		row := ttftRow{Target: t, Count: humanCount(h.count), P50: "—", P95: "—", P99: "—"}
		if q, ok := h.quantile(0.5); ok {
			row.P50 = humanSeconds(q)
		}
		if q, ok := h.quantile(0.95); ok {
			row.P95 = humanSeconds(q)
		}
		if q, ok := h.quantile(0.99); ok {
			row.P99 = humanSeconds(q)
		}
		v.TTFT = append(v.TTFT, row)
	}

	v.Requests = humanCount(cur.requests)
	if f := family(fams, metricRetries); f != nil {
		v.Retries = humanCount(sum(f))
	}

	// Gossip.
	g := gossipView{}
	bytes := byLabel(family(fams, metricGossipB), "direction")
	g.In, g.Out = humanBytes(bytes["in"]), humanBytes(bytes["out"])
	if f := family(fams, metricQueue); f != nil {
		g.Queue = humanCount(sum(f))
	}
	if f := family(fams, metricResyncs); f != nil {
		g.Resyncs = humanCount(sum(f))
	}
	if f := family(fams, metricRefusals); f != nil {
		g.Refusals = humanCount(sum(f))
	}
	drops := byLabel(family(fams, metricDropped), "reason")
	names := make([]string, 0, len(drops))
	for r := range drops {
		names = append(names, r)
	}
	slices.Sort(names)
	for _, r := range names {
		if drops[r] > 0 { // zeros are every reason, every time: noise
			g.Drops = append(g.Drops, dropRow{Reason: r, Count: humanCount(drops[r]), Benign: r == "duplicate"})
		}
	}
	for _, r := range nonzero(byLabel(family(fams, metricFullCopies), "reason")) {
		r.Warn = r.Reason == "overflow" || r.Reason == "send_error" // back-pressure
		g.FullCopies = append(g.FullCopies, r)
	}
	for _, r := range nonzero(byLabel(family(fams, metricStreamRefused), "reason")) {
		r.Warn = true
		g.StreamsRefused = append(g.StreamsRefused, r)
	}
	if cur.deltaEntries > 0 {
		g.DeltaPerBlock = trimFloat(cur.deltaBytes / cur.deltaEntries)
	}
	if ok && cur.deltaEntries > base.deltaEntries {
		g.RecentDeltaPerBlock = trimFloat((cur.deltaBytes - base.deltaBytes) / (cur.deltaEntries - base.deltaEntries))
	}
	v.Gossip = g

	// The edge's refusals.
	if f := family(fams, metricRejected); f != nil {
		v.HasRejected = true
		for _, r := range nonzero(byLabel(f, "reason")) {
			r.Warn = true
			v.Rejected = append(v.Rejected, r)
		}
	}

	// Prediction error in blocks, recent when there is history.
	pe := cur.predErr
	if ok {
		pe = pe.sub(base.predErr)
	}
	v.PredErr = predErrOf(pe)
	v.PredErr.Forgotten = humanCount(cur.forgotten)
	if ok {
		v.PredErr.RecentForgotten = humanCount(cur.forgotten - base.forgotten)
	}

	v.addEngines(fams)
	v.addKVEvents(fams)
	v.addAdmission(fams)
	v.addLifecycle(fams)
}

// nonzero lists the nonzero counts by label value, sorted by value: zeros
// are every initialised reason, every time.
func nonzero(counts map[string]float64) []countRow {
	names := make([]string, 0, len(counts))
	for r, n := range counts {
		if n > 0 {
			names = append(names, r)
		}
	}
	slices.Sort(names)
	out := make([]countRow, 0, len(names))
	for _, r := range names {
		out = append(out, countRow{Reason: r, Count: humanCount(counts[r])})
	}
	return out
}

// Geometry of the prediction-error histogram.
const (
	histCol    = 34 // px per bucket
	histBarsH  = 60 // px of the tallest bar
	histTop    = 4
	histLabelY = histTop + histBarsH + 12
)

// addEngines puts each replica's engine load (kvmesh_replica_engine_*,
// set by this router's health checks of the replicas it declares) on
// its row.
func (v *view) addEngines(fams []*dto.MetricFamily) {
	reqs, slots := family(fams, metricEngineReqs), family(fams, metricEngineSlots)
	if reqs == nil && slots == nil && len(v.gossiped) == 0 {
		return
	}
	cells := map[string]*engineCell{}
	cell := func(id string) *engineCell {
		if cells[id] == nil {
			cells[id] = &engineCell{HasEngine: true}
		}
		return cells[id]
	}
	if reqs != nil {
		for _, m := range reqs.GetMetric() {
			switch c := cell(label(m, "replica")); label(m, "state") {
			case "running":
				c.running += value(m)
			case "waiting":
				c.waiting += value(m)
			}
		}
	}
	if slots != nil {
		for _, m := range slots.GetMetric() {
			cell(label(m, "replica")).slots += value(m)
		}
	}
	// Another router's replica: its owner's figures, as gossiped.
	for id, r := range v.gossiped {
		if cells[id] == nil {
			cells[id] = &engineCell{HasEngine: true, Gossiped: true,
				running: float64(r.EngineRunning), waiting: float64(r.EngineWaiting), slots: float64(r.EngineSlots)}
		}
	}
	// Bars are against the slots when known, else the busiest engine.
	scale := 1.0
	for _, c := range cells {
		scale = max(scale, c.running+c.waiting)
	}
	for i := range v.Replicas {
		c := cells[v.Replicas[i].ID]
		if c == nil {
			continue
		}
		v.HasEngines = true
		c.Running, c.Waiting, c.Slots = trimFloat(c.running), trimFloat(c.waiting), "?"
		full := scale
		if c.slots > 0 {
			c.Slots, full = trimFloat(c.slots), max(c.slots, c.running+c.waiting)
		}
		run := min(c.running/full, 1) * barWidth
		wait := min(c.waiting/full, 1) * barWidth
		wait = min(wait, barWidth-run)
		c.RunBar, c.WaitX, c.WaitBar = fmt.Sprintf("%.1f", run), fmt.Sprintf("%.1f", run), fmt.Sprintf("%.1f", wait)
		switch {
		case c.waiting > 0 && c.slots > 0 && c.running >= c.slots:
			c.Class = "down"
		case c.waiting > 0:
			c.Class = "warn"
		default:
			c.Class = "up"
		}
		v.Replicas[i].Engine = *c
	}
}

// baseline is the oldest sample within recentWindow of now.
func baseline(older []sample, now time.Time) (sample, bool) {
	for _, s := range older {
		if now.Sub(s.at) <= recentWindow && now.After(s.at) {
			return s, true
		}
	}
	return sample{}, false
}

func orderOf(r string) int {
	if i := slices.Index(reasonOrder, r); i >= 0 {
		return i
	}
	return len(reasonOrder)
}

// sparkOf draws f over consecutive pairs of samples; pairs where f is
// undefined are left out.
func sparkOf(series []sample, f func(a, b sample) (float64, bool)) spark {
	var ys []float64
	for i := 1; i < len(series); i++ {
		if y, ok := f(series[i-1], series[i]); ok && !math.IsNaN(y) && !math.IsInf(y, 0) {
			ys = append(ys, max(y, 0))
		}
	}
	if len(ys) < 2 {
		return spark{}
	}
	top := slices.Max(ys)
	scale := 1.0
	if top > 0 {
		scale = 1 / top
	}
	var b strings.Builder
	step := float64(sparkWidth-2) / float64(len(ys)-1)
	for i, y := range ys {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%.1f,%.1f", 1+float64(i)*step, float64(sparkHigh-2)-y*scale*float64(sparkHigh-4))
	}
	return spark{Points: b.String(), Max: trimFloat(top), Has: true}
}

// px is a bar's width for a fraction of a full bar.
func px(frac float64) string {
	if math.IsNaN(frac) || frac < 0 {
		frac = 0
	}
	return fmt.Sprintf("%.1f", min(frac, 1)*barWidth)
}

func pct(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

func signedPct(f float64) string { return fmt.Sprintf("%+.1f %%", 100*f) }

func trimFloat(f float64) string {
	switch {
	case f == math.Trunc(f) && math.Abs(f) < 1e15:
		return fmt.Sprintf("%.0f", f)
	case math.Abs(f) >= 100:
		return fmt.Sprintf("%.0f", f)
	case math.Abs(f) >= 10:
		return fmt.Sprintf("%.1f", f)
	}
	return fmt.Sprintf("%.2f", f)
}

func humanCount(f float64) string {
	a := math.Abs(f)
	switch {
	case a >= 1e9:
		return fmt.Sprintf("%.2fG", f/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.2fM", f/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.1fk", f/1e3)
	}
	return trimFloat(f)
}

func humanBytes(f float64) string {
	switch {
	case f >= 1<<30:
		return fmt.Sprintf("%.1f GiB", f/(1<<30))
	case f >= 1<<20:
		return fmt.Sprintf("%.1f MiB", f/(1<<20))
	case f >= 1<<10:
		return fmt.Sprintf("%.1f KiB", f/(1<<10))
	}
	return fmt.Sprintf("%.0f B", f)
}

func humanSeconds(s float64) string {
	switch {
	case s < 1:
		return fmt.Sprintf("%.0f ms", s*1000)
	case s < 60:
		return fmt.Sprintf("%.1f s", s)
	}
	return (time.Duration(s) * time.Second).Round(time.Second).String()
}
