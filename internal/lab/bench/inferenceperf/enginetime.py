"""Splits one llama.cpp run's TTFT into the engines' prefill and the rest.

    python enginetime.py PER_REQUEST_JSON LLAMA_LOG...

PER_REQUEST_JSON is inference-perf's per_request_lifecycle_metrics.json,
LLAMA_LOG the run's llama-server logs (run.sh keeps them under
OUT/logs/RUN/). Each `prompt eval time = X ms / N tokens` line of a log is
one request's prefill of its N uncached tokens. Prints one JSON object:
the engines' prefill ms per token over the prompts of more than 100
uncached tokens (the machine's speed during the run: every front end
asks the same work of it), and the mean of each request's TTFT less its
prefill (what the front end, the network and any wait for a slot add;
the sum of the prefills over the requests, as the lines do not name
their request). The readiness probes' prefills ("ready?", a few tokens)
are left out by size.
"""

import json
import re
import statistics
import sys

LINE = re.compile(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
PROBE_TOKENS = 8  # "ready?" with its BOS is under this; every turn is over it


def main():
    records = json.load(open(sys.argv[1], encoding="utf-8"))
    ttfts = []
    for r in records:
        if r.get("error"):
            continue
        info = r.get("info") or {}
        chunks = (info.get("response_metrics") or {}).get("chunk_times") or []
        if r.get("start_time") is None or not chunks:
            continue
        ttfts.append((chunks[0] - r["start_time"]) * 1000)
    evals = []
    for path in sys.argv[2:]:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = LINE.search(line)
                if m and int(m.group(2)) >= PROBE_TOKENS:
                    evals.append((float(m.group(1)), int(m.group(2))))
    big = [(ms, n) for ms, n in evals if n > 100]
    out = {
        "requests": len(ttfts),
        "prefills": len(evals),
        "prefill_ms_per_token": round(sum(ms for ms, _ in big) / sum(n for _, n in big), 2) if big else None,
        "ttft_mean_ms": round(statistics.fmean(ttfts), 1) if ttfts else None,
        "prefill_mean_ms": round(sum(ms for ms, _ in evals) / len(ttfts), 1) if ttfts else None,
    }
    if ttfts:
        out["ttft_minus_prefill_mean_ms"] = round(out["ttft_mean_ms"] - out["prefill_mean_ms"], 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
