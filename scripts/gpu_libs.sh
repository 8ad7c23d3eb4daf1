#!/usr/bin/env bash
# gpu_libs.sh DEST BIN...: copies into DEST the shared libraries the binaries load that a GPU
# machine may lack (Gloo and its dependencies, libgomp, libstdc++, ...): every library ldd resolves
# except CUDA's own (the GPU machines have the same CUDA 13.0 install) and the C runtime. Used by
# gpu_tests.sh and bench_ab_pack.sh; run the binaries there with LD_LIBRARY_PATH=DEST.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: scripts/gpu_libs.sh DEST BIN..." >&2
  exit 2
fi
dest="$1"
shift
mkdir -p "$dest"
for bin in "$@"; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | { grep -v -E '/usr/local/cuda|/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' || true; } |
  while read -r lib; do cp -L "$lib" "$dest/"; done
