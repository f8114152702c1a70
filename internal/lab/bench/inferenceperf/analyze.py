"""Summarises one inference-perf run for run.sh, from the engines' own counts.

    python analyze.py LABEL PER_REQUEST_JSON REPLICA_METRICS...

PER_REQUEST_JSON is inference-perf's per_request_lifecycle_metrics.json;
each request's usage (prompt_tokens, prompt_tokens_details.cached_tokens)
is what the replica that served it reported, and extra_info.chat_round
its turn (1 = a session's first). REPLICA_METRICS are the replicas'
/metrics pages read after the run, for the requests each served (vLLM
names; for llama.cpp its predicted tokens over ANSWER_TOKENS, the
answers' length, from the environment). Prints one JSON object: the
share of prompt tokens reported cached over all turns and over follow-up
turns (round >= 2), TTFT percentiles in ms (first streamed chunk after
the request's start), and the requests per replica.
"""

import json
import os
import re
import sys


def pct(xs, q):
    """The q-quantile of xs by the nearest rank (None when empty)."""
    if not xs:
        return None
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(q * len(xs) + 0.5)) - 1))
    return xs[k]


def served(path):
    """The counts behind a replica's requests in the /metrics page at path:
    ("vllm", its TTFT histogram's count) or ("llamacpp", its predicted
    tokens), or None when it has neither."""
    predicted = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"vllm:time_to_first_token_seconds_count\{[^}]*\} (\S+)", line)
            if m:
                return "vllm", float(m.group(1))
            m = re.match(r"llamacpp:tokens_predicted_total(?:\{[^}]*\})? (\S+)", line)
            if m:
                predicted = float(m.group(1))
    return None if predicted is None else ("llamacpp", predicted)


def replica_requests(path, answer_tokens):
    """Requests the replica at path served: a vLLM-named TTFT histogram's
    count, or for llama.cpp (which counts no requests) its predicted
    tokens over answer_tokens (every answer is that long with ignore_eos;
    None when answer_tokens is 0). With NAME.before.metrics beside
    NAME.metrics (run.sh reads it just before the benchmark), its counts
    are taken off: the readiness probes (one token each, through every
    router) reach the replicas too, and at a few answers a replica they
    would add a request to some (9, 0, 11, 9 where 10 was served)."""
    after = served(path)
    if after is None:
        return 0
    kind, n = after
    base = path[: -len(".metrics")] + ".before.metrics" if path.endswith(".metrics") else None
    if base and os.path.exists(base):
        before = served(base)
        if before is not None and before[0] == kind:
            n -= before[1]
    if kind == "vllm":
        return int(n)
    return round(n / answer_tokens) if answer_tokens > 0 else None


def prompt_and_cached(usage):
    """The prompt tokens and the cached ones of an OpenAI usage object, or
    of an Anthropic one (/v1/messages: input_tokens counts only what was
    neither read from nor written to the cache)."""
    if "prompt_tokens" in usage:
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return int(usage.get("prompt_tokens") or 0), int(cached)
    read = int(usage.get("cache_read_input_tokens") or 0)
    prompt = int(usage.get("input_tokens") or 0) + read + int(usage.get("cache_creation_input_tokens") or 0)
    return prompt, read


def main():
    label, per_request, metrics = sys.argv[1], sys.argv[2], sys.argv[3:]
    answer_tokens = int(os.environ.get("ANSWER_TOKENS") or 0)
    with open(per_request, encoding="utf-8") as f:
        reqs = json.load(f)
    sums = {"all": [0, 0], "follow": [0, 0], "first": [0, 0]}
    ttft, ttft_follow, failed, rounds = [], [], 0, {}
    for r in reqs:
        info = r.get("info") or {}
        usage = (info.get("response_metrics") or {}).get("server_usage") or {}
        if r.get("error") or not usage:
            failed += 1
            continue
        prompt, cached = prompt_and_cached(usage)
        rnd = int((info.get("extra_info") or {}).get("chat_round") or 1)
        rounds[rnd] = rounds.get(rnd, 0) + 1
        for k in ("all", "follow" if rnd >= 2 else "first"):
            sums[k][0] += cached
            sums[k][1] += prompt
        chunks = (info.get("response_metrics") or {}).get("chunk_times") or []
        if chunks:
            t = 1000.0 * (chunks[0] - r["start_time"])
            ttft.append(t)
            if rnd >= 2:
                ttft_follow.append(t)

    def share(k):
        c, p = sums[k]
        return round(c / p, 3) if p else None

    out = {
        "label": label,
        "requests": len(reqs),
        "failed": failed,
        "turns": {str(k): v for k, v in sorted(rounds.items())},
        "cached_all": share("all"),
        "cached_followup": share("follow"),
        "cached_first": share("first"),
        "ttft_ms": {q: round(pct(ttft, v), 1) if ttft else None for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "ttft_followup_ms": {
            q: round(pct(ttft_follow, v), 1) if ttft_follow else None for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
        },
        "per_replica": [replica_requests(m, answer_tokens) for m in metrics],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
