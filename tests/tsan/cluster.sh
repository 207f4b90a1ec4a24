#!/usr/bin/env bash
# A small real cluster of ThreadSanitizer-built dsnode processes (meson test
# tsan_cluster, defined in a b_sanitize=thread build only; ./ds.sh test).
# The Criterion suites run each room's threads alone; here they run
# together, as in a node: three nodes with gossip.overlap = true (the
# ds-gossip thread exchanges while main trains), ds-membership, ds-net,
# ds-transport, and ds-status writing status.json; a fourth node added at
# step 30 takes the join path (state served between steps, shadowing).
# halt_on_error=1: a node's first report ends it with status 66, so
# dslaunch fails; the reports are printed from the nodes' logs.
#   usage: cluster.sh DSLAUNCH CONFIG
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 DSLAUNCH CONFIG" >&2
  exit 2
fi
dslaunch=$1
config=$2
out=$(mktemp -d "${TMPDIR:-/tmp}/ds-tsan-cluster.XXXXXX")
trap 'rm -rf "$out"' EXIT
export TSAN_OPTIONS="halt_on_error=1 ${TSAN_OPTIONS:-}"
rc=0
"$dslaunch" local -n 3 --config "$config" --out "$out/run" --timeout 420 \
  --set train.backend=cpu --set train.steps=100 --set train.eval_every=0 \
  --set train.log_every=50 --set gossip.overlap=true \
  --set status.file=status.json --add-at 30:1 || rc=$?
if grep -l "ThreadSanitizer" "$out"/run/*.log; then
  sed -n '/WARNING: ThreadSanitizer/,/^SUMMARY/p' "$out"/run/*.log
  rc=1
fi
if [ "$rc" -ne 0 ]; then
  echo "tsan cluster: dslaunch or a node failed (status $rc); the nodes' logs:" >&2
  tail -n 20 "$out"/run/*.log >&2
fi
exit "$rc"
