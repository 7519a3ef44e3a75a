#!/usr/bin/env bash
# Everything `kvplan measure` is for, on one CUDA GPU, in one go (about 6 minutes on an H100 or H200):
#   wheels    install the wheels of benchmarks/device_wheels.txt from .whl/ (where the machine has no index;
#             benchmarks/fetch_device_wheels.sh downloads them), each one checked present first;
#   wheels-alone
#             benchmarks/wheels_alone.py: the same wheels installed from .whl/ alone (no index, dependencies from
#             that folder only) into an empty virtual environment where torch and triton are the only other
#             packages, and kvplan's measure path and kernels imported there: the set is all the device needs;
#   imports   kvplan, torch, triton and kvplan's own requirements import, with their versions;
#   device    the GPU, driver, torch and triton versions;
#   measure   `kvplan measure --quick`: the self-check of every decode and write kernel against its torch
#             reference at the timed shapes, then the probes, GEMVs and decode kernels over 8 MB to 1 GB, fitted,
#             written as a calibration profile;
#   validate-auto, validate-fp8, validate-int4_per_token_head
#             `kvplan measure --validate llama3-8b`: a synthetic decode step of Llama-3-8B's shapes against the
#             roofline and the calibrated prediction, for bf16, fp8 and int4 KV caches;
#   probe     `kvplan measure --probe`: the bf16 and fp8 decode kernels' tile sizes, warps, stages and splits, and
#             the L2 flush methods, swept for at most 90 seconds, the findings written as probe.json.
# Every step runs, whatever the earlier ones did. Everything lands in OUTDIR (default: $OUT where that is set, else
# ./device-check), in four files: results.tsv (one line per step: its name, exit status and seconds),
# steps.log (each step's output under a "== step" header), calibration.yaml (the profile to keep under
# hardware/calibration/) and probe.json (the probe's findings). The script exits 0 when every step passed, 1
# otherwise.
#
#   bash benchmarks/device_check.sh [OUTDIR]
#
# Run from the repository root.
set -uo pipefail
out=${1:-${OUT:-device-check}}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
unset TRITON_INTERPRET
: >"$out/steps.log"
printf 'step\tstatus\tseconds\n' >"$out/results.tsv"
failed=0

# run_step NAME COMMAND...: the command's output into steps.log (and the terminal), its result into results.tsv
run_step() {
    local name=$1 t0 rc
    shift
    echo "== $name: $*" | tee -a "$out/steps.log"
    t0=$(date +%s)
    "$@" 2>&1 | tee -a "$out/steps.log"
    rc=${PIPESTATUS[0]}
    printf '%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >>"$out/results.tsv"
    echo "== $name: exit $rc" | tee -a "$out/steps.log"
    [ "$rc" -eq 0 ] || failed=1
    return 0
}

install_wheels() {
    local missing=0 line name
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "no wheels in .whl/: kvplan's requirements must already be installed"
        return 0
    fi
    while read -r line; do
        line=${line%%#*}
        name=${line%%==*}
        [ -n "${name// /}" ] || continue
        # wheel file names spell the project name in lower case with underscores
        if ! compgen -G ".whl/$(echo "$name" | tr 'A-Z-' 'a-z_')-${line##*==}-*.whl" >/dev/null; then
            echo "missing wheel: $line"
            missing=1
        fi
    done <"$here/device_wheels.txt"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || return 1
    return $missing
}

wheels_alone() {
    if ! compgen -G ".whl/*.whl" >/dev/null; then
        echo "no wheels in .whl/: nothing to check"
        return 0
    fi
    python3 "$here/wheels_alone.py" --wheels .whl
}

imports() {
    python3 -c "
import torch, triton, typer, pydantic, yaml, rich, kvplan.app.cli
print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)
print('typer', typer.__version__, 'pydantic', pydantic.VERSION, 'pyyaml', yaml.__version__)
print('gpu', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none visible to torch')"
}

device() {
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
}

run_step wheels install_wheels
run_step wheels-alone wheels_alone
export PYTHONPATH=/tmp/site:$PYTHONPATH  # the installed wheels first, where there were any
run_step imports imports
run_step device device
run_step measure python3 -m kvplan measure --quick --output "$out/calibration.yaml"
cal=()
[ -f "$out/calibration.yaml" ] && cal=(--calibration "$out/calibration.yaml")
for dtype in auto fp8 int4_per_token_head; do
    run_step "validate-$dtype" python3 -m kvplan measure --validate llama3-8b -d "$dtype" "${cal[@]}"
done
run_step probe python3 -m kvplan measure --probe --budget 90 --output "$out/probe.json"
echo "== results ($out/results.tsv)"
cat "$out/results.tsv"
exit $failed
