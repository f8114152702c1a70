#!/usr/bin/env python3
"""Checks a kvmesh router in front of real llama.cpp replicas (Python stdlib only).

  check.py features ROUTER_URL ADMIN_URL MODEL REPLICAS SLOTS
      chat and text completions, streamed (stream_options.include_usage) and
      not; the router detects llama.cpp on every replica and reads its
      metrics (load) and /props (slots); cached-token feedback: a second turn
      is served from the engine's prefix cache and the router's kvmesh_*
      counters of reported and predicted cached tokens move by what the
      engine reported.
  check.py compare RESULT.json...
      the conversation benchmark's results (kvmesh bench --json), one file
      per front end, the last the round-robin baseline: every turn answered
      with usage, and each kvmesh front end's follow-up cached share above
      the baseline's. Prints one table.
  check.py peers RUN_DIR...
      the runs kept with KVMESH_ARTIFACTS (each directory's llamacpp-*.json,
      or ../vllm/run.sh's vllm-*.json, but the mesh views and KV-event
      counts): per front end, each run's follow-up cached share and TTFT
      p50/p99 (all turns and follow-ups) and their medians, and whether
      each kvmesh front end's medians meet issue 22's bar against each peer (follow-up
      share at least theirs to 3 decimals, TTFT p50 and p99 at most 1.05x
      theirs). A
      report: it fails only when a run is missing or has errors.
  check.py predict [--gate LO,HI] NAME=LOG[,LOG...]...
      per front end, from its routers' logs (at --log-level debug, a
      "cached tokens" line per response that reported cached tokens): the
      cached tokens predicted against those the engines reported, and the
      prediction error in blocks (|predicted - reported| at the prompt's
      bytes per token) p50/p95/max, its sum (negative: under-predicted),
      the answers with a match (hits), a block or more over-predicted
      (misses) and corrected (forgot), and the cached tokens reported on
      answers that matched nothing (cold cached: a prefix the engine
      shared between requests in flight together, which no summary held
      yet); with --gate, fails unless each front end's predicted/reported
      is within [LO, HI].

The checks are ../common/e2echeck.py's (shared with ../vllm/check.py);
this is their command line for llama.cpp. Exits non-zero with the failed
check on stderr.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import e2echeck  # noqa: E402  (../common, found by the path above)

if __name__ == "__main__":
    if len(sys.argv) == 7 and sys.argv[1] == "features":
        e2echeck.features(sys.argv[2].rstrip("/"), sys.argv[3].rstrip("/"), sys.argv[4], int(sys.argv[5]),
                          "llamacpp", int(sys.argv[6]))
    elif sys.argv[1:2] in (["compare"], ["peers"], ["predict"]) and len(sys.argv) >= 3:
        e2echeck.main(sys.argv)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
