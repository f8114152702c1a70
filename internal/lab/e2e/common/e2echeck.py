#!/usr/bin/env python3
"""What the real-engine suites (../llamacpp, ../vllm) check, shared (Python stdlib only).

Each suite's check.py is a thin command line over this module: its
features check (features, with the engine's profile in ENGINES), the
benchmark comparison (compare), the peers' table (peers) and the
per-response prediction report (predict). Run as a script it takes the
same commands, for an engine named on the command line:

  e2echeck.py features ROUTER_URL ADMIN_URL MODEL REPLICAS ENGINE [SLOTS]
  e2echeck.py compare RESULT.json...
  e2echeck.py peers RUN_DIR...
  e2echeck.py predict [--gate LO,HI] NAME=LOG[,LOG...]...
  e2echeck.py ports PAIRS SINGLES [BASE] [OFFSET,...]
      free ports (pick_ports), printed on one line.

Exits non-zero with the failed check on stderr.
"""
import glob
import json
import os
import random
import re
import socket
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request


def fail(msg):
    print(f"check.py: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def http(method, url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post_json(url, body):
    status, raw = http("POST", url, body)
    if status != 200:
        fail(f"POST {url}: HTTP {status}: {raw[:300]!r}")
    return json.loads(raw)


def stream(url, body):
    """POSTs body with stream on; returns (data events as dicts, saw [DONE])."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    events, done = [], False
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            ctype = r.headers.get("Content-Type", "")
            if not ctype.startswith("text/event-stream"):
                fail(f"stream {url}: Content-Type {ctype!r}")
            for line in r:
                line = line.decode().rstrip("\r\n")
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    continue
                if done:
                    fail(f"stream {url}: data after [DONE]")
                events.append(json.loads(payload))
    except urllib.error.HTTPError as e:
        fail(f"stream {url}: HTTP {e.code}: {e.read()[:300]!r}")
    return events, done


def parse_metrics(page):
    """Parses a Prometheus text page into {name: [(labels dict, value)]}."""
    out = {}
    for line in page.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out


def metrics(admin):
    """The router's /metrics, parsed (parse_metrics)."""
    status, raw = http("GET", admin + "/metrics", timeout=10)
    if status != 200:
        fail(f"GET {admin}/metrics: HTTP {status}")
    return parse_metrics(raw.decode())


def metrics_file(path):
    """A saved /metrics page, parsed (parse_metrics)."""
    with open(path) as f:
        return parse_metrics(f.read())


def total(ms, name):
    return sum(v for _, v in ms.get(name, []))


def debug_mesh(admin):
    status, raw = http("GET", admin + "/debug/mesh", timeout=10)
    if status != 200:
        fail(f"GET {admin}/debug/mesh: HTTP {status}")
    return json.loads(raw)


def check_usage(what, usage):
    if not isinstance(usage, dict):
        fail(f"{what}: no usage: {usage!r}")
    if not usage.get("prompt_tokens", 0) > 0 or not usage.get("completion_tokens", 0) > 0:
        fail(f"{what}: usage without prompt or completion tokens: {usage}")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if not isinstance(cached, int) or cached < 0 or cached > usage["prompt_tokens"]:
        fail(f"{what}: usage.prompt_tokens_details.cached_tokens {cached!r} (prompt {usage['prompt_tokens']})")
    return usage["prompt_tokens"], cached


def text(n, rng):
    words = "the cache router replica token prompt engine queue memory network answer question model".split()
    return " ".join(rng.choice(words) for _ in range(n))


# What the features check expects of each engine: its name in
# kvmesh_replica_engine_info, the load metric the router reads, whether
# the router knows its slots (/props), whether a text completions stream
# may carry its usage on the final choice's chunk (llama.cpp's does;
# OpenAI's and vLLM's end with a usage chunk without choices), how long
# the answer that shows as running is, and whether the running gauge and
# the prediction-error observations are checked too.
ENGINES = {
    "llamacpp": dict(load_metric="llamacpp:requests_processing", slots=True, usage_on_choice=True,
                     long_tokens=200, running_gauge=True, error_observations=True),
    "vllm": dict(load_metric="vllm:num_requests_running", slots=False, usage_on_choice=False,
                 long_tokens=300, running_gauge=False, error_observations=False),
}


def features(router, admin, model, replicas, engine, slots=None):
    """Chat and text completions, streamed and not, through the router at
    router (admin: its admin listener) over replicas replicas of engine
    (ENGINES: with slots, the slot count each must show); the engine's
    detection and load; the cached-token feedback of a second turn."""
    eng = ENGINES[engine]
    rng = random.Random()
    nonce = f"{rng.getrandbits(64):016x}"

    status, raw = http("GET", router + "/v1/models", timeout=10)
    ids = [m.get("id") for m in json.loads(raw).get("data", [])] if status == 200 else []
    if model not in ids:
        fail(f"/v1/models: HTTP {status}, models {ids}, want {model}")
    print(f"  models: {ids}")

    # Engine auto-detection: the router names the engine for every
    # replica, and has read its /metrics (the load gauges) and, where the
    # engine tells them, its slots (llama.cpp's /props).
    deadline = time.time() + 30
    while True:
        ms = metrics(admin)
        kinds = {l.get("replica"): l.get("engine") for l, v in ms.get("kvmesh_replica_engine_info", []) if v == 1}
        owned = [r for r in debug_mesh(admin)["replicas"] if r.get("owned")]
        if (len(kinds) == replicas and set(kinds.values()) == {engine} and len(owned) == replicas
                and all(r["engine_has_load"] and (not eng["slots"] or r["engine_slots"] == slots) for r in owned)):
            break
        if time.time() > deadline:
            fail(f"engine detection: kvmesh_replica_engine_info {kinds}, /debug/mesh owned replicas "
                 f"{[(r['id'], r['engine_slots'], r['engine_has_load']) for r in owned]}; want {replicas} "
                 f"replicas of engine {engine}" + (f" with {slots} slots" if eng["slots"] else "") + " and load known")
        time.sleep(0.2)
    print(f"  engine detected: {sorted(kinds.items())}" + (f", slots {slots} each (from /props)" if eng["slots"] else "")
          + ", load published")

    chat_url, comp_url = router + "/v1/chat/completions", router + "/v1/completions"
    r = post_json(chat_url, {"model": model, "max_tokens": 8,
                             "messages": [{"role": "user", "content": f"{nonce} say hello"}]})
    if r.get("object") != "chat.completion" or not isinstance(r["choices"][0]["message"].get("content"), str):
        fail(f"chat: {r}")
    check_usage("chat", r.get("usage"))
    print(f"  chat: {r['usage']}")

    r = post_json(comp_url, {"model": model, "max_tokens": 8, "prompt": f"{nonce} once upon a time"})
    if r.get("object") != "text_completion" or not isinstance(r["choices"][0].get("text"), str):
        fail(f"completions: {r}")
    check_usage("completions", r.get("usage"))
    print(f"  completions: {r['usage']}")

    for what, url, body, field in [
        ("chat stream", chat_url, {"messages": [{"role": "user", "content": f"{nonce} count to five"}]}, "delta"),
        ("completions stream", comp_url, {"prompt": f"{nonce} one two three"}, "text"),
    ]:
        body.update(model=model, max_tokens=16, stream=True, stream_options={"include_usage": True})
        events, done = stream(url, body)
        if not done:
            fail(f"{what}: no [DONE]")
        content = [e for e in events if e.get("choices") and field in e["choices"][0]]
        if not content:
            fail(f"{what}: no {field} chunks in {events[:3]}")
        last = events[-1]
        on_choice = eng["usage_on_choice"] and field == "text"
        if not last.get("usage") or (not on_choice and last.get("choices")):
            fail(f"{what}: the last chunk before [DONE] is not the usage chunk: {last}")
        check_usage(what, last["usage"])
        print(f"  {what}: {len(content)} chunks, usage {last['usage']}")

    # The engine's load as the router reads it: while a long answer
    # streams, some replica's engine reports a running request.
    seen = []
    long_tokens = eng["long_tokens"]
    long_req = threading.Thread(target=stream, args=(chat_url, {
        "model": model, "max_tokens": long_tokens, "ignore_eos": True, "stream": True,
        "messages": [{"role": "user", "content": f"{nonce} write a long story"}]}))
    long_req.start()
    while long_req.is_alive() and not seen:
        seen = [r["id"] for r in debug_mesh(admin)["replicas"] if r.get("owned") and r["engine_running"] >= 1]
        if eng["running_gauge"]:
            running = [l for l, v in metrics(admin).get("kvmesh_replica_engine_requests", [])
                       if l.get("state") == "running" and v >= 1]
            if seen and not running:
                seen = []
        time.sleep(0.1)
    long_req.join()
    if not seen:
        fail(f"engine load: no replica's engine_running reached 1 while a {long_tokens}-token answer streamed")
    print(f"  engine load read from {eng['load_metric']}: running 1 at {seen}")

    # Cached-token feedback: turn 2 extends turn 1's conversation, so the
    # engine serves turn 1's prompt and answer from its cache, and the
    # router's counters move by what the engine reported.
    before = metrics(admin)
    msgs = [{"role": "system", "content": f"{nonce} " + text(300, rng)},
            {"role": "user", "content": text(20, rng)}]
    r1 = post_json(chat_url, {"model": model, "max_tokens": 16, "messages": msgs})
    msgs += [r1["choices"][0]["message"], {"role": "user", "content": text(20, rng)}]
    body = {"model": model, "max_tokens": 16, "messages": msgs, "stream": True,
            "stream_options": {"include_usage": True}}
    events, _ = stream(chat_url, body)
    p1, c1 = check_usage("turn 1", r1["usage"])
    p2, c2 = check_usage("turn 2", events[-1].get("usage"))
    if c2 < p1 // 2:
        fail(f"turn 2: {c2} cached tokens of {p2}, turn 1 had {p1} prompt tokens: not served from the engine's cache")
    want_err = 2 if eng["error_observations"] else None
    deadline = time.time() + 10
    while True:
        after = metrics(admin)
        d_rep = total(after, "kvmesh_reported_cached_tokens_total") - total(before, "kvmesh_reported_cached_tokens_total")
        d_prompt = total(after, "kvmesh_prompt_tokens_total") - total(before, "kvmesh_prompt_tokens_total")
        d_pred = total(after, "kvmesh_predicted_cached_tokens_total") - total(before, "kvmesh_predicted_cached_tokens_total")
        d_err = (total(after, "kvmesh_cache_prediction_error_blocks_count")
                 - total(before, "kvmesh_cache_prediction_error_blocks_count"))
        if d_rep == c1 + c2 and d_prompt == p1 + p2 and want_err in (None, d_err):
            break
        if time.time() > deadline:
            fail(f"feedback: router counters moved reported {d_rep} prompt {d_prompt} observations {d_err}; "
                 f"the engine reported cached {c1}+{c2} of prompt {p1}+{p2} in 2 responses")
        time.sleep(0.2)
    if d_pred <= 0:
        fail(f"feedback: the router predicted no cached tokens for turn 2 ({c2} reported)")
    print(f"  feedback: turn 2 cached {c2}/{p2}; router reported_cached +{d_rep:.0f}, prompt +{d_prompt:.0f}, "
          f"predicted_cached +{d_pred:.0f}")
    print("check.py features: passed")


def compare(paths):
    results = []
    for p in paths:
        with open(p) as f:
            results.extend(json.load(f)["frontends"])
    print(f"  {'front end':<14} {'turns':>5} {'errors':>6} {'follow-up cached':>16} {'turn-1 cached':>13} "
          f"{'TTFT p50 ms':>11} {'p99 ms':>8} {'follow-up p50':>13} {'p99':>8} {'wall s':>7}")
    for r in results:
        print(f"  {r['name']:<14} {r['turns']:>5} {r['errors']:>6} {r['followup_cached_share']:>16.3f} "
              f"{r['first_turn_cached_share']:>13.3f} {r['ttft_p50_ms']:>11.0f} {r['ttft_p99_ms']:>8.0f} "
              f"{r['followup_ttft_p50_ms']:>13.0f} {r['followup_ttft_p99_ms']:>8.0f} {r['wall_seconds']:>7.1f}")
    want = max(r["turns"] for r in results)
    for r in results:
        if r["errors"] or r["no_usage"] or r["turns"] != want:
            fail(f"{r['name']}: {r['turns']} turns of {want}, {r['errors']} errors {r.get('errors_by_kind')}, "
                 f"{r['no_usage']} without usage")
    base = results[-1]
    for r in results[:-1]:
        if not r["followup_cached_share"] > base["followup_cached_share"]:
            fail(f"{r['name']}: follow-up cached share {r['followup_cached_share']:.3f} not above "
                 f"{base['name']}'s {base['followup_cached_share']:.3f}")
    # More routers keep a conversation's cache as one does (issue 22: at
    # least 0.97x one router's follow-up share on the same replicas); the
    # first kvmesh front end is the one-router run.
    one = results[0]
    for r in results[1:-1]:
        if r["followup_cached_share"] < 0.97 * one["followup_cached_share"]:
            fail(f"{r['name']}: follow-up cached share {r['followup_cached_share']:.3f} below 0.97x "
                 f"{one['name']}'s {one['followup_cached_share']:.3f}")
    print("check.py compare: passed")


PEER_METRICS = (("followup_cached_share", "follow-up cached", "{:.3f}"),
                ("ttft_p50_ms", "TTFT p50 ms", "{:,.0f}"), ("ttft_p99_ms", "TTFT p99 ms", "{:,.0f}"),
                ("followup_ttft_p50_ms", "follow-up p50 ms", "{:,.0f}"),
                ("followup_ttft_p99_ms", "follow-up p99 ms", "{:,.0f}"))


def peers(dirs):
    runs = {}  # front end name -> one result per run, in the order of dirs
    for d in dirs:
        # (the routers' mesh views are kept there as llamacpp-*.mesh.json;
        # ../vllm/run.sh's peers phase keeps vllm-*.json, and its events
        # phase vLLM's KV-event counts as vllm-*.kv.json)
        paths = sorted(p for pat in ("llamacpp-*.json", "vllm-*.json") for p in glob.glob(os.path.join(d, pat))
                       if not p.endswith(".mesh.json") and not p.endswith(".kv.json"))
        if not paths:
            fail(f"peers: no llamacpp-*.json or vllm-*.json in {d}")
        for p in paths:
            with open(p) as f:
                for r in json.load(f)["frontends"]:
                    if r["errors"] or r["no_usage"]:
                        fail(f"peers: {p}: {r['name']} has {r['errors']} errors, {r['no_usage']} without usage")
                    runs.setdefault(r["name"], []).append(r)
    n = len(dirs)
    for name, rs in runs.items():
        if len(rs) != n:
            fail(f"peers: {name} ran {len(rs)} times in {n} runs")
    med = {name: {k: statistics.median(r[k] for r in rs) for k, _, _ in PEER_METRICS} for name, rs in runs.items()}
    print("| front end | " + " | ".join(h for _, h, _ in PEER_METRICS) + " |")
    print("| --- |" + " ---: |" * len(PEER_METRICS))
    for name, rs in runs.items():
        cells = [", ".join(fmt.format(r[k]) for r in rs) + f" (**{fmt.format(med[name][k])}**)"
                 for k, _, fmt in PEER_METRICS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for kv in [name for name in runs if name.startswith("kvmesh")]:
        verdicts(kv, med, runs, n)


def verdicts(kv, med, runs, n):
    """kvmesh front end kv's medians against each peer's: issue 22's bar."""
    ours = med[kv]
    for name in runs:
        if name.startswith("kvmesh") or name == "round-robin":
            continue
        theirs = med[name]
        misses = []
        # Shares are compared as printed (3 decimals): at this workload's
        # ceiling (every follow-up cached but its new question) they differ
        # by a token or two of 27k, from answers of different lengths.
        if round(ours["followup_cached_share"], 3) < round(theirs["followup_cached_share"], 3):
            misses.append(f"follow-up cached {ours['followup_cached_share']:.4f} < {theirs['followup_cached_share']:.4f}")
        for k, h, _ in PEER_METRICS[1:]:
            if ours[k] > 1.05 * theirs[k]:
                misses.append(f"{h} {ours[k]:,.0f} > 1.05x {theirs[k]:,.0f}")
        verdict = "meets the bar" if not misses else "misses: " + "; ".join(misses)
        print(f"{kv} vs {name} (medians of {n} runs): {verdict}")


def percentile(xs, q):
    """The q-quantile of xs by linear interpolation (numpy's default)."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def prediction_records(path):
    """The router's per-response "cached tokens" debug lines in the log at
    path (hclog text, key=value), as dicts of numbers."""
    out = []
    with open(path, errors="replace") as f:
        for line in f:
            if "cached tokens:" not in line:
                continue
            kv = dict(re.findall(r'(\w+)=(\S+)', line.split("cached tokens:", 1)[1]))
            try:
                r = {k: float(kv[k]) for k in ("match", "blocks", "prompt_bytes", "prompt_tokens",
                                               "cached", "predicted", "bytes_per_token", "error_blocks")}
                r["forgot"] = kv["forgot"] == "true"
                out.append(r)
            except (KeyError, ValueError):
                fail(f"predict: {path}: cannot read {line.strip()!r}")
    return out


def predict(args):
    """check.py predict [--gate LO,HI] NAME=LOG[,LOG...]...: per front end,
    the routers' predicted against engine-reported cached tokens over every
    response that reported them (the routers log one debug line each):
    predicted/reported, and the prediction error in blocks (|predicted -
    reported| at the prompt's bytes per token) p50/p95. With --gate, fails
    unless every front end's predicted/reported is within [LO, HI]."""
    gate = None
    if args and args[0] == "--gate":
        lo, hi = (float(x) for x in args[1].split(","))
        gate, args = (lo, hi), args[2:]
    rows = []
    print(f"  {'front end':<14} {'answers':>7} {'predicted':>9} {'reported':>9} {'pred/rep':>8} "
          f"{'|err| p50':>9} {'p95':>6} {'max':>6} {'err sum':>8} {'hits':>5} {'misses':>6} {'forgot':>6} "
          f"{'cold cached':>11}")
    for arg in args:
        name, _, paths = arg.partition("=")
        recs = [r for p in paths.split(",") for r in prediction_records(p)]
        if not recs:
            fail(f"predict: {name}: no 'cached tokens' lines in {paths} (routers at --log-level debug?)")
        pred = sum(r["predicted"] for r in recs)
        rep = sum(r["cached"] for r in recs)
        errs = [abs(r["error_blocks"]) for r in recs]
        ratio = pred / rep if rep else float("nan")
        hits = sum(1 for r in recs if r["match"] > 0)
        misses = sum(1 for r in recs if r["error_blocks"] >= 1)
        print(f"  {name:<14} {len(recs):>7} {pred:>9.0f} {rep:>9.0f} {ratio:>8.3f} {percentile(errs, 0.5):>9.2f} "
              f"{percentile(errs, 0.95):>6.2f} {max(errs):>6.2f} {sum(r['error_blocks'] for r in recs):>8.1f} "
              f"{hits:>5} {misses:>6} {sum(1 for r in recs if r['forgot']):>6} "
              f"{sum(r['cached'] for r in recs if r['match'] == 0):>11.0f}")
        rows.append((name, ratio))
    if gate:
        for name, ratio in rows:
            if not gate[0] <= ratio <= gate[1]:
                fail(f"predict: {name}: predicted/reported cached tokens {ratio:.3f} outside [{gate[0]}, {gate[1]}]")
        print(f"check.py predict: passed (predicted/reported within [{gate[0]}, {gate[1]}])")


def pick_ports(pairs, singles, base=None, pair_extra=()):
    """Free ports on 127.0.0.1, each bound on TCP and UDP (gossip uses
    both) and held until all are chosen: pairs consecutive pairs (an
    engine's start.sh takes consecutive ports), with each pair's first
    port plus every offset in pair_extra free too (an engine's other
    listeners), then singles single ports. From base up when given, else
    at random below the ephemeral range."""
    try:
        lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    lo = max(lo, 12000)
    held, ports = [], []

    def grab(p):
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            t.bind(("127.0.0.1", p))
            u.bind(("127.0.0.1", p))
        except OSError:
            t.close()
            u.close()
            return False
        held.extend([t, u])
        return True

    def candidates():
        if base is not None:
            yield from range(base, base + 2000)
        else:
            for _ in range(5000):
                yield random.randrange(10000, lo - 1)

    want = 2 * pairs + singles
    for p in candidates():
        if len(ports) == want:
            break
        if len(ports) < 2 * pairs:
            need = [p, p + 1] + [p + x for x in pair_extra]
            if any(q in ports for q in need):
                continue
            if all(grab(q) for q in need):
                ports += [p, p + 1]
        elif p not in ports and grab(p):
            ports.append(p)
    if len(ports) != want:
        fail(f"could not pick {want} free ports")
    return ports


def main(argv):
    if len(argv) in (7, 8) and argv[1] == "features":
        features(argv[2].rstrip("/"), argv[3].rstrip("/"), argv[4], int(argv[5]), argv[6],
                 int(argv[7]) if len(argv) == 8 else None)
    elif len(argv) >= 4 and argv[1] == "compare":
        compare(argv[2:])
    elif len(argv) >= 3 and argv[1] == "peers":
        peers(argv[2:])
    elif len(argv) >= 3 and argv[1] == "predict":
        predict(argv[2:])
    elif len(argv) in (4, 5, 6) and argv[1] == "ports":
        base = int(argv[4]) if len(argv) >= 5 and argv[4] else None
        extra = [int(x) for x in argv[5].split(",") if x] if len(argv) == 6 else []
        print(*pick_ports(int(argv[2]), int(argv[3]), base, extra))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv)
