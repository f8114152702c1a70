"""Samples, once a second until killed, where the machine's CPU goes during a run.

    python cpushare.py RUN_DIR OUT_JSONL &

One JSON line a second: the machine's busy and total jiffies (100 a
second per core), the load average, and per class of process the CPU
ticks it used and the time its threads waited runnable on a run queue
(wait_CLASS, ms summed over threads: the CPU they wanted and did not
get). A process is the run's when its environment has OUT=RUN_DIR
(run.sh's OUT, which everything it starts inherits); classes: router (kvmesh router), replica (replica-sim or llama-server),
haproxy, smg, iperf (inference-perf); everything else on the machine is
"other".
"""

import json
import os
import sys
import time


def classify(pid, cmd, mark):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if mark not in f.read().split(b"\0"):
                return "other"
    except OSError:
        return "other"
    for name, cls in (("inference-perf --config_file", "iperf"), (" router ", "router"), ("replica-sim", "replica"),
                      ("llama-server", "replica"), ("haproxy -db", "haproxy"), ("smg", "smg")):
        if name in cmd:
            return cls
    return "mine"


def machine():
    with open("/proc/stat", encoding="ascii") as f:
        v = list(map(int, f.readline().split()[1:]))
    return sum(v) - v[3] - v[4], sum(v)


def waited_ns(pid):
    """Run-queue wait of all of pid's threads (schedstat's second field)."""
    w = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                w += int(f.read().split()[1])
    except OSError:
        pass
    return w


def main():
    mark = b"OUT=" + sys.argv[1].encode()
    out = open(sys.argv[2], "a", encoding="utf-8")
    prev = {}
    pb, pt = machine()
    while True:
        time.sleep(1)
        cur, acc = {}, {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat", encoding="ascii", errors="replace") as f:
                    st = f.read()
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = st.rsplit(")", 1)[1].split()
            t = int(fields[11]) + int(fields[12])  # utime + stime
            cur[d] = t
            c = classify(d, cmd, mark)
            acc[c] = acc.get(c, 0) + t - prev.get(d, t)
            if c != "other":
                w, k = waited_ns(d), "w" + d
                acc["wait_" + c] = acc.get("wait_" + c, 0) + (w - prev.get(k, w)) / 1e6
                cur[k] = w
        prev = cur
        b, tt = machine()
        with open("/proc/loadavg", encoding="ascii") as f:
            load = float(f.read().split()[0])
        out.write(json.dumps({"t": round(time.time(), 1), "busy": b - pb, "all": tt - pt, "load": load, **acc}) + "\n")
        out.flush()
        pb, pt = b, tt


if __name__ == "__main__":
    main()
