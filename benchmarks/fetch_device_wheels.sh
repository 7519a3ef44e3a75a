#!/usr/bin/env bash
# Download the wheels benchmarks/device_wheels.txt lists into DEST (default .whl/), for the GPU machine's Python
# (CPython 3.12 by default, x86-64 manylinux), where an index is reachable:
#
#   bash benchmarks/fetch_device_wheels.sh [DEST] [PYTHON_VERSION]
#
# benchmarks/device_check.sh then installs them on a machine with no index.
set -uo pipefail
dest=${1:-.whl}
py=${2:-3.12}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest"
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux1_x86_64; do
    plat+=(--platform "$p")
done
grep -v '^\s*#' "$here/device_wheels.txt" | grep -v '^\s*$' | xargs python3 -m pip download -q --no-deps \
    --only-binary=:all: --python-version "$py" --implementation cp "${plat[@]}" -d "$dest"
