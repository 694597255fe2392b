#!/usr/bin/env bash
# The GPU checks in one run, for a borrowed CUDA machine with little time on it: the GPU-marked tests of the offload
# machinery, then the offload and block-swap benchmarks. Logs go to $OUT (or ./gpu_check_output).
#
#   bash scripts/gpu_check.sh                 # on the GPU machine
#   GPU_CHECK_DEVICE=cpu bash scripts/gpu_check.sh   # a dry run of the same steps on the CPU (the tests skip)
#
# A machine whose Python lacks diffusers (or has other versions than constraints.txt) takes wheels from ./.whl:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux2014_x86_64 -d .whl diffusers==0.42.1 transformers==5.24.0 peft==0.21.2
# They are installed into a private folder first, ahead of the machine's own packages.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check_output}"
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu_check_site \
        .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/gpu_check_site:$PYTHONPATH"
fi
"$PYTHON" - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import torch, diffusers, transformers, peft, accelerate
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
print("diffusers", diffusers.__version__, "transformers", transformers.__version__, "peft", peft.__version__,
      "accelerate", accelerate.__version__)
EOF

status=0
step() {  # step NAME SECONDS COMMAND...: runs one check under a time limit, logs it, remembers a failure
    local name="$1" limit="$2"
    shift 2
    echo "=== $name" | tee -a "$OUT/summary.txt"
    timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc" | tee -a "$OUT/summary.txt"
    [ "$rc" -eq 0 ] || status=1
}

# tests/core/data has no GPU test and imports PyAV, which such a machine may lack.
step gpu_tests 200 "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider tests/core --ignore tests/core/data
step bench_offload 180 "$PYTHON" scripts/bench_offload.py --device "$DEVICE" \
    $([ "$DEVICE" = cuda ] && echo --num_blocks 8)
step bench_block_swap 90 "$PYTHON" scripts/bench_block_swap.py --device "$DEVICE" \
    $([ "$DEVICE" = cuda ] && echo --pinned)
exit $status
