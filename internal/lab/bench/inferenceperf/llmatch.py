"""Matches a llama.cpp run's requests to the replicas' prefills by time.

    python llmatch.py OUT SHAPE-FRONT

OUT is run.sh's output directory, SHAPE-FRONT one run in it (g3x2-kvmesh-8).
Pairs the client's requests (inference-perf's record, in start order)
with the prompts the replicas launched (their logs' `launch_slot_` and
`prompt eval time` lines, in launch order; the readiness probes' few
tokens left out), the clocks aligned on the first request. Per request:
the replica, TTFT, the engine's prefill and its tokens, the time from
the request's start to its launch at the replica (a wait for another
prompt's prefill on the same server shows here), and the rest of the
TTFT beyond the prefill (HAProxy, the routers, the hop, tokenizing).
Meaningful at the low rates of the llama.cpp shapes, where requests are
seconds apart; check that launch-start stays near 0 for most requests.
"""

import glob
import json
import re
import sys

LAUNCH = re.compile(r"(\d+\.\d+\.\d+)\.\d+ I slot launch_slot_: id\s+\d+ \| task (\d+)")
EVAL = re.compile(r"\d+\.\d+\.\d+\.\d+ I slot print_timing: id\s+\d+ \| task (\d+) \| prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
PROBE_TOKENS = 8  # as enginetime.py


def seconds(stamp):
    m, s, ms = stamp.split(".")
    return int(m) * 60 + int(s) + int(ms) / 1000


def main():
    out, run = sys.argv[1].rstrip("/"), sys.argv[2]
    recs = json.load(open(f"{out}/{run}/iperf/per_request_lifecycle_metrics.json", encoding="utf-8"))
    reqs = sorted((r["start_time"], (r["info"]["response_metrics"]["chunk_times"][0] - r["start_time"]) * 1000)
                  for r in recs if not r.get("error") and r["info"]["response_metrics"].get("chunk_times"))
    evs = []
    for path in sorted(glob.glob(f"{out}/logs/{run}/realengine-*.log")):
        port, launch = path.rsplit("-", 1)[1].split(".")[0], {}
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if m := LAUNCH.match(line):
                    launch[m.group(2)] = seconds(m.group(1))
                elif (m := EVAL.match(line)) and int(m.group(3)) >= PROBE_TOKENS and m.group(1) in launch:
                    evs.append((launch[m.group(1)], port, float(m.group(2)), int(m.group(3))))
    evs.sort()
    if not reqs or len(evs) != len(reqs):
        sys.exit(f"llmatch: {len(reqs)} requests but {len(evs)} prefills: cannot pair them")
    off = evs[0][0] - reqs[0][0]
    for (start, ttft), (at, port, ms, n) in zip(reqs, evs):
        print(json.dumps({"t": round(start - reqs[0][0], 1), "replica": port, "ttft_ms": round(ttft),
                          "prefill_ms": round(ms), "tokens": n, "launch_after_start_ms": round((at - off - start) * 1000),
                          "rest_ms": round(ttft - ms)}))


if __name__ == "__main__":
    main()
