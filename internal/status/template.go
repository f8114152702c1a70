package status

import "html/template"

// pageTemplate is the whole page: inline CSS, inline SVG, no script. Rows
// carry data-* attributes so a test (or a scraper) can read the page
// without parsing its text.
var pageTemplate = template.Must(template.New("status").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{{- if .RefreshSeconds}}
<meta http-equiv="refresh" content="{{.RefreshSeconds}}">
{{- end}}
<title>kvmesh · {{.Router}}</title>
<style>
body{font:13px/1.35 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f4f5f7}
header{background:#1d2330;color:#fff;padding:10px 16px;display:flex;gap:24px;align-items:baseline;flex-wrap:wrap}
header h1{font-size:18px;margin:0}
header a{color:#9cc3ff}
main{padding:8px 16px 24px}
section{background:#fff;border:1px solid #d8dbe2;border-radius:4px;margin:12px 0;padding:8px 12px}
h2{font-size:14px;margin:2px 0 8px}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #eceef2;vertical-align:middle;white-space:nowrap}
th{background:#eef0f4;font-weight:600}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;min-width:44px;text-align:center;border-radius:3px;padding:0 6px;font-weight:600;color:#fff}
.up .badge,.badge.up{background:#2f9e44}.down .badge,.badge.down{background:#c92a2a}
.warn .badge,.badge.warn{background:#e8a100}.info .badge,.badge.info{background:#5c7cfa}
tr.down td{background:#fff0f0}tr.self td{font-weight:600}
.muted{color:#6b7280}.problem{color:#c92a2a}
svg .bar{fill:#5c7cfa}svg .bar.up{fill:#2f9e44}svg .bar.warn{fill:#e8a100}svg .bar.down{fill:#c92a2a}svg .bar.alt{fill:#a5b4fc}
svg .track{fill:#eceef2}svg .line{fill:none;stroke:#5c7cfa;stroke-width:1.5}
.grid{display:flex;gap:12px;flex-wrap:wrap}.grid>section{flex:1 1 420px}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:0}dt{color:#6b7280}dd{margin:0}
</style>
</head>
<body>
<header>
<h1 data-router="{{.Router}}">kvmesh router {{.Router}}</h1>
<span>region {{if .Region}}{{.Region}}{{else}}—{{end}}</span>
<span data-members-alive="{{.MembersAlive}}">{{.MembersAlive}}/{{len .Members}} routers alive</span>
<span>{{.ReplicasHealthy}}/{{len .Replicas}} replicas up</span>
<span class="muted">{{.Generated}}{{if .RefreshSeconds}} · refreshes every {{.RefreshSeconds}} s (<a href="?refresh=0">pause</a>){{else}} · not refreshing (<a href="?">resume</a>){{end}}</span>
<span><a href="metrics">/metrics</a> · <a href="debug/mesh">/debug/mesh</a></span>
</header>
<main>
{{- range .Problems}}
<p class="problem">{{.}}</p>
{{- end}}

<section id="members">
<h2>Routers of the mesh</h2>
<table>
<thead><tr><th>name</th><th>region</th><th>state</th><th class="num">RTT</th><th></th><th>API</th><th>gossip</th></tr></thead>
<tbody>
{{- range .Members}}
<tr class="member {{if .Alive}}up{{else}}down{{end}}{{if .Self}} self{{end}}" data-member="{{.Name}}" data-state="{{.State}}">
<td>{{.Name}}{{if .Self}} <span class="muted">(this router)</span>{{end}}</td>
<td>{{.Region}}</td>
<td><span class="badge">{{.State}}</span></td>
<td class="num">{{.RTT}}</td>
<td><svg width="120" height="8" role="img" aria-label="round-trip time"><rect class="track" width="120" height="8"/><rect class="bar" width="{{.Bar}}" height="8"/></svg></td>
<td>{{.API}}</td>
<td>{{.Addr}}</td>
</tr>
{{- else}}
<tr><td colspan="7" class="muted">no members</td></tr>
{{- end}}
</tbody>
</table>
</section>

<section id="replicas">
<h2>Replicas{{if .ReplicasStale}} <span class="badge warn">{{.ReplicasStale}} stale</span>{{end}}</h2>
<table>
<thead><tr><th>replica</th><th>health</th><th>owner</th><th>declared by</th><th>models</th><th class="num">in flight</th><th></th><th class="num">pending prefill</th><th>engine <span class="muted">running · waiting / slots</span></th>{{if .HasLoRA}}<th>LoRA adapters <span class="muted">loaded · waiting (in use / max)</span></th>{{end}}<th>summary</th><th>summary age</th></tr></thead>
<tbody>
{{- range .Replicas}}
<tr class="replica {{.HealthClass}}" data-replica="{{.ID}}" data-owner="{{.Owner}}"{{if .Role}} data-role="{{.Role}}"{{end}}>
<td>{{.ID}}{{if .Role}} <span class="badge info">{{.Role}}</span>{{end}}</td>
<td><span class="badge">{{.Health}}</span></td>
<td>{{.Owner}}{{if .Owned}} <span class="muted">(here)</span>{{end}}</td>
<td>{{.DeclaredBy}}</td>
<td>{{.Models}}</td>
<td class="num">{{.InFlight}}</td>
<td><svg width="120" height="8" role="img" aria-label="in flight"><rect class="track" width="120" height="8"/><rect class="bar" width="{{.LoadBar}}" height="8"/></svg></td>
<td class="num">{{.Pending}} blocks</td>
{{- if .Engine.HasEngine}}
<td class="engine {{.Engine.Class}}" data-engine-running="{{.Engine.Running}}" data-engine-waiting="{{.Engine.Waiting}}" data-engine-slots="{{.Engine.Slots}}"{{if .Engine.Gossiped}} data-engine-gossiped title="as its owner gossips it"{{end}}><svg width="120" height="8" role="img" aria-label="engine running and waiting"><rect class="track" width="120" height="8"/><rect class="bar up" width="{{.Engine.RunBar}}" height="8"/><rect class="bar warn" x="{{.Engine.WaitX}}" width="{{.Engine.WaitBar}}" height="8"/></svg> {{.Engine.Running}} · {{if ne .Engine.Waiting "0"}}<span class="badge {{.Engine.Class}}">{{.Engine.Waiting}}</span>{{else}}0{{end}} / {{.Engine.Slots}}{{if .Engine.Gossiped}} ↻{{end}}</td>
{{- else}}
<td class="muted">—</td>
{{- end}}
{{- if $.HasLoRA}}
{{- if .LoRA.Has}}
<td class="lora" data-lora-loaded="{{.LoRA.Loaded}}" data-lora-waiting="{{.LoRA.Waiting}}" data-lora-max="{{.LoRA.Max}}">{{if .LoRA.Loaded}}{{.LoRA.Loaded}}{{else}}<span class="muted">none</span>{{end}}{{if .LoRA.Waiting}} · <span class="badge warn">{{.LoRA.Waiting}}</span>{{end}} <span class="muted">({{.LoRA.Active}} / {{.LoRA.Max}})</span></td>
{{- else}}
<td class="muted">—</td>
{{- end}}
{{- end}}
<td>{{.Summary}}{{if .Warming}} <span class="badge warn" data-warming title="holds under half the mean of cached blocks: takes a share of the cold requests">warming</span>{{end}}</td>
<td><span class="badge {{.AgeClass}}">{{.Age}}</span></td>
</tr>
{{- else}}
<tr><td colspan="12" class="muted">no replicas known</td></tr>
{{- end}}
</tbody>
</table>
{{- if .HasEngines}}
<p class="muted">Engine figures are the replicas' own metrics, read by this router's health checks; for other routers' replicas (marked ↻), as their owners gossip them (— when no one reported them).</p>
{{- end}}
</section>
{{- if .KVEvents}}
<section id="kv-events">
<h2>KV-cache events</h2>
<table>
<thead><tr><th>replica</th><th>subscription</th><th class="num">events</th><th class="num">gaps</th><th class="num">replayed</th><th class="num">resyncs</th><th class="num">text blocks evicted</th><th class="num">lag</th></tr></thead>
<tbody>
{{- range .KVEvents}}
<tr class="{{.Class}}"><td>{{.ID}}</td><td>{{.Connected}}</td><td class="num">{{.Events}}</td><td class="num">{{.Gaps}}</td><td class="num">{{.Replayed}}</td><td class="num">{{.Resyncs}}</td><td class="num">{{.Evicted}}</td><td class="num">{{.Lag}}</td></tr>
{{- end}}
</tbody>
</table>
<p class="muted">The engines' own record of what they stored and evicted (router --kv-events). A gap is batches lost on the way (replayed when the engine keeps a replay buffer); a resync is events lost for good, after which what the replica held before falls back to prediction. Lag: the last batch's age on arrival.</p>
</section>
{{- end}}

{{- if .HasMetrics}}
<div class="grid">
<section id="decisions">
<h2>Routing decisions{{if .Window}} (last {{.Window}}){{else}} (since start){{end}}</h2>
<table>
<thead><tr><th>reason</th><th class="num">total</th><th class="num">recent</th><th class="num">share</th><th></th><th>rate</th></tr></thead>
<tbody>
{{- range .Decisions}}
<tr class="decision" data-reason="{{.Reason}}">
<td><span class="badge {{.Class}}">{{.Reason}}</span></td>
<td class="num">{{.Total}}</td>
<td class="num">{{.Recent}}</td>
<td class="num">{{.Share}}</td>
<td><svg width="120" height="10" role="img" aria-label="share"><rect class="track" width="120" height="10"/><rect class="bar {{.Class}}" width="{{.Bar}}" height="10"/></svg></td>
<td>{{if .Spark.Has}}<svg width="160" height="28" role="img" aria-label="decisions per second"><polyline class="line" points="{{.Spark.Points}}"/></svg>{{end}}</td>
</tr>
{{- end}}
<tr><td><b>all</b></td><td class="num"><b>{{.DecisionsTotal}}</b></td><td class="num">{{if .Window}}{{.DecisionsRecent}}{{else}}—{{end}}</td><td></td><td></td>
<td>{{if .DecisionSpark.Has}}<svg width="160" height="28" role="img" aria-label="decisions per second"><polyline class="line" points="{{.DecisionSpark.Points}}"/></svg> <span class="muted">max {{.DecisionSpark.Max}}</span>{{else}}<span class="muted">rates appear after two refreshes</span>{{end}}</td></tr>
</tbody>
</table>
</section>

<section id="cache">
<h2>Cached tokens: predicted by this router vs reported by the replicas</h2>
<table>
<thead><tr><th></th><th class="num">since start</th><th></th><th class="num">{{if .Window}}last {{.Window}}{{else}}recent{{end}}</th></tr></thead>
<tbody>
<tr data-cache="predicted"><td>predicted cached tokens</td><td class="num">{{.Cache.Predicted}}</td>
<td><svg width="120" height="10" role="img" aria-label="predicted"><rect class="track" width="120" height="10"/><rect class="bar alt" width="{{.Cache.PredictedBar}}" height="10"/></svg></td><td class="num">{{.Cache.RecentPredicted}}</td></tr>
<tr data-cache="reported"><td>reported cached tokens</td><td class="num">{{.Cache.Reported}}</td>
<td><svg width="120" height="10" role="img" aria-label="reported"><rect class="track" width="120" height="10"/><rect class="bar up" width="{{.Cache.ReportedBar}}" height="10"/></svg></td><td class="num">{{.Cache.RecentRepor}}</td></tr>
<tr><td>prediction error <span class="muted">(predicted − reported) / predicted</span></td><td class="num" data-prediction-error="{{.Cache.PredictionError}}">{{.Cache.PredictionError}}</td><td></td><td class="num">{{.Cache.RecentError}}</td></tr>
<tr><td>prompt tokens</td><td class="num">{{.Cache.Prompt}}</td><td></td><td></td></tr>
<tr><td>hit ratio <span class="muted">reported cached / prompt tokens</span></td><td class="num" data-hit-ratio="{{.Cache.HitRatio}}">{{.Cache.HitRatio}}</td>
<td>{{if .Cache.HitSpark.Has}}<svg width="160" height="28" role="img" aria-label="hit ratio"><polyline class="line" points="{{.Cache.HitSpark.Points}}"/></svg>{{end}}</td><td class="num">{{.Cache.RecentHit}}</td></tr>
</tbody>
</table>
</section>

{{- if .PredErr.Has}}
<section id="prediction">
<h2>Prediction error per response, in blocks{{if .Window}} (last {{.Window}}){{else}} (since start){{end}}</h2>
<p class="muted">predicted − engine-reported cached blocks; positive: the summary claimed blocks the replica no longer held</p>
<svg width="{{.PredErr.Width}}" height="84" role="img" aria-label="prediction error histogram">
<rect class="track" y="64" width="{{.PredErr.Width}}" height="1"/>
{{- if eq .PredErr.Count "0"}}
<text x="{{.PredErr.Mid}}" y="36" font-size="11" text-anchor="middle" fill="#6b7280">no response has reported cached tokens yet</text>
{{- end}}
{{- range .PredErr.Bars}}
<rect class="{{.Class}}" x="{{.X}}" y="{{.Y}}" width="{{.W}}" height="{{.H}}" data-pred-le="{{.Le}}" data-count="{{.Count}}"><title>{{.Range}} blocks: {{.Count}}</title></rect>
<text x="{{.LabelX}}" y="76" font-size="9" text-anchor="middle" fill="#6b7280">{{.Label}}</text>
{{- end}}
</svg>
<dl>
<dt>responses</dt><dd data-pred-count="{{.PredErr.Count}}">{{.PredErr.Count}}</dd>
<dt>mean / p50 / p90 / p99</dt><dd data-pred-quantiles="{{.PredErr.Mean}} {{.PredErr.P50}} {{.PredErr.P90}} {{.PredErr.P99}}">{{.PredErr.Mean}} / {{.PredErr.P50}} / {{.PredErr.P90}} / {{.PredErr.P99}} blocks</dd>
<dt>blocks forgotten</dt><dd data-forgotten="{{.PredErr.Forgotten}}">{{.PredErr.Forgotten}} since start{{if .PredErr.RecentForgotten}}, {{.PredErr.RecentForgotten}} in the last {{.Window}}{{end}}</dd>
</dl>
</section>
{{- end}}

<section id="latency">
<h2>Upstream time to first byte{{if .Window}} (last {{.Window}}){{else}} (since start){{end}}</h2>
<table>
<thead><tr><th>target</th><th class="num">requests</th><th class="num">p50</th><th class="num">p95</th><th class="num">p99</th></tr></thead>
<tbody>
{{- range .TTFT}}
<tr data-ttft="{{.Target}}"><td>{{.Target}}</td><td class="num">{{.Count}}</td><td class="num">{{.P50}}</td><td class="num">{{.P95}}</td><td class="num">{{.P99}}</td></tr>
{{- end}}
</tbody>
</table>
<dl style="margin-top:8px"><dt>client requests</dt><dd>{{.Requests}}</dd>{{if .Retries}}<dt>upstream retries</dt><dd>{{.Retries}}</dd>{{end}}</dl>
</section>

<section id="gossip">
<h2>Gossip</h2>
<dl>
<dt>bytes in / out</dt><dd>{{.Gossip.In}} / {{.Gossip.Out}}</dd>
{{- if .Gossip.Queue}}<dt>batches queued to peers</dt><dd data-queue="{{.Gossip.Queue}}">{{.Gossip.Queue}}</dd>{{end}}
{{- if .Gossip.DeltaPerBlock}}<dt>delta bytes per block per peer</dt><dd data-delta-per-block="{{.Gossip.DeltaPerBlock}}">{{.Gossip.DeltaPerBlock}}{{if .Gossip.RecentDeltaPerBlock}} <span class="muted">({{.Gossip.RecentDeltaPerBlock}} in the last {{.Window}})</span>{{end}}</dd>{{end}}
{{- range .Gossip.FullCopies}}
<dt>full copies: {{.Reason}}</dt><dd data-full-copies="{{.Reason}}">{{if .Warn}}<span class="badge warn">{{.Count}}</span> <span class="muted">back-pressure</span>{{else}}{{.Count}}{{end}}</dd>
{{- end}}
{{- range .Gossip.StreamsRefused}}
<dt>streams refused: {{.Reason}}</dt><dd data-stream-refused="{{.Reason}}"><span class="badge warn">{{.Count}}</span></dd>
{{- end}}
{{- if .Gossip.Resyncs}}<dt>summary resyncs</dt><dd>{{.Gossip.Resyncs}}</dd>{{end}}
{{- if .Gossip.Refusals}}<dt>peers refused (contract)</dt><dd>{{.Gossip.Refusals}}</dd>{{end}}
{{- range .Gossip.Drops}}
<dt>dropped: {{.Reason}}</dt><dd data-drop="{{.Reason}}">{{if .Benign}}{{.Count}}{{else}}<span class="badge warn">{{.Count}}</span>{{end}}</dd>
{{- else}}
<dt>dropped</dt><dd>none</dd>
{{- end}}
</dl>
</section>

{{- if .HasRejected}}
<section id="rejected">
<h2>Refused at the edge (since start)</h2>
<dl>
{{- range .Rejected}}
<dt>{{.Reason}}</dt><dd data-rejected="{{.Reason}}"><span class="badge warn">{{.Count}}</span></dd>
{{- else}}
<dt>rejected requests</dt><dd data-rejected="none">none</dd>
{{- end}}
</dl>
</section>
{{- end}}
{{- if .Admission.On}}
<section id="admission">
<h2>Admission (since start)</h2>
<dl>
<dt>queued now</dt><dd data-admission-queued="{{.Admission.Queued}}">{{.Admission.Queued}}</dd>
<dt>started after a wait</dt><dd data-admission-waited="{{.Admission.Waited}}">{{.Admission.Waited}}</dd>
{{- range .Admission.Shed}}
<dt>shed: {{.Reason}}</dt><dd data-admission-shed="{{.Reason}}"><span class="badge warn">{{.Count}}</span></dd>
{{- else}}
<dt>shed</dt><dd data-admission-shed="none">none</dd>
{{- end}}
</dl>
</section>
{{- end}}
{{- if .Tenants.On}}
<section id="tenants">
<h2>Tenant token budgets (mesh-wide, last {{.Tenants.Window}})</h2>
<dl>
<dt>default budget</dt><dd data-tenants-default="{{.Tenants.Default}}">{{.Tenants.Default}}</dd>
<dt>peers counted</dt><dd data-tenants-peers="{{.Tenants.Peers}}">{{.Tenants.Peers}}</dd>
{{- range .Tenants.Rows}}
<dt>{{.Name}}</dt><dd data-tenant="{{.Name}}">{{if .Warn}}<span class="badge warn">{{end}}input {{.Input}} · output {{.Output}}{{if .Warn}}</span>{{end}} (this router: {{.Own}})</dd>
{{- else}}
<dt>tenants</dt><dd data-tenant="none">none counted</dd>
{{- end}}
</dl>
</section>
{{- end}}
{{- if .Lifecycle.On}}
<section id="lifecycle">
<h2>Replica lifecycle (since start)</h2>
<dl>
{{- range .Lifecycle.Ejections}}
<dt>ejected: {{.Reason}}</dt><dd data-ejected="{{.Reason}}"><span class="badge warn">{{.Count}}</span></dd>
{{- else}}
<dt>ejected</dt><dd data-ejected="none">none</dd>
{{- end}}
{{- range .Lifecycle.Silences}}
<dt>silences past the stall window: {{.Reason}}</dt><dd data-silence="{{.Reason}}">{{if .Warn}}<span class="badge warn">{{.Count}}</span>{{else}}{{.Count}}{{end}}</dd>
{{- end}}
<dt>requests ended by a stall</dt><dd data-stalled-requests="{{.Lifecycle.StalledRequests}}">{{.Lifecycle.StalledRequests}}</dd>
</dl>
</section>
{{- end}}
</div>
{{- end}}
</main>
</body>
</html>
`))
