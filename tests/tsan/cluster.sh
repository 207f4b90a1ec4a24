#!/usr/bin/env bash
# A small real cluster of ThreadSanitizer-built dsnode processes (meson test
# tsan_cluster, defined in a b_sanitize=thread build only; ./ds.sh test).
# The Criterion suites run each room's threads alone; here they run
# together, as in a node: three nodes with gossip.overlap = true (the
# ds-gossip thread exchanges while main trains), ds-membership, ds-net,
# ds-transport, and ds-status writing status.json; a fourth node added at
# step 30 takes the join path (state served between steps, shadowing), and
# n1 gets SIGTERM at step 50 (the stop flags, read by every thread). 300
# steps: with 100 the others had finished before the added node, slow to
# start under TSan, could join.
# halt_on_error=1: a node's first report ends it with status 66; the check
# wants every node done with 0, n1 stopped with 143, and no report in any
# log (the reports are printed).
#   usage: cluster.sh DSLAUNCH CONFIG
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 DSLAUNCH CONFIG" >&2
  exit 2
fi
dslaunch=$1
config=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/ds-tsan-cluster.XXXXXX")
dl=
cleanup() {
  if [ -n "$dl" ] && kill -0 "$dl" 2>/dev/null; then
    kill "$dl" 2>/dev/null || true
    wait "$dl" 2>/dev/null || true
  fi
  rm -rf "$out"
}
trap cleanup EXIT
export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"

"$dslaunch" local -n 3 --config "$config" --out "$out/run" --timeout 420 --json \
  --set train.backend=cpu --set train.steps=300 --set train.eval_every=0 \
  --set train.log_every=50 --set gossip.overlap=true \
  --set status.file=status.json --add-at 30:1 > "$out/stdout" &
dl=$!

# SIGTERM to n1 once its status file says step 50 (bounded: 300 s).
stopped=0
for _ in $(seq 1500); do
  step=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["train"]["step"])' \
         "$out/run/n1/status.json" 2>/dev/null || echo 0)
  if [ "${step:-0}" -ge 50 ]; then
    pid=$(pgrep -f -- "--config $out/run/n1.ini" | head -n 1 || true)
    if [ -n "$pid" ]; then
      kill -TERM "$pid"
      stopped=1
    fi
    break
  fi
  kill -0 "$dl" 2>/dev/null || break
  sleep 0.2
done

rc=0
wait "$dl" || rc=$?
dl=
report=$(tail -n 1 "$out/stdout")
ok=1
[ "$stopped" -eq 1 ] || { echo "tsan cluster: n1 never reached step 50" >&2; ok=0; }
# n1 stopped (128 + SIGTERM), every other node done with 0.
check='
import json, sys
nodes = json.loads(sys.argv[1])["nodes"]
want = {n: ("stopped", 143) if n == "n1" else ("done", 0) for n in ("n0", "n1", "n2", "n3")}
got = {n: (v["status"], v["exit_status"]) for n, v in nodes.items()}
if got != {n: tuple(w) for n, w in want.items()}:
    sys.exit("tsan cluster: nodes (status, exit) %s, expected %s" % (got, want))
'
if ! python3 -c "$check" "$report"; then
  echo "tsan cluster: dslaunch status $rc; its last line: $report" >&2
  ok=0
fi
if grep -l "ThreadSanitizer" "$out"/run/*.log; then
  sed -n '/WARNING: ThreadSanitizer/,/^SUMMARY/p' "$out"/run/*.log
  ok=0
fi
if [ "$ok" -ne 1 ]; then
  tail -n 20 "$out"/run/*.log >&2
  exit 1
fi
echo "tsan cluster: 4 nodes, n1 stopped by SIGTERM, no ThreadSanitizer report"
