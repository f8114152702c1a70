#!/usr/bin/env python3
"""Replica lifecycle figures on replica-sims (issue 24 item 4), one router.

  measure.py stall KVMESH [--rounds N] [--router-flag F ...]
      Two replica-sims behind one router at its defaults (--stall-window
      8s); clients keep streams running. Each round freezes one replica's
      engine (POST /debug/stall: it still answers /health and /metrics),
      and times the freeze, and the first moment the frozen engine holds a
      request (0 when it held some at the freeze), to the router's stalled
      ejection
      (kvmesh_replica_ejections_total{reason="stalled"}), keeps it frozen
      --hold seconds (noting whether it was re-admitted meanwhile, as a
      replica running nothing is, and ejected again), then resumes it and
      times its return to health. Every request is checked: answered 200 with
      [DONE], or (a stream the frozen replica had begun) ended with an error
      event; anything else is a failure.

  measure.py warm KVMESH [--warm-share S] [--mode add|restart]
      Four replica-sims, three listed in the router's --replica-file, under a
      steady flow of new conversations (cold first turns) and their next
      turns. add: the fourth is added to the file; restart: the third
      replica-sim is restarted empty on its port (the router sees its
      counters go back and cuts its summary). Times, from that moment, the
      replica's first cold request, its summary holding blocks, and its
      summary holding half the mean of the others' (no longer warming), and
      counts the prompt tokens each replica prefilled in the next 20 s. After
      a restart the clock of "holds blocks" starts when the router has cut
      the summary (summary_cut_s).

Ports: BASE_PORT (default 25000) and up. Prints one JSON object per round.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MODEL = "kvmesh-sim"


def http(method, url, body=None, timeout=5):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def wait_until(what, cond, timeout=60, every=0.1):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if cond():
                return
        except OSError:
            pass
        time.sleep(every)
    sys.exit(f"measure: timed out waiting for {what}")


def metric(admin, name, label=""):
    _, b = http("GET", admin + "/metrics")
    total = 0.0
    for line in b.decode().splitlines():
        if line.startswith(name) and (not label or label in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def held_of(admin, replica):
    return (mesh(admin).get(replica) or {}).get("summary_held_blocks", 0)


def mesh(admin):
    _, b = http("GET", admin + "/debug/mesh")
    return {r["id"]: r for r in json.loads(b).get("replicas") or []}


class Procs:
    def __init__(self, work):
        self.work, self.procs = work, {}

    def start(self, name, args):
        log = open(os.path.join(self.work, name + ".log"), "ab")
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=log)

    def stop(self, name):
        p = self.procs.pop(name, None)
        if p is None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    def stop_all(self):
        for n in list(self.procs):
            self.stop(n)


def replica_sim(procs, kvmesh, name, port, extra=()):
    procs.start(name, [kvmesh, "replica-sim", "--listen", f"127.0.0.1:{port}", "--log-level", "warn", *extra])
    url = f"http://127.0.0.1:{port}"
    wait_until(f"{name} up", lambda: http("GET", url + "/health")[0] == 200)
    return url


def router(procs, kvmesh, work, base, replicas=(), replica_file=None, flags=()):
    key = os.path.join(work, "gossip.key")
    with open(key, "w") as f:
        f.write("a" * 32)
    api, admin = f"http://127.0.0.1:{base + 10}", f"http://127.0.0.1:{base + 12}"
    args = [kvmesh, "router", "--name", "m", "--region", "local", "--listen", f"127.0.0.1:{base + 10}",
            "--gossip-bind", f"127.0.0.1:{base + 11}", "--admin-listen", f"127.0.0.1:{base + 12}",
            "--gossip-key-file", key, "--log-level", "info", *flags]
    for r in replicas:
        args += ["--replica", r]
    if replica_file:
        args += ["--replica-file", replica_file]
    procs.start("router", args)
    wait_until("the router", lambda: http("GET", admin + "/healthz")[0] == 200)
    return api, admin


def chat(api, messages, max_tokens, stream, timeout=120, key=None):
    """One chat request; returns (outcome, answer, replica header)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}
    if key:
        body["prompt_cache_key"] = key
    req = urllib.request.Request(api + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
    except urllib.error.HTTPError as e:
        return f"http {e.code}", "", ""
    except OSError as e:
        return f"error {e}", "", ""
    if not stream:
        return "ok", json.loads(raw)["choices"][0]["message"]["content"], ""
    if '"error"' in raw:
        return "error event", "", ""
    if "[DONE]" not in raw:
        return "cut", "", ""
    text = "".join(m for m in re.findall(r'"content":"((?:[^"\\]|\\.)*)"', raw))
    return "ok", text, ""


def stall(args, kvmesh, work, base):
    procs = Procs(work)
    try:
        reps = [replica_sim(procs, kvmesh, f"rep{i}", base + i, ["--decode-ms-per-token", "20"]) for i in range(2)]
        api, admin = router(procs, kvmesh, work, base, replicas=reps, flags=args.router_flag)
        wait_until("both replicas", lambda: sum(1 for r in mesh(admin).values() if r.get("healthy")) == 2)
        outcomes, lock, stop = {}, threading.Lock(), threading.Event()

        def client(i):
            n = 0
            while not stop.is_set():
                n += 1
                o, _, _ = chat(api, [{"role": "user", "content": f"client {i} request {n} " + "words " * 300}], 100, True)
                with lock:
                    outcomes[o] = outcomes.get(o, 0) + 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(5)
        for rnd in range(args.rounds):
            target = reps[rnd % 2]
            before = metric(admin, "kvmesh_replica_ejections_total", 'reason="stalled"')
            t0 = time.time()
            http("POST", target + "/debug/stall")
            work = [None]  # when the frozen engine first held a request (0: at the freeze)

            def ejected_yet():
                if work[0] is None and metric(target, "vllm:num_requests_running") + metric(target, "vllm:num_requests_waiting") > 0:
                    work[0] = time.time() - t0
                return metric(admin, "kvmesh_replica_ejections_total", 'reason="stalled"') > before

            wait_until("the stalled ejection", ejected_yet, timeout=120, every=0.05)
            ejected = time.time() - t0
            # Held frozen for --hold seconds: with nothing left running it
            # is re-admitted, and ejected again if requests reach it.
            readmitted = None
            while time.time() < t0 + ejected + args.hold:
                if readmitted is None and mesh(admin)[target].get("healthy"):
                    readmitted = round(time.time() - t0 - ejected, 2)
                time.sleep(0.05)
            again = metric(admin, "kvmesh_replica_ejections_total", 'reason="stalled"') - before - 1
            t1 = time.time()
            http("POST", target + "/debug/resume")
            wait_until("the re-admission", lambda: mesh(admin)[target].get("healthy"), timeout=120, every=0.05)
            back = time.time() - t1
            print(json.dumps({"round": rnd, "replica": target, "freeze_to_ejected_s": round(ejected, 2),
                              "work_in_flight_after_s": None if work[0] is None else round(work[0], 2),
                              "work_to_ejected_s": None if work[0] is None else round(ejected - work[0], 2),
                              "readmitted_while_frozen_after_s": readmitted, "ejected_again_while_frozen": again,
                              "resume_to_healthy_s": round(back, 2)}), flush=True)
            time.sleep(3)
        stop.set()
        for t in threads:
            t.join()
        checks = {o: metric(admin, "kvmesh_stall_checks_total", f'outcome="{o}"') for o in ("prefilling", "progressing", "stalled")}
        print(json.dumps({"requests": outcomes, "stall_checks": checks,
                          "stalled_requests": metric(admin, "kvmesh_stalled_requests_total"),
                          "ejections_failed_checks": metric(admin, "kvmesh_replica_ejections_total", 'reason="failed_checks"')}), flush=True)
    finally:
        procs.stop_all()


def warm(args, kvmesh, work, base):
    procs = Procs(work)
    try:
        sim = ["--kv-blocks", str(args.kv_blocks), "--decode-ms-per-token", "5", "--max-num-seqs", "8"]
        reps = [replica_sim(procs, kvmesh, f"rep{i}", base + i, sim) for i in range(4)]
        listed = reps if args.mode == "restart" else reps[:3]
        rfile = os.path.join(work, "replicas")
        with open(rfile, "w") as f:
            f.write("".join(r + "\n" for r in listed[:3]))
        flags = ["--warm-share", str(args.warm_share), *args.router_flag]
        api, admin = router(procs, kvmesh, work, base, replica_file=rfile, flags=flags)
        wait_until("three replicas", lambda: sum(1 for r in mesh(admin).values() if r.get("healthy")) == 3)
        target = reps[3] if args.mode == "add" else reps[2]
        taken, lock, stop, conv = {}, threading.Lock(), threading.Event(), [0]
        marked = [None]  # the time of the change

        def client(i):
            while not stop.is_set():
                with lock:
                    conv[0] += 1
                    c = conv[0]
                msgs = [{"role": "user", "content": f"conversation {c}: " + "a document to discuss " * 120}]
                for turn in range(args.turns):
                    t = time.time()
                    o, ans, _ = chat(api, msgs, 16, False, key=f"conversation-{c}" if args.client_keys else None)
                    if o != "ok":
                        break
                    if turn == 0 and marked[0] is not None and t >= marked[0]:
                        with lock:
                            taken["new conversations"] = taken.get("new conversations", 0) + 1
                    msgs += [{"role": "assistant", "content": ans}, {"role": "user", "content": f"and turn {turn + 2}?"}]
                    time.sleep(args.think)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(args.warmup)
        first_prompt = lambda: metric(target, "vllm:prompt_tokens_total")
        start_hits = {r: metric(r, "vllm:prompt_tokens_total") for r in reps}
        held_before = 0
        if args.mode == "add":
            base_prompt = first_prompt()
            marked[0] = time.time()
            with open(rfile, "a") as f:
                f.write(target + "\n")
        else:
            wait_until("the replica to hold blocks", lambda: held_of(admin, target) > 0)
            held_before = held_of(admin, target)
            procs.stop("rep2")
            replica_sim(procs, kvmesh, "rep2", base + 2, sim)
            base_prompt, start_hits[target] = 0.0, 0.0
            marked[0] = time.time()
        t0 = marked[0]
        res = {"mode": args.mode, "warm_share": args.warm_share}
        seen_prompt = [None]

        def held():
            m = mesh(admin)
            r = m.get(target) or {}
            others = [x.get("summary_held_blocks", 0) for k, x in m.items() if k != target and x.get("healthy")]
            return r.get("summary_held_blocks", 0), (sum(others) / len(others) if others else 0), r.get("healthy")

        end = t0 + args.watch
        first_req = holds = warm_at = cut = None
        if args.mode == "add":
            cut = 0.0
        while time.time() < end and (first_req is None or holds is None or warm_at is None):
            now = time.time() - t0
            try:
                if first_req is None and first_prompt() > base_prompt:
                    first_req = now
                h, mean, ok = held()
                if cut is None and h < held_before / 2:
                    cut = now  # the router saw the restart and cut the summary
                if cut is not None and ok and holds is None and h > 0:
                    holds = now
                if holds is not None and warm_at is None and mean > 0 and 2 * h >= mean:
                    warm_at = now
            except OSError:
                pass
            time.sleep(0.05)
        res["summary_cut_s"] = cut
        res.update({k: v if v is None else round(v, 2) for k, v in
                    {"first_request_s": first_req, "holds_cache_s": holds, "half_mean_s": warm_at}.items()})
        time.sleep(max(0.0, t0 + args.watch - time.time()))
        h, mean, _ = held()
        res.update({"held_blocks_at_end": h, "others_mean_held_at_end": round(mean)})
        res["decisions"] = {r: metric(admin, "kvmesh_route_decisions_total", f'reason="{r}"')
                            for r in ("prefix", "spill", "fallback-cold", "warm-up")}
        res["conversations"] = conv[0]
        got = {r: metric(r, "vllm:prompt_tokens_total") - start_hits[r] for r in reps}
        res["replica_share_of_prompt_tokens"] = round(got[target] / max(sum(got.values()), 1), 3)
        stop.set()
        for t in threads:
            t.join()
        print(json.dumps(res), flush=True)
    finally:
        procs.stop_all()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["stall", "warm"])
    ap.add_argument("kvmesh")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--hold", type=float, default=15, help="stall: seconds a replica stays frozen after its ejection")
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--router-flag", action="append", default=[])
    ap.add_argument("--warm-share", type=float, default=0.5)
    ap.add_argument("--mode", choices=["add", "restart"], default="add")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--think", type=float, default=0.5)
    ap.add_argument("--warmup", type=float, default=20)
    ap.add_argument("--watch", type=float, default=30)
    ap.add_argument("--client-keys", action="store_true", help="warm: each conversation sends prompt_cache_key")
    ap.add_argument("--kv-blocks", type=int, default=4096)
    args = ap.parse_args()
    base = int(os.environ.get("BASE_PORT", "25000"))
    work = tempfile.mkdtemp(prefix="kvmesh-lifecycle.")
    kvmesh = os.path.abspath(args.kvmesh)
    try:
        (stall if args.what == "stall" else warm)(args, kvmesh, work, base)
    except SystemExit:
        for f in sorted(os.listdir(work)):
            if f.endswith(".log"):
                print(f"--- {f}", file=sys.stderr)
                print(open(os.path.join(work, f), errors="replace").read()[-3000:], file=sys.stderr)
        raise


if __name__ == "__main__":
    main()
