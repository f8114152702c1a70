#!/usr/bin/env python3
"""Helpers of run.sh, the 1 -> 16 routers suite (Python stdlib only).

  check.py ports N
      prints N free TCP+UDP ports on 127.0.0.1 below the ephemeral range
      (or in [PORTS_FROM, PORTS_TO] when the environment sets them, for a
      machine whose users share out port ranges), all held until every one
      is chosen (gossip binds both protocols).
  check.py wait-mesh MODEL REPLICAS TIMEOUT_S ADMIN_URL...
      waits until every router (its admin base URL) lists every other as an
      alive member and sees REPLICAS replicas healthy serving MODEL, each
      owned by exactly one router; exits non-zero on the timeout with what
      each router saw.
  check.py mesh-summary ADMIN_URL...
      one line per router: members alive, replicas healthy, owned, and the
      summary bytes and ages it holds (the failure report).
  check.py compare RATIO RESULT.json...
      the conversation benchmark's results (kvmesh bench --json), one file
      per router count, the first the one-router run: prints one table, and
      fails unless every turn was answered with usage and each run's
      follow-up cached share (as the replicas reported it) is at least
      RATIO times the one-router run's.

Exits non-zero with the failed check on stderr.
"""
import json
import os
import random
import socket
import sys
import time
import urllib.request


def fail(msg):
    print(f"check.py: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def ports(n):
    try:
        lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    lo = max(lo, 12000)
    first, last = 10000, lo - 2
    if os.environ.get("PORTS_FROM") or os.environ.get("PORTS_TO"):
        try:
            first, last = int(os.environ["PORTS_FROM"]), int(os.environ["PORTS_TO"])
        except (KeyError, ValueError):
            fail("PORTS_FROM and PORTS_TO must both be set, as port numbers")
        if not 1024 <= first <= last <= 65535 or last - first + 1 < n:
            fail(f"ports [{first}, {last}] cannot hold {n} ports")
    held, out = [], []
    for _ in range(50 * n + 1000):
        if len(out) == n:
            break
        p = random.randrange(first, last + 1)
        if p in out:
            continue
        t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            t.bind(("127.0.0.1", p))
            u.bind(("127.0.0.1", p))
        except OSError:
            t.close()
            u.close()
            continue
        held.extend([t, u])
        out.append(p)
    if len(out) != n:
        fail(f"found {len(out)} free ports of {n}")
    print(*out)


def mesh(admin):
    try:
        with urllib.request.urlopen(admin + "/debug/mesh", timeout=2) as r:
            return json.load(r)
    except (OSError, ValueError):
        return None


def view(admin, model, routers):
    """What one router sees: (ok, description)."""
    m = mesh(admin)
    if m is None:
        return False, "no /debug/mesh"
    alive = sum(1 for x in m.get("members") or [] if x.get("state") == "alive")
    reps = m.get("replicas") or []
    healthy = sum(1 for r in reps if r.get("healthy") and model in (r.get("models") or []))
    owned = sum(1 for r in reps if r.get("owned"))
    owners = {r["id"]: r.get("owner") for r in reps}
    return alive == routers, (alive, healthy, owned, owners)


def wait_mesh(model, replicas, timeout, admins):
    deadline = time.monotonic() + timeout
    seen = {}
    while True:
        ok = True
        for a in admins:
            good, seen[a] = view(a, model, len(admins))
            if not good or seen[a][1] != replicas or any(not o for o in seen[a][3].values()):
                ok = False
                break
        if ok:
            # Each replica has one owner, the same at every router.
            owners = [seen[a][3] for a in admins]
            if all(o == owners[0] for o in owners) and len(owners[0]) == replicas:
                return
        if time.monotonic() > deadline:
            for a in admins:
                _, seen[a] = view(a, model, len(admins))
                print(f"  {a}: {seen[a]}", file=sys.stderr)
            fail(f"{len(admins)} routers did not all see each other and {replicas} replicas healthy in {timeout} s")
        time.sleep(0.3)


def mesh_summary(admins):
    for a in admins:
        m = mesh(a)
        if m is None:
            print(f"  {a}: no /debug/mesh")
            continue
        alive = sum(1 for x in m.get("members") or [] if x.get("state") == "alive")
        reps = m.get("replicas") or []
        print(f"  {m.get('name')}: members alive {alive}, replicas healthy "
              f"{sum(1 for r in reps if r.get('healthy'))}/{len(reps)}, owned "
              f"{[r['id'] for r in reps if r.get('owned')]}, summary bytes "
              f"{[r.get('summary_bytes') for r in reps]}, ages s "
              f"{[round(r.get('summary_age_seconds', 0), 1) for r in reps]}")


def compare(ratio, paths):
    results = []
    for p in paths:
        with open(p) as f:
            results.extend(json.load(f)["frontends"])
    print(f"  {'routers':<10} {'turns':>5} {'errors':>6} {'follow-up cached':>16} {'vs x1':>6} {'turn-1 cached':>13} "
          f"{'TTFT p50 ms':>11} {'p99 ms':>8} {'follow-up p50':>13} {'p99':>8} {'wall s':>7}")
    one = results[0]
    for r in results:
        rel = r["followup_cached_share"] / one["followup_cached_share"] if one["followup_cached_share"] else 0
        print(f"  {r['name']:<10} {r['turns']:>5} {r['errors']:>6} {r['followup_cached_share']:>16.3f} {rel:>6.3f} "
              f"{r['first_turn_cached_share']:>13.3f} {r['ttft_p50_ms']:>11.0f} {r['ttft_p99_ms']:>8.0f} "
              f"{r['followup_ttft_p50_ms']:>13.0f} {r['followup_ttft_p99_ms']:>8.0f} {r['wall_seconds']:>7.1f}")
    want = max(r["turns"] for r in results)
    bad = []
    for r in results:
        if r["errors"] or r["no_usage"] or r["turns"] != want:
            bad.append(f"{r['name']}: {r['turns']} turns of {want}, {r['errors']} errors "
                       f"{r.get('errors_by_kind')}, {r['no_usage']} without usage")
    if not one["followup_cached_share"] > 0:
        bad.append(f"{one['name']}: no follow-up token cached")
    for r in results[1:]:
        if r["followup_cached_share"] < ratio * one["followup_cached_share"]:
            bad.append(f"{r['name']}: follow-up cached share {r['followup_cached_share']:.3f} below {ratio}x "
                       f"{one['name']}'s {one['followup_cached_share']:.3f}")
    if bad:
        fail("; ".join(bad))
    print("check.py compare: passed")


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) == 2 and a[0] == "ports":
        ports(int(a[1]))
    elif len(a) >= 5 and a[0] == "wait-mesh":
        wait_mesh(a[1], int(a[2]), float(a[3]), [x.rstrip("/") for x in a[4:]])
    elif len(a) >= 2 and a[0] == "mesh-summary":
        mesh_summary([x.rstrip("/") for x in a[1:]])
    elif len(a) >= 3 and a[0] == "compare":
        compare(float(a[1]), a[2:])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
