"""Client routing keys across two routers that cannot gossip.

Each router fronts the same replicas and knows nothing of the other's
requests. A request carrying a client routing key (prompt_cache_key, the
session header, or SGLang's bootstrap_room) must land on the same replica
from either router, whatever its prompt; different keys must spread over
the replicas. Which replica served a request is read from the replicas' own
vllm:generation_tokens_total counters (requests are sent one at a time).

Environment: KVMESH_URLS (the two routers' base URLs, space-separated),
KVMESH_REPLICAS (the replicas' base URLs, space-separated), KVMESH_MODEL,
KVMESH_ADMINS (the routers' admin base URLs: on a mismatch, the decision
each router made is printed).
"""

import os
import sys
import urllib.request
import uuid

from openai import OpenAI

ROUTERS = os.environ["KVMESH_URLS"].split()
ADMINS = os.environ.get("KVMESH_ADMINS", "").split()
REPLICAS = os.environ["KVMESH_REPLICAS"].split()
MODEL = os.environ.get("KVMESH_MODEL", "kvmesh-sim")
KEYS = 16
clients = [OpenAI(base_url=u + "/v1", api_key="unused", max_retries=0, timeout=30) for u in ROUTERS]
RUN = str(uuid.uuid4())


def generated(replica):
    with urllib.request.urlopen(replica + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                return float(line.split()[-1])
    raise RuntimeError(f"{replica}/metrics has no vllm:generation_tokens_total")


def decisions(admin):
    """The router's kvmesh_route_decisions_total by reason."""
    out = {}
    with urllib.request.urlopen(admin + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("kvmesh_route_decisions_total{"):
                out[line.split('reason="')[1].split('"')[0]] = float(line.split()[-1])
    return out


def served_by(send):
    """Runs send() and returns the index of the replica that generated for it."""
    before = [generated(r) for r in REPLICAS]
    send()
    grew = [i for i, r in enumerate(REPLICAS) if generated(r) > before[i]]
    if len(grew) != 1:
        raise RuntimeError(f"{len(grew)} replicas generated for one request")
    return grew[0]


def chat(client, prompt, **kw):
    return lambda: client.chat.completions.create(
        model=MODEL, max_tokens=2, messages=[{"role": "user", "content": prompt}], **kw
    )


kinds = {
    "prompt_cache_key": lambda c, key, prompt: chat(c, prompt, prompt_cache_key=key),
    "session header": lambda c, key, prompt: chat(c, prompt, extra_headers={"X-Session-ID": key}),
    "bootstrap_room": lambda c, key, prompt: chat(c, prompt, extra_body={"bootstrap_room": int(key.split("-")[-1]) * 7919 + 1}),
}
failed = False
for kind, make in kinds.items():
    used = set()
    for k in range(KEYS):
        key = f"{RUN}-{k}"
        places, reasons = [], []
        for i, c in enumerate(clients):
            # A different prompt from each router, sharing nothing at the front.
            prompt = f"{uuid.uuid4()} router {i} asks about key {k}. " * 40
            before = decisions(ADMINS[i]) if ADMINS else {}
            places.append(served_by(make(c, key, prompt)))
            if ADMINS:
                after = decisions(ADMINS[i])
                reasons.append(",".join(r for r in after if after[r] != before.get(r, 0)))
        if places[0] != places[1]:
            print(f"FAIL {kind}: key {k} went to replica {places[0]} from router 1 and {places[1]} from router 2 (decisions: {reasons})", file=sys.stderr)
            failed = True
        used.add(places[0])
    if len(used) < 2:
        print(f"FAIL {kind}: {KEYS} keys all went to replica {used}: the key does not spread", file=sys.stderr)
        failed = True
    elif not failed:
        print(f"ok   {kind}: {KEYS} keys, each on one replica from both routers, over {len(used)} replicas")
if failed:
    sys.exit(1)
print("all key checks passed")
