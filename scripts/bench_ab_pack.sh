#!/usr/bin/env bash
# Builds bench_gpu twice, from BASE (a git revision) and from the working tree, and packs both
# with the shared libraries they need into .gpupack/ab.tar.xz (git-ignored) for scripts/bench_ab.sh
# on a GPU machine: an A/B of two builds alternating in one device command, the way a kernel
# change is measured (a ratio against the reference in the same command).
#   bash scripts/bench_ab_pack.sh HEAD        # the uncommitted change against the last commit
#   bash scripts/bench_ab_pack.sh 119024d     # everything since a commit
# Only the files that differ from BASE under the directories bench_gpu is built from are swapped
# (in place, restored on exit, even on failure), so the second build reuses the Bazel cache of
# the first: a one-file change costs one compile and one link each way. Untracked files are not
# swapped (git diff does not see them): `git add -N` a new source first.
set -euo pipefail
if [[ $# -ne 1 || "$1" == -* ]]; then
  echo "usage: scripts/bench_ab_pack.sh BASE_REV" >&2
  exit 2
fi
base="$1"
cd "$(dirname "$0")/.."
if ! git rev-parse --verify --quiet "$base^{commit}" >/dev/null; then
  echo "bench_ab_pack.sh: '$base' is not a commit of this repository" >&2
  exit 2
fi
dirs=(model graphs memory parallel trainer tests/trainer third_party bazel)
mapfile -t changed < <(git diff --name-only "$base" -- "${dirs[@]}")
if [[ ${#changed[@]} -eq 0 ]]; then
  echo "bench_ab_pack.sh: no file under ${dirs[*]} differs from $base: nothing to compare" >&2
  exit 2
fi
keep="$(mktemp -d)"
restore() {  # the working tree's versions back (a file absent there is removed again)
  for f in "${changed[@]}"; do
    if [[ -e "$keep/tree/$f" ]]; then
      cp -p "$keep/tree/$f" "$f"
    else
      rm -f "$f"
    fi
  done
  rm -rf "$keep"
}
for f in "${changed[@]}"; do
  if [[ -e "$f" ]]; then
    mkdir -p "$keep/tree/$(dirname "$f")"
    cp -p "$f" "$keep/tree/$f"
  fi
done
trap restore EXIT
echo "bench_ab_pack.sh: ${#changed[@]} file(s) differ from $base: ${changed[*]}" >&2
rm -rf .gpuab
mkdir -p .gpuab
build_as() {  # build_as NAME: build bench_gpu and keep it, stripped, as .gpuab/bench_gpu_NAME
  bazel build //tests/trainer:bench_gpu
  cp bazel-bin/tests/trainer/bench_gpu ".gpuab/bench_gpu_$1"
  chmod u+w ".gpuab/bench_gpu_$1"
  strip --strip-unneeded ".gpuab/bench_gpu_$1"
}
for f in "${changed[@]}"; do
  if git cat-file -e "$base:$f" 2>/dev/null; then
    mkdir -p "$(dirname "$f")"
    git show "$base:$f" >"$f"
  else
    rm -f "$f"  # added since BASE
  fi
done
build_as base
restore
trap - EXIT
build_as new
bash scripts/gpu_libs.sh .gpuab/lib .gpuab/bench_gpu_base .gpuab/bench_gpu_new
cp scripts/bench_ab.sh .gpuab/
mkdir -p .gpupack
XZ_OPT="-6 --lzma2=dict=256MiB -T1" tar cJf .gpupack/ab.tar.xz .gpuab
ls -l .gpupack/ab.tar.xz
echo "on the GPU machine (carry .gpupack): tar xJf .gpupack/ab.tar.xz && .gpuab/bench_ab.sh -- ARGS" >&2
