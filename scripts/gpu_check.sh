#!/usr/bin/env bash
# GPU verification of the engine work (vLLM on CUDA, weight sync, trainer on CUDA,
# a short GRPO run). Needs a Python with CUDA torch and vllm installed: PYTHON=...
# Bounded to 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" timeout 480 "$PYTHON" scripts/gpu_check.py
