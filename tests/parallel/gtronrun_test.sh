#!/usr/bin/env bash
# scripts/gtronrun end to end: the rank environment, failure propagation (exit code, SIGTERM then
# SIGKILL of the siblings, no process left), two launchers as two nodes of one job running real
# Gloo collectives, logs, signal forwarding (SIGTERM/SIGINT reach every worker, which may take its
# time to exit; --signal-timeout; a second signal), --max-restarts, and argument errors (exit 2).
#
# Usage: gtronrun_test.sh GTRONRUN DIST_WORKER
set -u

GTRONRUN="$1"
WORKER="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
TMP="${TEST_TMPDIR:-$(mktemp -d)}/gtronrun_test"
rm -rf "$TMP"
mkdir -p "$TMP"
FAILURES=0

fail() {
  echo "FAIL: $*" >&2
  FAILURES=$((FAILURES + 1))
}

expect_eq() {  # expect_eq WHAT GOT WANT
  if [[ "$2" != "$3" ]]; then fail "$1: got '$2', want '$3'"; fi
}

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# A launcher that fails to stop its workers must fail this test, not hang it: runs get a deadline
# (and expect_gone then kills what was left behind).
bounded() { timeout -k 2 30 "$@"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Whether process PID still runs. A zombie does not count: a killed grandchild of the launcher is
# reparented to PID 1, which may reap it a moment later (kill -0 still succeeds on a zombie). A
# process signalled to death may also need a moment to be scheduled and die on a loaded machine,
# so it gets up to 2 s; one that nobody signalled (sleep 300) still runs then.
running() {  # running PID
  local deadline=$((SECONDS + 2))
  while kill -0 "$1" 2>/dev/null; do
    local state
    state="$(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null)"
    if [[ "$state" == "Z" || "$state" == "X" ]]; then return 1; fi
    if ((SECONDS > deadline)); then return 0; fi
    sleep 0.05
  done
  return 1
}

# Every pid listed in the files must be gone.
expect_gone() {  # expect_gone WHAT FILE...
  local what="$1"
  shift
  for f in "$@"; do
    if [[ ! -s "$f" ]]; then fail "$what: no pid file $f"; continue; fi
    local pid
    pid="$(cat "$f")"
    if running "$pid"; then
      fail "$what: process $pid ($f) is still running"
      kill -9 "$pid" 2>/dev/null
    fi
  done
}

# --- 1. The environment of 3 ranks on one node; OMP_NUM_THREADS defaults to 1; logs.
PORT="$(free_port)"
ENV_DIR="$TMP/env"
mkdir -p "$ENV_DIR"
OUT="$(env -u OMP_NUM_THREADS "$GTRONRUN" --nproc-per-node 3 --master-port "$PORT" \
  --log-dir "$TMP/logs" -- bash -c \
  'echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS" > "$0/$RANK"; echo "hello from $RANK"' \
  "$ENV_DIR")"
expect_eq "env run exit code" "$?" "0"
for r in 0 1 2; do
  expect_eq "rank $r environment" "$(cat "$ENV_DIR/$r" 2>/dev/null)" \
    "$r $r 3 3 0 127.0.0.1 $PORT 1"
  expect_eq "rank $r log" "$(cat "$TMP/logs/rank_$r.log" 2>/dev/null)" "hello from $r"
  if ! grep -qx "\[rank $r\] hello from $r" <<<"$OUT"; then fail "console line of rank $r: $OUT"; fi
done
# An OMP_NUM_THREADS already set is kept; the command may also come without "--".
expect_eq "OMP_NUM_THREADS kept" \
  "$(OMP_NUM_THREADS=4 "$GTRONRUN" --standalone bash -c 'echo $OMP_NUM_THREADS')" "[rank 0] 4"

# --- 2. A worker exits 3: the launcher exits 3 and kills a sleeping sibling (and its child).
PIDS="$TMP/pids"
mkdir -p "$PIDS"
START="$(now)"
bounded "$GTRONRUN" --standalone --nproc-per-node 3 --grace 5 -- bash -c '
  echo $$ > "$0/worker_$RANK"
  if [[ $RANK == 1 ]]; then
    for r in 0 2; do while [[ ! -s "$0/child_$r" ]]; do sleep 0.05; done; done
    exit 3
  fi
  sleep 300 & echo $! > "$0/child_$RANK"
  wait' "$PIDS" 2>"$TMP/fail.err"
expect_eq "failing run exit code" "$?" "3"
T="$(elapsed "$START")"
if ! less_than "$T" 4; then fail "failure took ${T}s to propagate (SIGTERM should suffice)"; fi
grep -q "rank 1 exited with code 3" "$TMP/fail.err" || fail "no failure message: $(cat "$TMP/fail.err")"
expect_gone "after a failure" "$PIDS"/worker_0 "$PIDS"/worker_1 "$PIDS"/worker_2 \
  "$PIDS"/child_0 "$PIDS"/child_2

# --- 3. A sibling that ignores SIGTERM is killed after the grace period.
PIDS="$TMP/pids_stubborn"
mkdir -p "$PIDS"
START="$(now)"
bounded "$GTRONRUN" --standalone --nproc-per-node 2 --grace 1 -- bash -c '
  if [[ $RANK == 0 ]]; then
    trap "" TERM
    echo $$ > "$0/worker_0"
    while true; do sleep 0.1; done
  fi
  while [[ ! -s "$0/worker_0" ]]; do sleep 0.05; done
  exit 5' "$PIDS" 2>/dev/null
expect_eq "stubborn run exit code" "$?" "5"
T="$(elapsed "$START")"
if less_than "$T" 0.9 || ! less_than "$T" 4; then fail "SIGKILL after a 1 s grace took ${T}s"; fi
expect_gone "after SIGKILL" "$PIDS"/worker_0

# --- 4. SIGTERM to the launcher stops every worker; exit code 128 + 15.
PIDS="$TMP/pids_signal"
mkdir -p "$PIDS"
"$GTRONRUN" --standalone --nproc-per-node 2 -- bash -c \
  'sleep 300 & echo $! > "$0/child_$RANK"; wait' "$PIDS" 2>/dev/null &
LAUNCHER=$!
while [[ ! -s "$PIDS/child_0" || ! -s "$PIDS/child_1" ]]; do sleep 0.05; done
kill -TERM "$LAUNCHER"
( sleep 30 && kill -KILL "$LAUNCHER" 2>/dev/null ) &
WATCHDOG=$!
wait "$LAUNCHER"
expect_eq "signalled launcher exit code" "$?" "143"
kill "$WATCHDOG" 2>/dev/null
expect_gone "after SIGTERM to the launcher" "$PIDS"/child_0 "$PIDS"/child_1

# --- 5. Two nodes on localhost: 2 launchers x 2 ranks, one job with real Gloo collectives.
PORT="$(free_port)"
RESULTS="$TMP/two_nodes"
mkdir -p "$RESULTS"
bounded "$GTRONRUN" --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-port "$PORT" \
  "$WORKER" "$RESULTS" 2 >"$TMP/node1.out" 2>&1 &
NODE1=$!
bounded "$GTRONRUN" --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-port "$PORT" \
  -- "$WORKER" "$RESULTS" 2 >"$TMP/node0.out" 2>&1
expect_eq "node 0 exit code" "$?" "0"
wait "$NODE1"
expect_eq "node 1 exit code" "$?" "0"
# rank world local_rank local_world group_rank sum(rank + 1) gtp_members dp_members
expect_eq "rank 0" "$(cat "$RESULTS/rank_0.txt" 2>/dev/null)" "0 4 0 2 0 10 0,1 0,2"
expect_eq "rank 1" "$(cat "$RESULTS/rank_1.txt" 2>/dev/null)" "1 4 1 2 0 10 0,1 1,3"
expect_eq "rank 2" "$(cat "$RESULTS/rank_2.txt" 2>/dev/null)" "2 4 0 2 1 10 2,3 0,2"
expect_eq "rank 3" "$(cat "$RESULTS/rank_3.txt" 2>/dev/null)" "3 4 1 2 1 10 2,3 1,3"
if [[ $FAILURES -gt 0 ]]; then
  echo "--- node 0 output"; cat "$TMP/node0.out"; echo "--- node 1 output"; cat "$TMP/node1.out"
fi

# --- 6. Bad arguments exit 2 with a message.
expect_bad() {  # expect_bad MESSAGE ARGS...
  local want="$1"
  shift
  local err
  err="$("$GTRONRUN" "$@" 2>&1 >/dev/null)"
  local code=$?
  expect_eq "exit code of gtronrun $*" "$code" "2"
  if ! grep -q -- "$want" <<<"$err"; then fail "gtronrun $*: no '$want' in: $err"; fi
}
expect_bad "nnodes must be >= 1" --nnodes 0 true
expect_bad "node-rank must be in \[0, 1\]" --nnodes 2 --node-rank 2 true
expect_bad "missing the command" --nproc-per-node 2
expect_bad "missing the command" --nproc-per-node 2 --
expect_bad "master-port must be in \[1, 65535\]" --master-port 70000 true
expect_bad "nproc-per-node must be >= 1" --nproc-per-node 0 true
expect_bad "standalone runs one node" --standalone --nnodes 2 true
expect_bad "invalid int value" --nnodes two true
expect_bad "max-restarts must be >= 0, got -1" --max-restarts -1 true
expect_bad "max-restarts 1 is supported only for --nnodes 1" --nnodes 2 --max-restarts 1 true
expect_bad "signal-timeout must be >= 0" --signal-timeout -1 true
"$GTRONRUN" --help | grep -q -- "--log-dir" || fail "--help does not document --log-dir"
"$GTRONRUN" --help | grep -q -- "--max-restarts" || fail "--help does not document --max-restarts"

# Starts gtronrun in the background (pid in $LAUNCHER) with a 30 s watchdog ($WATCHDOG), stderr
# to $TMP/$NAME.err. The caller waits for its workers to be ready, signals it, then calls
# wait_launcher.
launch() {  # launch NAME GTRONRUN_ARGS...
  local name="$1"
  shift
  "$GTRONRUN" "$@" 2>"$TMP/$name.err" &
  LAUNCHER=$!
  ( sleep 30 && kill -KILL "$LAUNCHER" 2>/dev/null ) &
  WATCHDOG=$!
}
wait_launcher() {  # exit code of the launcher in $CODE
  wait "$LAUNCHER"
  CODE=$?
  kill "$WATCHDOG" 2>/dev/null
  wait "$WATCHDOG" 2>/dev/null
}
wait_files() {  # wait_files FILE...: until each exists (at most 20 s)
  local deadline=$((SECONDS + 20))
  for f in "$@"; do
    while [[ ! -e "$f" ]]; do
      if ((SECONDS > deadline)); then fail "timed out waiting for $f"; return 1; fi
      sleep 0.05
    done
  done
}

# --- 7. SIGTERM is forwarded to every worker, which finishes its work (1 s, well past --grace)
# and exits 143 by itself; the launcher exits 143 and no worker counts as failed.
DIR="$TMP/sigterm"
mkdir -p "$DIR"
START="$(now)"
launch sigterm --standalone --nproc-per-node 3 --grace 0.1 -- bash -c '
  trap "sleep 1; echo TERM > \"\$0/term_\$RANK\"; exit 143" TERM
  echo $$ > "$0/worker_$RANK"
  touch "$0/ready_$RANK"
  while true; do sleep 0.05; done' "$DIR"
wait_files "$DIR"/ready_{0,1,2}
kill -TERM "$LAUNCHER"
wait_launcher
expect_eq "SIGTERM: launcher exit code" "$CODE" "143"
T="$(elapsed "$START")"
if ! less_than "$T" 10; then fail "SIGTERM: took ${T}s"; fi
for r in 0 1 2; do
  expect_eq "SIGTERM: marker of rank $r" "$(cat "$DIR/term_$r" 2>/dev/null)" "TERM"
done
grep -q "got SIGTERM; forwarding it" "$TMP/sigterm.err" ||
  fail "SIGTERM: no forwarding message: $(cat "$TMP/sigterm.err")"
if grep -q "exited with code" "$TMP/sigterm.err"; then
  fail "SIGTERM: a worker exiting 143 was reported: $(cat "$TMP/sigterm.err")"
fi
expect_gone "after a forwarded SIGTERM" "$DIR"/worker_{0,1,2}

# --- 8. SIGINT likewise (Python workers): each gets SIGINT, not SIGTERM; the launcher exits 130.
DIR="$TMP/sigint"
mkdir -p "$DIR"
launch sigint --standalone --nproc-per-node 2 -- python3 -c '
import os, signal, sys, time
d, rank = sys.argv[1], os.environ["RANK"]
def on(sig, frame):
    open(os.path.join(d, "sig_" + rank), "w").write(signal.Signals(sig).name)
    sys.exit(130 if sig == signal.SIGINT else 143)
signal.signal(signal.SIGINT, on)
signal.signal(signal.SIGTERM, on)
open(os.path.join(d, "ready_" + rank), "w").close()
while True:
    time.sleep(0.05)' "$DIR"
wait_files "$DIR"/ready_{0,1}
kill -INT "$LAUNCHER"
wait_launcher
expect_eq "SIGINT: launcher exit code" "$CODE" "130"
for r in 0 1; do
  expect_eq "SIGINT: signal seen by rank $r" "$(cat "$DIR/sig_$r" 2>/dev/null)" "SIGINT"
done

# --- 9. Workers that ignore the forwarded signal: killed after --signal-timeout (not --grace, not
# at once), and at once on a second signal.
DIR="$TMP/sigtimeout"
mkdir -p "$DIR"
launch sigtimeout --standalone --nproc-per-node 2 --grace 0 --signal-timeout 1.5 -- bash -c '
  trap "" TERM
  echo $$ > "$0/worker_$RANK"
  while true; do sleep 0.05; done' "$DIR"
wait_files "$DIR"/worker_{0,1}
START="$(now)"
kill -TERM "$LAUNCHER"
wait_launcher
T="$(elapsed "$START")"
expect_eq "signal timeout: launcher exit code" "$CODE" "143"
if less_than "$T" 1.4 || ! less_than "$T" 5; then fail "SIGKILL after a 1.5 s signal timeout took ${T}s"; fi
grep -q "still running 1.5 s after SIGTERM" "$TMP/sigtimeout.err" ||
  fail "signal timeout: no message: $(cat "$TMP/sigtimeout.err")"
grep -q "rank 0 exited with code 137 after SIGTERM" "$TMP/sigtimeout.err" ||
  fail "signal timeout: the killed rank is not reported: $(cat "$TMP/sigtimeout.err")"
expect_gone "after the signal timeout" "$DIR"/worker_{0,1}

DIR="$TMP/second_signal"
mkdir -p "$DIR"
launch second_signal --standalone --nproc-per-node 2 -- bash -c '
  trap "touch \"\$0/term_\$RANK\"" TERM
  echo $$ > "$0/worker_$RANK"
  while true; do sleep 0.05; done' "$DIR"
wait_files "$DIR"/worker_{0,1}
kill -TERM "$LAUNCHER"
wait_files "$DIR"/term_{0,1}
START="$(now)"
kill -INT "$LAUNCHER"
wait_launcher
T="$(elapsed "$START")"
expect_eq "second signal: launcher exit code (the first signal's)" "$CODE" "143"
if ! less_than "$T" 3; then fail "second signal: took ${T}s to kill (the timeout is 120 s)"; fi
grep -q "got a second signal (SIGINT)" "$TMP/second_signal.err" ||
  fail "second signal: no message: $(cat "$TMP/second_signal.err")"
expect_gone "after a second signal" "$DIR"/worker_{0,1}

# --- 10. --max-restarts 2, rank 1 fails on attempt 0 only: the group runs twice and exits 0. Rank
# 0 of attempt 0 is stopped (it would sleep for ever), each attempt sees its restart count in both
# variables, and --standalone picks a fresh port for the restart.
DIR="$TMP/restart"
mkdir -p "$DIR"
bounded "$GTRONRUN" --standalone --nproc-per-node 2 --max-restarts 2 --log-dir "$DIR/logs" \
  -- bash -c '
  echo "$GTRON_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT" >> "$0/runs_$RANK"
  echo "$MASTER_PORT" >> "$0/ports_$RANK"
  echo "attempt $GTRON_RESTART_COUNT"
  if [[ $GTRON_RESTART_COUNT == 0 ]]; then
    if [[ $RANK == 1 ]]; then while [[ ! -s "$0/child" ]]; do sleep 0.05; done; exit 7; fi
    sleep 300 & echo $! > "$0/child"; wait
  fi
  exit 0' "$DIR" 2>"$TMP/restart.err"
expect_eq "restart: exit code" "$?" "0"
for r in 0 1; do
  expect_eq "restart: attempts of rank $r" "$(cat "$DIR/runs_$r" 2>/dev/null | tr '\n' ,)" "0 0,1 1,"
  expect_eq "restart: log of rank $r" "$(cat "$DIR/logs/rank_$r.log" 2>/dev/null | tr '\n' ,)" \
    "attempt 0,gtronrun: restart 1 of 2,attempt 1,"
done
expect_eq "restart: restart lines" \
  "$(grep -c "restarting the group" "$TMP/restart.err")" "1"
grep -qx "gtronrun: rank 1 exited with code 7; restarting the group (restart 1 of 2)" \
  "$TMP/restart.err" || fail "restart: no restart line: $(cat "$TMP/restart.err")"
P0="$(sed -n 1p "$DIR/ports_0" 2>/dev/null)"
P1="$(sed -n 2p "$DIR/ports_0" 2>/dev/null)"
if [[ -z "$P0" || -z "$P1" || "$P0" == "$P1" ]]; then
  fail "restart: --standalone should pick a fresh port, got '$P0' then '$P1'"
fi
expect_eq "restart: both ranks share the port" "$(cat "$DIR/ports_1" 2>/dev/null)" \
  "$(cat "$DIR/ports_0" 2>/dev/null)"
expect_gone "restart: the stopped attempt" "$DIR/child"

# --- 11. Restarts exhausted: a worker that always exits 9 runs 1 + 2 times, then the launcher
# exits 9. An explicit --master-port is kept across restarts.
DIR="$TMP/exhausted"
mkdir -p "$DIR"
PORT="$(free_port)"
bounded "$GTRONRUN" --nproc-per-node 2 --master-port "$PORT" --max-restarts 2 --grace 1 -- bash -c '
  echo "$GTRON_RESTART_COUNT $MASTER_PORT" >> "$0/runs_$RANK"
  if [[ $RANK == 0 ]]; then exit 9; fi
  sleep 300' "$DIR" 2>"$TMP/exhausted.err"
expect_eq "exhausted: exit code" "$?" "9"
expect_eq "exhausted: attempts" "$(cat "$DIR/runs_0" 2>/dev/null | tr '\n' ,)" \
  "0 $PORT,1 $PORT,2 $PORT,"
expect_eq "exhausted: restart lines" "$(grep -c "restarting the group" "$TMP/exhausted.err")" "2"
grep -q "restart 2 of 2" "$TMP/exhausted.err" || fail "exhausted: no 'restart 2 of 2'"
grep -q "rank 0 exited with code 9; stopping the other workers (no restart left of 2)" \
  "$TMP/exhausted.err" || fail "exhausted: no final message: $(cat "$TMP/exhausted.err")"

# Without --max-restarts nothing restarts.
DIR="$TMP/no_restart"
mkdir -p "$DIR"
bounded "$GTRONRUN" --standalone -- bash -c 'echo "$GTRON_RESTART_COUNT" >> "$0/runs"; exit 4' \
  "$DIR" 2>/dev/null
expect_eq "no restart: exit code" "$?" "4"
expect_eq "no restart: attempts" "$(cat "$DIR/runs" 2>/dev/null)" "0"

if [[ $FAILURES -gt 0 ]]; then
  echo "$FAILURES check(s) failed" >&2
  exit 1
fi
echo "all gtronrun checks passed"
