#!/usr/bin/env bash
# scripts/bench_ab.sh on fake bench_gpu builds whose times are known: the runs alternate base, new;
# the defaults are appended only where the caller gave no value; the summary's ratio and loss
# check; bad arguments exit 2, a failing build 1. scripts/bench_ab_pack.sh (and gpu_libs.sh): each
# build from its tree, the working tree restored, bad arguments exit 2.
set -euo pipefail
ab="$1"
pack="$2"
libs="$3"
dir="${TEST_TMPDIR:-/tmp}/bench_ab_test"
rm -rf "$dir"
mkdir -p "$dir/bin"
fake() {  # fake NAME MS LOSS: a bench_gpu that logs its name and arguments and prints one line
  cat >"$dir/bin/bench_gpu_$1" <<SH
#!/usr/bin/env bash
echo "$1 \$*" >>"$dir/calls.txt"
echo '{"tokens_per_s": 1000.0, "ms_per_step": $2, "peak_mem_gib": 1.5, "loss": $3}'
SH
  chmod +x "$dir/bin/bench_gpu_$1"
}
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
fake base 10.0 2.5
fake new 8.0 2.5
GTRON_AB_DIR="$dir/bin" bash "$ab" --rounds 2 -- --L 12 --B 4 >"$dir/out.txt"
python3 - "$dir/out.txt" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l.get("build") for l in lines[:4]] == ["base", "new", "base", "new"], lines
assert [l["round"] for l in lines[:4]] == [1, 1, 2, 2], lines
s = lines[4]["ab"]
assert s["rounds"] == 2 and s["base_ms"] == [10.0, 10.0] and s["new_ms"] == [8.0, 8.0], s
assert s["new_over_base"] == 1.25, s
assert s["same_loss"] is True, s
PY
grep -q -- "^base --L 12 --B 4 --steps 20 --warmup 5 --D 0 --graphs full$" "$dir/calls.txt" ||
  fail "defaults not appended: $(cat "$dir/calls.txt")"
: >"$dir/calls.txt"
GTRON_AB_DIR="$dir/bin" bash "$ab" --rounds 1 -- --steps 7 --graphs layers >"$dir/out2.txt"
[[ "$(head -1 "$dir/calls.txt")" == "base --steps 7 --graphs layers --warmup 5 --D 0" ]] ||
  fail "given values overridden: $(cat "$dir/calls.txt")"
[[ $(wc -l <"$dir/out2.txt") -eq 3 ]] || fail "one round is two runs and a summary"
fake new 8.0 2.75
GTRON_AB_DIR="$dir/bin" bash "$ab" --rounds 1 -- --B 4 | tail -1 | grep -q '"same_loss": false' ||
  fail "a loss that differs is not reported"
expect_rc() {  # expect_rc RC CMD...: CMD exits with RC
  local want="$1" rc=0
  shift
  "$@" >/dev/null 2>&1 || rc=$?
  [[ $rc -eq $want ]] || fail "'$*' exited $rc, not $want"
}
expect_rc 2 env GTRON_AB_DIR="$dir/bin" bash "$ab" --rounds 0 -- --B 4
expect_rc 2 env GTRON_AB_DIR="$dir/bin" bash "$ab" --rounds
expect_rc 2 env GTRON_AB_DIR="$dir/bin" bash "$ab" --B 4
expect_rc 2 env GTRON_AB_DIR="$dir/nowhere" bash "$ab" -- --B 4
printf '#!/usr/bin/env bash\necho boom >&2\nexit 3\n' >"$dir/bin/bench_gpu_new"
expect_rc 1 env GTRON_AB_DIR="$dir/bin" bash "$ab" -- --B 4
expect_rc 2 bash "$pack"
expect_rc 2 bash "$pack" -x
expect_rc 2 bash "$pack" a b
expect_rc 2 bash "$libs" "$dir/only_dest"

# bench_ab_pack.sh in a scratch repository, with fake bazel, strip and ldd on PATH: the fake
# bazel "builds" a bench_gpu that prints the model source it saw, so the two builds show which
# tree each came from; the working tree must come back as it was, also when a build fails.
repo="$dir/repo"
mkdir -p "$repo/scripts" "$repo/model" "$dir/fakebin"
cp "$pack" "$repo/scripts/bench_ab_pack.sh"
cp "$ab" "$repo/scripts/bench_ab.sh"
cp "$libs" "$repo/scripts/gpu_libs.sh"
cat >"$dir/fakebin/bazel" <<'SH'
#!/usr/bin/env bash
[[ -e "$FAKE_BAZEL_FAIL" ]] && exit 1
mkdir -p bazel-bin/tests/trainer
{ echo '#!/bin/sh'; echo "cat <<'X'"; cat model/*.cc 2>/dev/null; echo X; } >bazel-bin/tests/trainer/bench_gpu
chmod +x bazel-bin/tests/trainer/bench_gpu
SH
cat >"$dir/fakebin/strip" <<'SH'
#!/bin/sh
exit 0
SH
echo "not a library" >"$dir/fakebin/libfake.so.1"
cat >"$dir/fakebin/ldd" <<SH
#!/bin/sh
echo "	libfake.so.1 => $dir/fakebin/libfake.so.1 (0x0)"
SH
chmod +x "$dir/fakebin/bazel" "$dir/fakebin/strip" "$dir/fakebin/ldd"
(
  cd "$repo"
  git init -q .
  git config user.email t@t
  git config user.name t
  echo "int kept = 1;" >model/kept.cc
  echo "int changed = 1;" >model/changed.cc
  echo "int removed = 1;" >model/removed.cc
  git add -A
  git commit -q -m base
  echo "int changed = 2;" >model/changed.cc
  rm model/removed.cc
  echo "int added = 2;" >model/added.cc
  git add -N model/added.cc
)
snapshot() { (cd "$repo/model" && ls && cat ./*.cc); }
before="$(snapshot)"
PATH="$dir/fakebin:$PATH" FAKE_BAZEL_FAIL="$dir/nofile" bash "$repo/scripts/bench_ab_pack.sh" HEAD \
  >"$dir/pack.out" 2>&1 || fail "bench_ab_pack.sh failed: $(cat "$dir/pack.out")"
[[ "$(snapshot)" == "$before" ]] || fail "the working tree was not restored"
base_out="$("$repo/.gpuab/bench_gpu_base")"
new_out="$("$repo/.gpuab/bench_gpu_new")"
if ! { grep -q "changed = 1" <<<"$base_out" && grep -q "removed = 1" <<<"$base_out" &&
  ! grep -q "added" <<<"$base_out"; }; then
  fail "the base build did not see BASE's tree: $base_out"
fi
if ! { grep -q "changed = 2" <<<"$new_out" && grep -q "added = 2" <<<"$new_out" &&
  ! grep -q "removed" <<<"$new_out"; }; then
  fail "the new build did not see the working tree: $new_out"
fi
tar tJf "$repo/.gpupack/ab.tar.xz" >"$dir/pack.list"
if ! { grep -q "^.gpuab/bench_ab.sh$" "$dir/pack.list" &&
  grep -q "^.gpuab/lib/libfake.so.1$" "$dir/pack.list"; }; then
  fail "the pack lacks bench_ab.sh or the library ldd named: $(cat "$dir/pack.list")"
fi
touch "$dir/fail_now"
expect_rc 1 env PATH="$dir/fakebin:$PATH" FAKE_BAZEL_FAIL="$dir/fail_now" \
  bash "$repo/scripts/bench_ab_pack.sh" HEAD
[[ "$(snapshot)" == "$before" ]] || fail "a failed build left BASE's files in the working tree"
(cd "$repo" && git add -A model && git commit -q -m new)  # nothing differs from HEAD now
expect_rc 2 env PATH="$dir/fakebin:$PATH" bash "$repo/scripts/bench_ab_pack.sh" HEAD
echo "bench_ab_test: passed"
