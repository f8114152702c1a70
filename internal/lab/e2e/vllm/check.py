#!/usr/bin/env python3
"""Checks a kvmesh router in front of real vLLM (CPU) replicas (Python stdlib only, but kvcount).

  check.py features ROUTER_URL ADMIN_URL MODEL REPLICAS
      chat and text completions, streamed (stream_options.include_usage) and
      not; the router detects vLLM on every replica (kvmesh_replica_engine_info)
      and reads its load from /metrics (a streaming request shows as running);
      cached-token feedback: a second turn is served from vLLM's prefix cache
      and the router's counters of reported and predicted cached tokens move
      by what the engine reported.
  check.py report METRICS.txt...
      the routers' /metrics after a benchmark (one file per router of one
      front end): cached tokens the routers predicted against those the
      engines reported, the bytes of prompt text per engine token and the
      share of the block after a match held (kvmesh_replica_bytes_per_token,
      kvmesh_replica_cached_tail_share) each router learnt for its replicas,
      how many predictions were within half a block and within 4 blocks of
      what the engine reported (kvmesh_cache_prediction_error_blocks), and
      the buckets of the error's p50 and p95
      (kvmesh_cache_prediction_abs_error_blocks).
  check.py events OFF_METRICS.txt ON_METRICS.txt [OFF_KV.json ON_KV.json]
      one router's /metrics after the same benchmark without and with
      --kv-events, side by side: the prediction error's p50 and p95 (by the
      histogram's bucket bounds), the shares over +1 and under -1 block,
      the engine-reported cached share of prompt tokens, predicted/reported,
      the text blocks KV events dropped and, given kvcount's files, the
      BlockStored/BlockRemoved events vLLM published (fails if it removed
      none: the run did not make the engines evict).
  check.py engines NAME BEFORE.txt,AFTER.txt...
      what vLLM's own /metrics (one BEFORE,AFTER pair of pages per server,
      scraped around one front end's benchmark) say of that benchmark: the
      requests each server finished, the prompt tokens it computed (not
      cached), and, over all servers, its time to first token p50 (from
      vllm:time_to_first_token_seconds' buckets) and mean, and its mean
      queue and prefill time: beside the client's TTFT, what the front end
      and placement added and what the engines took.
  VENV_PYTHON check.py kvcount OUT.json ENDPOINT...
      subscribes to vLLM's KV-event publishers (tcp://127.0.0.1:PORT, one
      per replica; vLLM's own ZMQ stream, independent of the router) until
      SIGTERM or SIGINT, then writes the events and their blocks counted by
      kind (BlockStored, BlockRemoved, AllBlocksCleared) per endpoint to
      OUT.json: the proof
      that the engines evicted. Needs pyzmq and msgspec (vLLM's venv has
      them; the other subcommands use the standard library only).

  VENV_PYTHON check.py otlp OUT.jsonl PORT[=NAME]...
      receives the OpenTelemetry spans vLLM exports per request (start.sh's
      OTLP_PORT_BASE: OTLP over HTTP, one port per server) until SIGTERM or
      SIGINT, one JSON line per request to OUT.jsonl: the server (NAME, else
      the port the span came to), the
      request id (X-Request-Id), its arrival (wall clock, s) and vLLM's own
      time to first token, queue, prefill and decode times (s) and prompt
      tokens. Needs opentelemetry-proto (vLLM's venv has it).
  check.py tail RESULT.json SPANS.jsonl [N]
      one front end's benchmark (kvmesh bench --json --request-ids) joined
      to the spans its requests left at the engines: each turn's server,
      client TTFT against vLLM's queue, prefill and the rest (what the
      front end and the API server added), and how many requests the
      server held when it arrived; the N [6] slowest turns, then per server
      and per turn the TTFT distribution.
  check.py cpu PID...
      the CPU seconds (user + system) the processes PID and all their
      descendants have used so far, summed (Linux /proc): read before and
      after a benchmark, what a front end, or an engine, spent on it.
  check.py compare RESULT.json... / check.py peers RUN_DIR... /
  check.py predict [--gate LO,HI] NAME=LOG...
      as ../llamacpp/check.py's.

The features check, the HTTP, stream and metrics helpers, the benchmark
comparison and the per-response prediction report are
../common/e2echeck.py's (shared with ../llamacpp/check.py). Exits non-zero
with the failed check on stderr.
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import e2echeck  # noqa: E402  (../common, found by the path above)
from e2echeck import fail, metrics_file, total  # noqa: E402


def total_all(paths, name):
    return sum(total(metrics_file(p), name) for p in paths)


def report(paths):
    pred = rep = prompt = 0.0
    ratios, tails = [], []
    absb = {}  # kvmesh_cache_prediction_abs_error_blocks' cumulative buckets
    buckets, count, err_sum = {}, 0.0, 0.0
    for p in paths:
        ms = metrics_file(p)
        pred += total(ms, "kvmesh_predicted_cached_tokens_total")
        rep += total(ms, "kvmesh_reported_cached_tokens_total")
        prompt += total(ms, "kvmesh_prompt_tokens_total")
        ratios += [(os.path.basename(p).removesuffix(".metrics.txt"), l.get("replica"), v)
                   for l, v in ms.get("kvmesh_replica_bytes_per_token", [])]
        tails += [(os.path.basename(p).removesuffix(".metrics.txt"), l.get("replica"), v)
                  for l, v in ms.get("kvmesh_replica_cached_tail_share", [])]
        for l, v in ms.get("kvmesh_cache_prediction_abs_error_blocks_bucket", []):
            absb[float(l["le"])] = absb.get(float(l["le"]), 0) + v
        for l, v in ms.get("kvmesh_cache_prediction_error_blocks_bucket", []):
            buckets[float(l["le"])] = buckets.get(float(l["le"]), 0) + v
        count += total(ms, "kvmesh_cache_prediction_error_blocks_count")
        err_sum += total(ms, "kvmesh_cache_prediction_error_blocks_sum")
    share = f"{pred / rep:.3f}" if rep else "n/a"
    print(f"  routers' cached tokens: predicted {pred:.0f}, engine-reported {rep:.0f} (predicted/reported {share}), "
          f"prompt tokens {prompt:.0f}")
    def within(lo, hi):  # observations in (lo, hi], by the histogram's buckets
        return buckets.get(hi, 0) - buckets.get(lo, 0)
    if count:
        print(f"  prediction error (predicted - reported, blocks) over {count:.0f} answers: "
              f"{within(-0.5, 0.5):.0f} within half a block, {within(-4, 4):.0f} within 4, sum {err_sum:.1f}")
        def quantile(q):  # the histogram bucket bound at or under which a share q of answers fall
            for le in sorted(buckets):
                if buckets[le] >= q * count:
                    return le
            return float("inf")
        over = count - buckets.get(1.0, 0)
        print(f"  prediction error p50 <= {quantile(0.5):g}, p95 <= {quantile(0.95):g} blocks; "
              f"over 1 block: {over:.0f} ({100 * over / count:.1f} %), mean {err_sum / count:+.2f}")
    kv = {name: total_all(paths, name) for name in ("kvmesh_kv_events_total", "kvmesh_kv_event_gaps_total",
          "kvmesh_kv_event_resyncs_total", "kvmesh_kv_event_text_blocks_evicted_total", "kvmesh_kv_event_rebases_total")}
    if kv["kvmesh_kv_events_total"]:
        rel = sum(v for p in paths for l, v in metrics_file(p).get("kvmesh_kv_event_answers_total", []) if l.get("outcome") == "related")
        unrel = sum(v for p in paths for l, v in metrics_file(p).get("kvmesh_kv_event_answers_total", []) if l.get("outcome") == "unrelated")
        print(f"  KV events: {kv['kvmesh_kv_events_total']:.0f} events, {kv['kvmesh_kv_event_gaps_total']:.0f} gaps, "
              f"{kv['kvmesh_kv_event_resyncs_total']:.0f} resyncs, {kv['kvmesh_kv_event_text_blocks_evicted_total']:.0f} text blocks evicted, "
              f"{kv['kvmesh_kv_event_rebases_total']:.0f} rebases; answers related {rel:.0f}, unrelated {unrel:.0f}")
    if count and absb:
        def quantile(q):  # the bucket's upper bound the q-quantile falls in
            return min((le for le, n in absb.items() if n >= q * count), default=float("inf"))
        print(f"  |prediction error| p50 at most {quantile(0.5)} blocks, p95 at most {quantile(0.95)} "
              f"(kvmesh_cache_prediction_abs_error_blocks' buckets)")
    for router, replica, v in ratios:
        print(f"  bytes/token learnt by {router} for {replica}: {v:.2f}")
    for router, replica, v in tails:
        print(f"  cached tail share learnt by {router} for {replica}: {v:.2f}")


def events(off, on, kv=None):
    """Side by side: the router without and with KV events (one metrics page
    each), and, given kvcount's files of the two runs, the blocks vLLM
    itself reported stored and removed."""
    rows = []
    for i, (name, path) in enumerate((("events off", off), ("events on", on))):
        ms = metrics_file(path)
        buckets, absb = {}, {}
        for l, v in ms.get("kvmesh_cache_prediction_error_blocks_bucket", []):
            buckets[float(l["le"])] = buckets.get(float(l["le"]), 0) + v
        for l, v in ms.get("kvmesh_cache_prediction_abs_error_blocks_bucket", []):
            absb[float(l["le"])] = absb.get(float(l["le"]), 0) + v
        count = total(ms, "kvmesh_cache_prediction_error_blocks_count")
        err = total(ms, "kvmesh_cache_prediction_error_blocks_sum")
        prompt = total(ms, "kvmesh_prompt_tokens_total")
        rep = total(ms, "kvmesh_reported_cached_tokens_total")
        pred = total(ms, "kvmesh_predicted_cached_tokens_total")
        def quantile(b, q):  # the least bucket bound under which a share q of the answers fall
            for le in sorted(b):
                if b[le] >= q * count:
                    return f"<= {le:g}"
            return "> top"
        over = count - buckets.get(1.0, 0)
        under = buckets.get(-1.0, 0)
        evicted = total(ms, "kvmesh_kv_event_text_blocks_evicted_total")
        vllm = kvcounts([kv[i]]) if kv else {}
        rows.append((name, f"{count:.0f}", quantile(buckets, 0.5), quantile(buckets, 0.95), quantile(absb, 0.95),
                     f"{100 * over / count:.1f} %" if count else "n/a", f"{100 * under / count:.1f} %" if count else "n/a",
                     f"{err / count:+.2f}" if count else "n/a",
                     f"{100 * rep / prompt:.1f} %" if prompt else "n/a", f"{pred / rep:.3f}" if rep else "n/a", f"{evicted:.0f}",
                     f"{vllm.get('BlockStored blocks', 0)}/{vllm.get('BlockRemoved blocks', vllm.get('BlockRemoved', 0))}"
                     if kv else "n/a"))
    head = ("router", "answers", "err p50", "err p95", "|err| p95", "err > +1", "err < -1", "mean err", "cached share",
            "pred/rep", "evicted", "vLLM blocks stored/removed")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print("  prediction error = predicted - engine-reported cached blocks per answer (|err|: "
          "kvmesh_cache_prediction_abs_error_blocks); cached share = engine-reported cached / prompt tokens; "
          "evicted = text blocks the router dropped on KV events; vLLM blocks stored/removed = the blocks of the "
          "BlockStored/BlockRemoved events vLLM published (counted beside the router)")
    for r in [head] + rows:
        print("  " + "  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
    if kv:
        for name, p in zip(("events off", "events on"), kv):
            if kvcounts([p]).get("BlockRemoved", 0) == 0:
                fail(f"events: vLLM published no BlockRemoved in the {name} run: the replicas did not evict; "
                     f"use fewer EVENTS_BLOCKS or more EVENTS_CONVERSATIONS")


def engines(name, pairs):
    def delta(b, a, metric):
        return total(a, metric) - total(b, metric)
    per, hist = [], {}
    sums = {k: [0.0, 0.0] for k in ("time_to_first_token", "request_queue_time", "request_prefill_time")}
    for pair in pairs:
        bp, ap = pair.split(",")
        b, a = metrics_file(bp), metrics_file(ap)
        reqs = delta(b, a, "vllm:request_success_total")
        computed = delta(b, a, "vllm:request_prefill_kv_computed_tokens_sum")
        prompt = delta(b, a, "vllm:prompt_tokens_total")
        per.append(f"{reqs:.0f} req, {prompt:.0f} prompt / {computed:.0f} computed tokens")
        for k in sums:
            sums[k][0] += delta(b, a, f"vllm:{k}_seconds_sum")
            sums[k][1] += delta(b, a, f"vllm:{k}_seconds_count")
        before = {l["le"]: v for l, v in b.get("vllm:time_to_first_token_seconds_bucket", [])}
        for l, v in a.get("vllm:time_to_first_token_seconds_bucket", []):
            hist[float(l["le"])] = hist.get(float(l["le"]), 0) + v - before.get(l["le"], 0)
    n = sums["time_to_first_token"][1]
    p50 = next((le for le in sorted(hist) if hist[le] >= 0.5 * n), float("inf")) if n else float("nan")
    mean = lambda k: 1000 * sums[k][0] / sums[k][1] if sums[k][1] else float("nan")
    print(f"  {name:<14} engine TTFT p50 <= {1000 * p50:,.0f} ms, mean {mean('time_to_first_token'):,.0f} ms; "
          f"queue mean {mean('request_queue_time'):,.0f} ms, prefill mean {mean('request_prefill_time'):,.0f} ms; "
          f"per server: " + "; ".join(per))


def kvcount(out, endpoints):
    import signal
    import zmq
    import msgspec
    ctx = zmq.Context()
    socks = {}
    for ep in endpoints:
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(ep)
        socks[s] = ep
    counts = {ep: {} for ep in endpoints}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    dec = msgspec.msgpack.Decoder()
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    # vLLM encodes an EventBatch and its events as msgpack arrays (tagged
    # structs: the event's kind first) or, in other builds, maps.
    kind = lambda e: e.get("type", next(iter(e))) if isinstance(e, dict) else e[0]
    while not stop:
        for s, _ in poller.poll(200):
            parts = s.recv_multipart()
            batch = dec.decode(parts[-1])
            evs = batch["events"] if isinstance(batch, dict) else batch[1]
            c = counts[socks[s]]
            c["batches"] = c.get("batches", 0) + 1
            for e in evs:
                k = kind(e)
                c[k] = c.get(k, 0) + 1
                hashes = e.get("block_hashes") if isinstance(e, dict) else (e[1] if len(e) > 1 else None)
                if isinstance(hashes, list):
                    c[k + " blocks"] = c.get(k + " blocks", 0) + len(hashes)
    with open(out, "w") as f:
        json.dump(counts, f)
    ctx.destroy(linger=0)


def otlp(out, ports):
    import signal
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
    lock = threading.Lock()
    f = open(out, "a")

    def value(v):
        k = v.WhichOneof("value")
        return getattr(v, k) if k else None

    def handler(port):
        class H(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(body)
                rows = []
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        for sp in ss.spans:
                            a = {kv.key: value(kv.value) for kv in sp.attributes}
                            rows.append({"server": port, "id": a.get("gen_ai.request.id"),
                                         "arrival": sp.start_time_unix_nano / 1e9, "end": sp.end_time_unix_nano / 1e9,
                                         "ttft": a.get("gen_ai.latency.time_to_first_token"),
                                         "queue": a.get("gen_ai.latency.time_in_queue"),
                                         "prefill": a.get("gen_ai.latency.time_in_model_prefill"),
                                         "decode": a.get("gen_ai.latency.time_in_model_decode"),
                                         "e2e": a.get("gen_ai.latency.e2e"),
                                         "prompt": a.get("gen_ai.usage.prompt_tokens")})
                with lock:
                    for r in rows:
                        f.write(json.dumps(r) + "\n")
                    f.flush()
                resp = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(resp)))
                self.end_headers()
                self.wfile.write(resp)

            def log_message(self, *args):
                pass
        return H

    # PORT=NAME: the spans received on PORT are the server NAME's
    servers = [ThreadingHTTPServer(("127.0.0.1", int(p.split("=")[0])), handler(p.split("=")[-1])) for p in ports]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    for srv in servers:
        srv.shutdown()
    f.close()


def tail(result, spans_path, n=6):
    """Joins one front end's per-turn records to vLLM's spans (by request id,
    else by prompt tokens and the nearest arrival) and prints what makes
    its TTFT tail."""
    with open(result) as fh:
        fe = json.load(fh)["frontends"][0]
    t0 = fe["started_unix_ms"] / 1000
    spans = []
    with open(spans_path) as fh:
        for line in fh:
            spans.append(json.loads(line))
    # this benchmark's spans: the same ids recur round after round
    spans = [s for s in spans if s.get("ttft") is not None and t0 - 1 <= s["arrival"] <= t0 + fe["wall_seconds"] + 1]
    by_id = {s["id"].removeprefix("chatcmpl-"): s for s in spans if s.get("id")}
    used = set()
    rows = []
    for r in fe["requests"]:
        sent = t0 + r["sent_ms"] / 1000
        s = by_id.get(r.get("id") or "")
        if s is None:  # the front end did not pass X-Request-Id on: the same prompt arriving nearest after the send
            cands = [x for x in spans if id(x) not in used and x.get("prompt") == r["prompt_tokens"]
                     and -0.05 <= x["arrival"] - sent <= 30]
            s = min(cands, key=lambda x: x["arrival"] - sent, default=None)
        if s is not None:
            used.add(id(s))
        rows.append((r, sent, s))
    # what each server held when a request arrived: requests arrived before it and not yet ended
    ends = [(x["server"], x["arrival"], x["end"]) for _, _, x in rows if x]
    def held(s):
        return sum(1 for srv, a, e in ends if srv == s["server"] and a < s["arrival"] <= e)
    def fmt(r, sent, s):
        if s is None:
            return (f"c{r['conversation']:<2} t{r['turn']}  sent {r['sent_ms'] / 1000:6.2f} s  TTFT {r['ttft_ms']:7,.0f} ms  "
                    f"prompt {r['prompt_tokens']:5} cached {r['cached_tokens']:5}  (no span)")
        router = (s["arrival"] - sent) * 1000
        rest = r["ttft_ms"] - router - 1000 * s["ttft"]
        pre = 1000 * (s["ttft"] - s["queue"] - s["prefill"])
        # the first chunk (text or not) back: vLLM streams one with the first token even when its text is empty
        chunk = r.get("first_chunk_ms", r["ttft_ms"]) - router - 1000 * s["ttft"]
        return (f"c{r['conversation']:<2} t{r['turn']}  server {s['server']}  sent {r['sent_ms'] / 1000:6.2f} s  "
                f"TTFT {r['ttft_ms']:7,.0f} ms = to engine {router:5,.0f} + vLLM {1000 * s['ttft']:6,.0f} "
                f"(API in {pre:5,.0f}, queue {1000 * s['queue']:6,.0f}, prefill {1000 * s['prefill']:6,.0f}) + back {rest:5,.0f} "
                f"(first chunk {chunk:5,.0f}); prompt {r['prompt_tokens']:5} cached {r['cached_tokens']:5}; server held {held(s)} at arrival")
    print(f"  {fe['name']}: {len(rows)} turns, {sum(1 for _, _, s in rows if s)} joined to vLLM's spans; the {n} slowest:")
    for r, sent, s in sorted(rows, key=lambda x: -x[0]["ttft_ms"])[:n]:
        print("    " + fmt(r, sent, s))
    def q(v, p):
        v = sorted(v)
        if not v:
            return float("nan")
        k = (len(v) - 1) * p
        lo = int(k)
        return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (k - lo)
    groups = {}
    for r, sent, s in rows:
        groups.setdefault(f"turn {r['turn'] + 1}", []).append((r, s))
        if s:
            groups.setdefault(f"server {s['server']}", []).append((r, s))
    # The first turns' burst per server: the prompt tokens it computed
    # (not cached) for them and the time from the first one's arrival to
    # the last one's first token, on the client's clock: its prefill rate
    # is the engine's (and the machine's) share of the tail.
    burst = {}
    for r, sent, s in rows:
        if r["turn"] == 0 and s:
            b = burst.setdefault(s["server"], [0, 0, float("inf"), 0.0])
            b[0] += 1
            b[1] += r["prompt_tokens"] - r["cached_tokens"]
            b[2] = min(b[2], s["arrival"])
            b[3] = max(b[3], sent + r["ttft_ms"] / 1000)
    # Follow-ups served with fewer cached tokens than their previous
    # turn's whole prompt blocks (start.sh's BLOCK_SIZE, 32): sent away
    # from the server holding the conversation, or evicted there. Past
    # those, a follow-up's cached share is set by where its previous
    # answer (random tokens of random length) ended a block.
    by_turn = {(r["conversation"], r["turn"]): r for r in fe["requests"]}
    short = [(r, (by_turn[(r["conversation"], r["turn"] - 1)]["prompt_tokens"] // 32) * 32 - r["cached_tokens"])
             for r in fe["requests"] if r["turn"] > 0 and (r["conversation"], r["turn"] - 1) in by_turn]
    lost = [(r, n) for r, n in short if n > 0]
    print(f"    follow-ups short of their previous prompt's whole blocks: {len(lost)} of {len(short)} "
          f"({sum(n for _, n in lost)} tokens)")
    joined = [(r, sent, s) for r, sent, s in rows if s]
    if joined:
        to = [1000 * (s["arrival"] - sent) for r, sent, s in joined]
        back = [r["ttft_ms"] - 1000 * (s["arrival"] - sent) - 1000 * s["ttft"] for r, sent, s in joined]
        eng = [1000 * s["ttft"] for r, sent, s in joined]
        chunk = [r.get("first_chunk_ms", r["ttft_ms"]) - 1000 * (s["arrival"] - sent) - 1000 * s["ttft"] for r, sent, s in joined]
        print(f"    client to engine p50 {q(to, .5):4,.0f} max {max(to):5,.0f} ms; vLLM's TTFT p50 {q(eng, .5):6,.0f} "
              f"max {max(eng):6,.0f} ms; vLLM's first token to the client's first text p50 {q(back, .5):4,.0f} max {max(back):5,.0f} ms, "
              f"to its first chunk p50 {q(chunk, .5):4,.0f} max {max(chunk):5,.0f} ms")
    for srv in sorted(burst):
        n_, comp, a, last = burst[srv]
        print(f"    first turns on server {srv}: {n_}, {comp} prompt tokens computed, first arrival to last first token "
              f"{1000 * (last - a):6,.0f} ms ({comp / (last - a):.0f} tokens/s)")
    for g in sorted(groups):
        v = groups[g]
        tt = [r["ttft_ms"] for r, _ in v]
        qu = [1000 * s["queue"] for _, s in v if s]
        pf = [1000 * s["prefill"] for _, s in v if s]
        print(f"    {g:<12} n={len(v):2}  client TTFT p50 {q(tt, .5):6,.0f} p90 {q(tt, .9):6,.0f} max {max(tt):6,.0f} ms; "
              f"vLLM queue p50 {q(qu, .5):5,.0f} max {max(qu, default=0):6,.0f}, prefill p50 {q(pf, .5):5,.0f} max {max(pf, default=0):6,.0f} ms")


def cpu(pids):
    tick = os.sysconf("SC_CLK_TCK")
    children, times = {}, {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        children.setdefault(int(fields[1]), []).append(int(d))
        times[int(d)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo, seen = 0.0, [int(p) for p in pids], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += times.get(p, 0.0)
        todo += children.get(p, [])
    print(f"{total:.2f}")


def kvcounts(paths):
    """Sums kvcount's OUT.json files: {kind: count} over every endpoint."""
    tot = {}
    for p in paths:
        with open(p) as f:
            for c in json.load(f).values():
                for k, v in c.items():
                    tot[k] = tot.get(k, 0) + v
    return tot


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "features":
        e2echeck.features(sys.argv[2].rstrip("/"), sys.argv[3].rstrip("/"), sys.argv[4], int(sys.argv[5]), "vllm")
    elif len(sys.argv) >= 4 and sys.argv[1] == "engines":
        engines(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) >= 3 and sys.argv[1] == "cpu":
        cpu(sys.argv[2:])
    elif len(sys.argv) >= 4 and sys.argv[1] == "otlp":
        otlp(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "tail":
        tail(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) == 5 else 6)
    elif len(sys.argv) >= 4 and sys.argv[1] == "kvcount":
        kvcount(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) in (4, 6) and sys.argv[1] == "events":
        events(sys.argv[2], sys.argv[3], sys.argv[4:] or None)
    elif len(sys.argv) >= 3 and sys.argv[1] == "report":
        report(sys.argv[2:])
    elif sys.argv[1:2] in (["compare"], ["peers"], ["predict"]) and len(sys.argv) >= 3:
        e2echeck.main(sys.argv)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
