#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS] [BUILD_DIR]: run every libFuzzer harness
# (decode, session, handshake) for an equal share of SECONDS (default 60),
# each from a scratch copy of the committed corpus in tests/fuzz/corpus/ (the
# committed seeds are never modified). Configures BUILD_DIR (default
# build-fuzz) with clang when it does not exist. Exit status 1 when a
# harness finds a crash, leak, timeout or a broken property; the input that
# did it is kept in BUILD_DIR/fuzz-artifacts/ (rerun it: BUILD/tests/fuzz/fuzz_X FILE).
# Longer runs: docs/protocol.md ("Fuzzing").
set -euo pipefail
budget=${1:-60}
src=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${2:-$src/build-fuzz}
case "$bdir" in /*) ;; *) bdir=$PWD/$bdir ;; esac
harnesses=(decode session handshake)

if [ ! -f "$bdir/build.ninja" ]; then
  CC=clang meson setup "$bdir" "$src" -Dfuzz=true -Dcuda=disabled -Dbuildtype=debugoptimized \
    >"$bdir.setup.log" 2>&1 || { cat "$bdir.setup.log"; exit 2; }
fi
# The meson run_target has built them already (and ninja must not nest).
if [ -z "${DS_FUZZ_NO_BUILD:-}" ]; then
  ninja -C "$bdir" $(printf 'tests/fuzz/fuzz_%s ' "${harnesses[@]}") >"$bdir.build.log" 2>&1 ||
    { tail -40 "$bdir.build.log"; exit 2; }
fi

per=$(( budget / ${#harnesses[@]} ))
[ "$per" -ge 5 ] || per=5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$bdir/fuzz-artifacts"
status=0
for h in "${harnesses[@]}"; do
  mkdir -p "$work/$h"
  echo "fuzz_$h: ${per}s from $(ls "$src/tests/fuzz/corpus/$h" | wc -l) seeds"
  if ! ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
       "$bdir/tests/fuzz/fuzz_$h" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 \
         -max_len=65536 -print_final_stats=1 -artifact_prefix="$bdir/fuzz-artifacts/$h-" \
         "$work/$h" "$src/tests/fuzz/corpus/$h" >"$work/$h.log" 2>&1; then
    status=1
    echo "fuzz_$h FAILED; last lines of its log:"
    tail -40 "$work/$h.log"
  else
    grep -E "^stat::number_of_executed_units|^stat::new_units_added|cov:" "$work/$h.log" | tail -3
  fi
done
exit $status
