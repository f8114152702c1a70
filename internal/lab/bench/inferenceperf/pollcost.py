"""Does a router's polling slow a llama-server's prefill?

    python pollcost.py BASE[,BASE...] REPS MODE[,MODE...] [PROMPTS]

Replays a fixed sequence of distinct ~470-token prompts (6 answer tokens,
one at a time) to the first BASE in blocks of PROMPTS [5], one block per
MODE per repetition, with a poller reading every BASE at that mode's
rates during the block:

    quiet    nothing
    kvmesh   what a kvmesh router asks of a llama.cpp replica (proxy/health
             defaults): /metrics every 1 s, /health and /v1/models every
             2 s, /props every 30 s
    heavy    /metrics and /slots every 0.1 s, /health and /v1/models every
             0.2 s, /props every 1 s

The order of the modes rotates every repetition (ABBA for two), so a
drift of the machine's load falls on every mode alike. Prints one JSON
line per block with the engine's own prompt-eval ms per token (the
`timings` llama-server returns) and the polls' latencies, then each
mode's median and its median ratio to the first mode over the
repetitions. Start the replicas with internal/lab/e2e/llamacpp/start.sh
(e.g. `EXTRA_ARGS=--swa-full start.sh 4 24500`), and run it under the
benchmark lock on a shared machine.
"""

import json
import random
import statistics
import sys
import threading
import time
import urllib.request

POLLS = {
    "quiet": [],
    "kvmesh": [("/metrics", 1.0), ("/health", 2.0), ("/v1/models", 2.0), ("/props", 30.0)],
    "heavy": [("/metrics", 0.1), ("/slots", 0.1), ("/health", 0.2), ("/v1/models", 0.2), ("/props", 1.0)],
}
WORDS = ["alpha", "river", "stone", "quiet", "market", "yellow", "engine", "paper", "garden", "window", "silver",
         "forest", "number", "travel", "winter", "signal", "bridge", "castle", "planet", "copper", "motion",
         "velvet", "harbor", "lantern"]


def prompt(i):
    """Prompt i: its own first words, so no slot holds any of it."""
    r = random.Random(i)
    return f"Document {i} {r.random()}: " + " ".join(r.choice(WORDS) for _ in range(450))


def get(url):
    with urllib.request.urlopen(url, timeout=30) as f:
        return f.read()


def complete(base, text):
    body = {"model": "m", "prompt": text, "max_tokens": 6, "temperature": 0}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as f:
        return json.loads(f.read())


def poller(stop, bases, spec, lat):
    """Reads each path of spec at its period from every base until stop."""
    due = {p: 0.0 for p, _ in spec}
    t0 = time.monotonic()
    while not stop.is_set():
        now = time.monotonic() - t0
        for path, period in spec:
            if now < due[path]:
                continue
            for b in bases:
                s = time.monotonic()
                try:
                    get(b + path)
                except OSError as e:
                    print("poll", b + path, e, file=sys.stderr)
                lat.setdefault(path, []).append((time.monotonic() - s) * 1000)
            due[path] = now + period
        stop.wait(0.02)


def order(modes, rep):
    """ABBA for two modes; a rotation, reversed every other time, for more."""
    if len(modes) == 2:
        return modes if rep % 4 in (0, 3) else modes[::-1]
    k = rep % len(modes)
    o = modes[k:] + modes[:k]
    return o if rep % 2 == 0 else o[::-1]


def main():
    bases = sys.argv[1].split(",")
    reps = int(sys.argv[2])
    modes = sys.argv[3].split(",")
    per_block = int(sys.argv[4]) if len(sys.argv) > 4 else 5
    for m in modes:
        if m not in POLLS:
            sys.exit(f"pollcost: unknown mode {m} (one of {', '.join(POLLS)})")
    seq, res = 0, {}
    for rep in range(reps):
        for mode in order(modes, rep):
            stop, lat = threading.Event(), {}
            th = threading.Thread(target=poller, args=(stop, bases, POLLS[mode], lat))
            th.start()
            n = ms = 0.0
            try:
                for _ in range(per_block):
                    seq += 1
                    t = complete(bases[0], prompt(seq)).get("timings") or {}
                    n += t.get("prompt_n", 0)
                    ms += t.get("prompt_ms", 0)
            finally:
                stop.set()
                th.join()
            if not n:
                sys.exit("pollcost: the engine returned no timings (not llama-server?)")
            res.setdefault(mode, {})[rep] = ms / n
            print(json.dumps({"rep": rep, "mode": mode, "prompt_tokens": int(n), "ms_per_token": round(ms / n, 3),
                              "polls": {p: len(v) for p, v in lat.items()},
                              "poll_p50_ms": {p: round(statistics.median(v), 1) for p, v in lat.items()},
                              "poll_max_ms": {p: round(max(v), 1) for p, v in lat.items()}}), flush=True)
    ref = modes[0]
    for m in modes:
        v = [res[m][r] for r in range(reps)]
        ratio = [res[m][r] / res[ref][r] for r in range(reps)]
        print(json.dumps({"mode": m, "ms_per_token_median": round(statistics.median(v), 3),
                          f"ratio_to_{ref}_median": round(statistics.median(ratio), 3),
                          f"slower_than_{ref}": sum(x > 1 for x in ratio), "of": reps}))


if __name__ == "__main__":
    main()
