#!/usr/bin/env bash
# GPU check of the state-movement kernels (issue 4): the GPU tests, the sm_90 compile check and the
# bandwidth benchmark, run from the source tree with the machine's own torch/triton. Installs nothing.
#
#   bash benchmarks/gpu_check.sh            # results under $OUT if set, else benchmarks/out/
#
# Budget: about 1-2 minutes once the machine is up (tests ~30-60 s, mostly JIT compiles; benchmark ~20 s).
# Exit status: 0 when every step passed, else the first failing step's status.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO"
RESULTS="${OUT:-$REPO/benchmarks/out}"
mkdir -p "$RESULTS"
PY="${PYTHON:-python3}"

# `kernels/` is installed as `mamba_radix_kernels`; from the source tree a symlink provides that name.
SHIM="$(mktemp -d)"
trap 'rm -rf "$SHIM"' EXIT
ln -s "$REPO/kernels" "$SHIM/mamba_radix_kernels"
export PYTHONPATH="$REPO:$SHIM${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET

status=0
step() {  # step NAME TIMEOUT CMD...: run, tee the log, remember the first failure
    local name="$1" limit="$2"; shift 2
    echo "=== $name: $*" | tee "$RESULTS/$name.log"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$RESULTS/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$RESULTS/$name.log"
    if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then status=$rc; fi
}

step env 60 "$PY" -c "
import sys, torch, triton, numpy
print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)
print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '-')
import mamba_radix_kernels as K; print('kernels from', K.__file__, 'HAS_TRITON', K.HAS_TRITON)
"
nvidia-smi --query-gpu=name,memory.total,clocks.max.mem,driver_version --format=csv > "$RESULTS/nvidia-smi.csv" 2>&1 || true

if "$PY" -c "import pytest, hypothesis" 2>/dev/null; then
    step tests 300 "$PY" -m pytest -q -p no:cacheprovider property_tests/test_kernels.py \
        property_tests/test_state_ops.py --junitxml="$RESULTS/junit.xml"
else
    echo "pytest/hypothesis not importable here: GPU tests skipped" | tee "$RESULTS/tests.log"
fi
step compile 120 "$PY" -m mamba_radix_kernels.compile_check --arch 90
step bench 300 "$PY" benchmarks/bench_kernels.py --json "$RESULTS/bench_kernels.json"
echo "results in $RESULTS (exit $status)"
exit "$status"
