#!/usr/bin/env bash
# The attention sweep of issue 49 in one command: bench_attention (gtron's flash kernels, every
# variant; tests/model/bench_attention.cc) and scripts/bench_attention.py (cuDNN's and
# FlashAttention-2's kernels through PyTorch) on the same cells, then the table of both
# (bench_attention.py --table): per cell gtron, cudnn and fa2 TFLOP/s forward and backward and
# gtron / cudnn. docs/gpu-kernels.md ("The attention sweep") says how to read it.
#
#   scripts/bench_attention.sh [FLAGS]   on the GPU machine
#   scripts/bench_attention.sh --pack    here: builds bench_attention into .gpubin/attention/
#                                        (stripped, plus the shared libraries a GPU machine may
#                                        lack) to carry there; prints its size
#
# FLAGS go to both (--hs, --modes, --T, --tokens, --width, --group, --warmup, --repeats, --rotate,
# --tol, --seed), except --variants (bench_attention's only) and --backends (bench_attention.py's
# only). The JSON lines are kept in $GTRON_BENCH_DIR (default: a new temporary folder) as
# gtron.jsonl and torch.jsonl. Exit status 1 if either run failed a check or failed outright (the
# table is printed first), else 0.
#
# The binary: bench_attention next to this script, in .gpubin/attention/ or .gpubin/, else Bazel's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"

if [[ "${1:-}" == "--pack" ]]; then
  cd "$root"
  bazel build //tests/model:bench_attention
  mkdir -p .gpubin/attention
  cp bazel-bin/tests/model/bench_attention .gpubin/attention/
  chmod u+w .gpubin/attention/bench_attention
  strip --strip-unneeded .gpubin/attention/bench_attention
  bash scripts/gpu_libs.sh .gpubin/attention/lib .gpubin/attention/bench_attention
  du -sh .gpubin/attention
  exit 0
fi

py="$here/bench_attention.py"
bin=""
for cand in "$here/bench_attention" "$root/.gpubin/attention/bench_attention" \
  "$root/.gpubin/bench_attention"; do
  if [[ -x "$cand" ]]; then
    bin="$cand"
    break
  fi
done
if [[ -z "$bin" ]]; then
  (cd "$root" && { bazel build //tests/model:bench_attention >/dev/null 2>&1 ||
    bazel build //tests/model:bench_attention >&2; })
  bin="$root/bazel-bin/tests/model/bench_attention"
fi
# The libraries packed beside the binary, for the binary alone (PyTorch keeps the machine's own).
bin_libs="${LD_LIBRARY_PATH:-}"
if [[ -d "$(dirname "$bin")/lib" ]]; then
  bin_libs="$(dirname "$bin")/lib${bin_libs:+:$bin_libs}"
fi

# Split the flags: --variants to the binary, --backends to the Python script, the rest to both.
g_args=()
t_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --variants)
      g_args+=("$1" "${2:?--variants needs a value}")
      shift 2
      ;;
    --backends)
      t_args+=("$1" "${2:?--backends needs a value}")
      shift 2
      ;;
    --list | --help | -h)
      echo "bench_attention.sh: $1 is for bench_attention or bench_attention.py themselves" >&2
      exit 2
      ;;
    *)
      g_args+=("$1")
      t_args+=("$1")
      shift
      ;;
  esac
done

dir="${GTRON_BENCH_DIR:-$(mktemp -d)}"
mkdir -p "$dir"
set +e
LD_LIBRARY_PATH="$bin_libs" "$bin" "${g_args[@]}" | tee "$dir/gtron.jsonl"
g_rc=${PIPESTATUS[0]}
PYTHONUNBUFFERED=1 python3 "$py" "${t_args[@]}" | tee "$dir/torch.jsonl"
t_rc=${PIPESTATUS[0]}
set -e
python3 "$py" --table "$dir/gtron.jsonl" "$dir/torch.jsonl"
echo "bench_attention.sh: JSON lines in $dir; exit bench_attention $g_rc, bench_attention.py $t_rc"
[[ $g_rc -eq 0 && $t_rc -eq 0 ]]
