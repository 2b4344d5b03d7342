#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the package installed in editable mode.
#
# - Reuses a torch that is already importable by the chosen Python (the venv sees system site-packages).
# - Never pulls the multi-GB CUDA build of torch onto a CPU machine: when no torch is present it installs
#   the CPU build (from a local wheel where this machine kind keeps one, else from PyTorch's CPU index).
# - Re-running is cheap: a stamp file records the hash of pyproject.toml, setup.py, the C extensions' sources
#   (mamba_radix/_cwalk.c, _ctokens.c, _cstate.c, _cfree.c: a change rebuilds them) and this script.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
VENV="${VENV:-.venv}"
STAMP="$VENV/.mamba_radix_installed"
want="$(cat pyproject.toml setup.py mamba_radix/_cwalk.c mamba_radix/_ctokens.c mamba_radix/_cstate.c mamba_radix/_cfree.c scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import mamba_radix, torch" 2>/dev/null; then
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV" >&2
    "$PYTHON" -m venv --system-site-packages "$VENV"
fi
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# Some machines list package-index folders in their pip config that do not exist; pip warns once per
# package. Drop that one warning, keep everything else (pipefail keeps pip's exit status).
quiet() { "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if ls /opt/wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then
        echo "bootstrap: installing the CPU build of torch from the local wheel" >&2
        quiet "${pip[@]}" "torch==2.13.0"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        echo "bootstrap: installing torch (a GPU is present)" >&2
        quiet "${pip[@]}" torch
    else
        echo "bootstrap: installing the CPU build of torch" >&2
        quiet "${pip[@]}" torch --index-url https://download.pytorch.org/whl/cpu
    fi
fi

echo "bootstrap: installing mamba_radix (editable) with the [test] extra: pytest, hypothesis, ruff," >&2
echo "bootstrap:   triton 3.6.0 (its CPU interpreter runs the kernel tests), and the extras the tests use:" >&2
echo "bootstrap:   [experiments] matplotlib + tqdm, [engine] transformers, [ray] ray (about 80 MB);" >&2
echo "bootstrap:   and the [docs] extra, mkdocs + mkdocs-material (make docs);" >&2
echo "bootstrap:   about 2 min on a fresh machine (100 s measured), a few seconds when they are already there" >&2
start=$(date +%s)
quiet "${pip[@]}" -e ".[test,docs]" "triton==3.6.0; platform_system == 'Linux'"
echo "bootstrap: done in $(( $(date +%s) - start )) s" >&2
echo "$want" > "$STAMP"
