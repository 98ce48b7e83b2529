#!/usr/bin/env bash
# Idempotent set-up: apt packages (when missing), .venv, torch first, then the
# package with its dev extras under a torch==2.13.0 constraint.
set -euo pipefail
cd "$(dirname "$0")/.."

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

[[ -x .venv/bin/python ]] || python3 -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch first: the pinned CPU build. A bare "torch" would pull GBs of CUDA wheels.
.venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
    || "${PIP[@]}" torch==2.13.0
"${PIP[@]}" -c constraints.txt -e ".[dev]"
echo "setup: done ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
