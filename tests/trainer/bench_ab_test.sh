#!/usr/bin/env bash
# scripts/bench_ab.sh on fake bench_gpu builds whose times are known: the runs alternate base, new;
# the defaults are appended only where the caller gave no value; the summary's ratio and loss
# check; bad arguments exit 2, a failing build 1. scripts/bench_ab_pack.sh: bad arguments exit 2.
set -euo pipefail
ab="$1"
pack="$2"
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
echo "bench_ab_test: passed"
