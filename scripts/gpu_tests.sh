#!/usr/bin/env bash
# Builds every GPU test (tags = ["gpu"]), the GPU benchmarks and gtron itself (for
# scripts/bench_multigpu.py), and copies the binaries into
# .gpubin/ (git-ignored), flat, so they can be carried to a GPU machine without Bazel and run:
#   export LD_LIBRARY_PATH=$PWD/.gpubin/lib
#   for t in .gpubin/*_test; do "$t" || echo "FAILED: $t"; done
#   .gpubin/bench_gpu --D 0; .gpubin/bench_gpu --D 1      (or scripts/bench_gpu.sh there)
# The binaries link everything statically except cuBLAS/cuBLASLt (and NCCL), which the GPU
# machines have in the same CUDA 13.0 install. No test reads runfiles: trainer tests write under
# $TEST_TMPDIR, or /tmp when it is unset.
#
# GTRON_GPU_PACK=1 also writes .gpupack/gpubin.tar.xz (see the end).
# Arguments (optional): name filters — only the tests whose name contains one of them are copied
# (bench_gpu, bench_add_norm, bench_norm, bench_attention, bench_fp8_gemm, bench_grouped and gtron
# always are).
# The whole set is about 67 MB, above a 64 MiB carry limit: carry it in two batches, e.g.
# `bash scripts/gpu_tests.sh _cuda_test` (the op and trainer tests) and then
# `bash scripts/gpu_tests.sh nccl gtp`. The attention sweep alone:
# `scripts/bench_attention.sh --pack`.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t all_tests < <(bazel query 'attr(tags, "\bgpu\b", tests(//...))' 2>/dev/null)
tests=()
for t in "${all_tests[@]}"; do
  if [[ $# -eq 0 ]]; then tests+=("$t"); continue; fi
  for f in "$@"; do
    if [[ "${t##*:}" == *"$f"* ]]; then tests+=("$t"); break; fi
  done
done
if [[ ${#tests[@]} -eq 0 ]]; then
  echo "gpu_tests.sh: no gpu-tagged tests found" >&2
  exit 1
fi
benches=(//tests/trainer:bench_gpu //tests/model:bench_add_norm //tests/model:bench_norm
  //tests/model:bench_attention //tests/model:bench_fp8_gemm //tests/model:bench_grouped
  //trainer:gtron
  //tests/trainer:libkernel_trace.so)
bazel build "${tests[@]}" "${benches[@]}"
rm -rf .gpubin
mkdir -p .gpubin
for label in "${tests[@]}" "${benches[@]}"; do
  path="bazel-bin/${label#//}"
  path="${path/://}"
  cp "$path" .gpubin/
  chmod u+w ".gpubin/$(basename "$path")"
  strip --strip-unneeded ".gpubin/$(basename "$path")"  # the carry limit is 64 MiB
done
cp scripts/bench_gpu.sh scripts/bench_gpu_bin.sh scripts/bench_torch.py scripts/bench_torch_moe.py \
  scripts/profile_gpu.sh scripts/profile_table.py scripts/trace_gpu.sh scripts/trace_table.py \
  scripts/power_gpu.sh scripts/kernel_compare.py scripts/bench_attention.sh \
  scripts/bench_attention.py scripts/bench_fp8_gemm.sh scripts/bench_fp8_gemm.py .gpubin/
# Shared libraries of this image that a GPU machine may lack (Gloo and its dependencies, libgomp):
# run there with LD_LIBRARY_PATH=.gpubin/lib. CUDA's own libraries and the C runtime stay out.
bash scripts/gpu_libs.sh .gpubin/lib .gpubin/*_test .gpubin/bench_{gpu,add_norm,norm,attention} \
  .gpubin/gtron
# CUPTI for scripts/trace_gpu.sh's injection library (part of the toolkit here; a GPU machine's
# CUDA install may lack it).
cp -L "$(ldd .gpubin/libkernel_trace.so | awk '/libcupti/ {print $3}')" .gpubin/lib/
ls -1 .gpubin .gpubin/lib
# GTRON_GPU_PACK=1: also pack .gpubin into .gpupack/gpubin.tar.xz (git-ignored; static binaries
# compress about 5x, so the whole set travels under the 64 MiB carry limit). On the GPU machine:
#   tar xJf .gpupack/gpubin.tar.xz      (recreates .gpubin/)
if [[ "${GTRON_GPU_PACK:-0}" == "1" ]]; then
  mkdir -p .gpupack
  rm -f .gpupack/gpubin.tar.xz  # only the pack: other things carried beside it stay
  # A 512 MiB window, one thread: the copies of the CUDA fatbin that every binary carries (~9 MB
  # each) compress against each other across the whole set (a 64 MiB window stopped reaching
  # them once the set passed it). 462 MB -> 14 MB in about 4.5 minutes here (2026-12-04).
  XZ_OPT="-6 --lzma2=dict=512MiB -T1" tar cJf .gpupack/gpubin.tar.xz .gpubin
  ls -l .gpupack/gpubin.tar.xz
fi
