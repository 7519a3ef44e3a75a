#!/usr/bin/env bash
# Everything `kvplan measure` is for, on one CUDA GPU, in one go (about 4 minutes on an H100 or H200):
#   1. the device, driver, torch and triton versions;
#   2. `kvplan measure --quick`: the self-check of every kernel against its torch reference on this GPU, then the
#      probes, GEMVs and decode kernels over 8 MB to 1 GB, fitted, written as a calibration profile;
#   3. `kvplan measure --validate llama3-8b`: a synthetic decode step of Llama-3-8B's shapes, measured against the
#      roofline and the calibrated prediction, for bf16, fp8 and int4 KV caches.
# Everything lands in OUTDIR (default: $OUT where that is set, else ./device-check): calibration.yaml (the
# profile to keep under hardware/calibration/), and one log per step.
#
#   bash benchmarks/device_check.sh [OUTDIR]
#
# Run from the repository root. kvplan needs typer, rich, pydantic and pyyaml beside torch and triton; where the
# machine lacks some, put their wheels in .whl/ (pip download --no-deps --only-binary=:all: ...) and the script
# installs them into /tmp/site first.
set -euo pipefail
out=${1:-${OUT:-device-check}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TRITON_INTERPRET

step() { echo "== $*" | tee -a "$out/steps.log"; }

step "device"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv || true
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} 2>&1 | tee "$out/device.log"

step "measure --quick"
python3 -m kvplan measure --quick --output "$out/calibration.yaml" 2>&1 | tee "$out/measure.log"

for dtype in auto fp8 int4_per_token_head; do
    step "validate llama3-8b, KV $dtype"
    python3 -m kvplan measure --validate llama3-8b -d "$dtype" --calibration "$out/calibration.yaml" 2>&1 \
        | tee "$out/validate-$dtype.log"
done
step "done: $out/calibration.yaml"
