"""Where a run's slow first tokens were spent, by counts over a threshold.

    python tailsplit.py RUN_DIR [THRESHOLD_MS]

RUN_DIR is one run's directory of run.sh's OUT (SHAPE-FRONT). Counts the
requests whose first token took over THRESHOLD_MS [320, a bucket bound
of the routers' histograms]: at the client (inference-perf's record), at
the entry router from its arrival to the first byte it relays
(kvmesh_request_ttft_seconds, route local or peer), at the owner for a
hop, in the routers' upstream legs (kvmesh_upstream_ttft_seconds) and at
the replicas (vllm:time_to_first_token_seconds, over the nearest bucket
bound at or below the threshold). A slow request at the client that no
router counts was slow before the entry router's handler began or after
its first byte left: the client, HAProxy, the network, or the router
process waiting for a CPU. With RUN_DIR.cpu.jsonl (cpushare.py) beside
it, the run's CPU by class: mean % of a core over the seconds
inference-perf ran, and the run-queue wait of each class's threads
(ms per second).
"""

import glob
import json
import os
import re
import statistics
import sys


def buckets(files, name, label):
    b = {}
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(name + "_bucket") and label in line:
                    le = float(re.search(r'le="([^"]+)"', line).group(1))
                    b[le] = b.get(le, 0) + float(line.split()[-1])
    return b


def over(b, t):
    """(count over t, total) of a cumulative histogram, at the bound at or below t."""
    if not b:
        return None
    bound = max((le for le in b if le <= t), default=0)
    return int(b[float("inf")] - b.get(bound, 0)), int(b[float("inf")])


def main():
    run = sys.argv[1].rstrip("/")
    thr = float(sys.argv[2]) if len(sys.argv) > 2 else 320
    recs = json.load(open(run + "/iperf/per_request_lifecycle_metrics.json", encoding="utf-8"))
    t0 = min(r["start_time"] for r in recs)
    ttft = sorted(((r["info"]["response_metrics"]["chunk_times"][0] - r["start_time"]) * 1000, r["start_time"] - t0)
                  for r in recs if not r.get("error") and r["info"]["response_metrics"].get("chunk_times"))
    out = {"run": os.path.basename(run), "threshold_ms": thr, "requests": len(ttft),
           "client": sum(ms > thr for ms, _ in ttft),
           "slowest": [[round(ms), round(at, 1)] for ms, at in ttft[-5:]]}
    routers = sorted(glob.glob(run + "/router-*.metrics"))
    for route in ("local", "peer", "hop"):
        out["router_" + route] = over(buckets(routers, "kvmesh_request_ttft_seconds", f'route="{route}"'), thr / 1000)
    for target in ("local", "peer"):
        out["upstream_" + target] = over(buckets(routers, "kvmesh_upstream_ttft_seconds", f'target="{target}"'), thr / 1000)
    out["replicas"] = over(buckets(sorted(glob.glob(run + "/replica-*.metrics")), "vllm:time_to_first_token_seconds", ""), thr / 1000)
    cpu_file = os.path.dirname(run) + ".cpu.jsonl"
    if os.path.exists(cpu_file):
        with open(cpu_file, encoding="utf-8") as f:
            secs = [s for s in map(json.loads, f) if s.get("iperf", 0) > 0]
        if secs:
            keys = sorted({k for s in secs for k in s} - {"t", "all", "load"})
            out["cpu"] = {k: round(statistics.fmean(s.get(k, 0) for s in secs), 1) for k in keys}
            out["cpu"]["load"] = round(statistics.fmean(s["load"] for s in secs), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
