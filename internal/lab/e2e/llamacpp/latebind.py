#!/usr/bin/env python3
"""latebind.py RUN_DIR...: the table of latebind.sh's runs, in the order
given (the order they ran): per run its arm, turns answered and errors,
follow-up cached share, TTFT p50/p90/p99 of all turns and of follow-ups,
wall time, late-binding holds (every router's
kvmesh_late_bind_holds_total) and the share of answers that ran to their
max_tokens; then each arm's medians, and on/off as the ratio of the
medians and the median of the ratios of the runs side by side (each run
paired with its neighbour of the other arm, in order)."""
import json
import os
import statistics
import sys

COLS = [("turns", "turns"), ("errors", "errors"), ("followup_cached_share", "f-up cached"),
        ("ttft_p50_ms", "p50"), ("ttft_p90_ms", "p90"), ("ttft_p99_ms", "p99"),
        ("followup_ttft_p50_ms", "f p50"), ("followup_ttft_p90_ms", "f p90"), ("followup_ttft_p99_ms", "f p99"),
        ("wall_seconds", "wall s"), ("holds", "holds"), ("to_max", "to max")]


def load(d):
    with open(os.path.join(d, "bench.json")) as f:
        r = json.load(f)["frontends"][0]
    with open(os.path.join(d, "arm")) as f:
        r["arm"] = f.read().strip()
    holds = 0.0
    for name in sorted(os.listdir(d)):
        if name.startswith("router-") and name.endswith(".metrics.txt"):
            with open(os.path.join(d, name)) as f:
                for line in f:
                    if line.startswith("kvmesh_late_bind_holds_total"):
                        holds += float(line.split()[-1])
    r["holds"] = holds
    done = [q for q in r.get("requests") or [] if not q.get("error")]
    r["to_max"] = sum(1 for q in done if q.get("completion_tokens") == q.get("max_tokens")) / max(len(done), 1)
    r["dir"] = os.path.basename(os.path.normpath(d))
    return r


def fmt(k, v):
    if k in ("followup_cached_share", "to_max"):
        return f"{v:.3f}"
    if k == "wall_seconds":
        return f"{v:.1f}"
    return f"{v:.0f}"


def main(dirs):
    runs = [load(d) for d in dirs]
    print("| run | arm | " + " | ".join(h for _, h in COLS) + " |")
    print("|---|---|" + "---|" * len(COLS))
    for r in runs:
        print(f"| {r['dir']} | {r['arm']} | " + " | ".join(fmt(k, r[k]) for k, _ in COLS) + " |")
    med = {}
    for arm in ("off", "on"):
        rs = [r for r in runs if r["arm"] == arm]
        if rs:
            med[arm] = {k: statistics.median(r[k] for r in rs) for k, _ in COLS}
            print(f"| median ({len(rs)}) | {arm} | " + " | ".join(fmt(k, med[arm][k]) for k, _ in COLS) + " |")
    if len(med) < 2:
        return
    # Side by side: the i-th off run with the i-th on run.
    offs = [r for r in runs if r["arm"] == "off"]
    ons = [r for r in runs if r["arm"] == "on"]
    pairs = list(zip(offs, ons))
    ratio_cols = [(k, h) for k, h in COLS if k not in ("turns", "errors", "holds", "to_max")]
    print()
    print("| on/off | " + " | ".join(h for _, h in ratio_cols) + " |")
    print("|---|" + "---|" * len(ratio_cols))
    print("| ratio of medians | " + " | ".join(
        f"{med['on'][k] / med['off'][k]:.3f}" if med['off'][k] else "-" for k, _ in ratio_cols) + " |")
    print(f"| median of {len(pairs)} paired ratios | " + " | ".join(
        f"{statistics.median(b[k] / a[k] for a, b in pairs if a[k]):.3f}" for k, _ in ratio_cols) + " |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
