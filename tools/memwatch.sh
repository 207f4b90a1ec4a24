#!/bin/bash
# tools/memwatch.sh: the memory of dsnode nodes over a long run on a slow
# link (issue 17, "Memory over long runs").
#
#   tools/memwatch.sh [--minutes M] [--nodes N] [--rate RATE] [--inflight MB]
#                     [--every S] [--config FILE] [--out DIR] [--set KEY=VALUE]...
#
# Starts `dslaunch local -n N --netns-rate RATE` (root: network namespaces,
# every node behind a tbf-limited link) with transport.max_inflight_mb = MB
# and enough steps to outlast M minutes, and reads every node's VmRSS and
# VmHWM from /proc every S seconds until dslaunch's --timeout (M minutes)
# stops the run. Writes DIR/mem.csv (seconds, node, rss_kb, hwm_kb) and
# prints one line per node:
#   node first_mb max_mb last_mb half_mb growth_2nd_half_mb steps stuck_logs
#        resets deaths_seen exit
# half_mb is the RSS at half time; growth_2nd_half_mb = last - half: a node
# whose memory grows without bound keeps growing in the second half, after
# the buffers and caches of a normal run have reached their size. steps is
# the last step the node's status file showed; stuck_logs counts its log's
# "stuck" lines (receive buffers replaced), whose buffers must be released;
# resets counts its transport's endpoint resets (sends stuck past the
# bound), deaths_seen the members its membership declared dead, and exit is
# how dslaunch saw it end (stopped(143) by the timeout is the normal end).
#
# --set passes an override on to dslaunch (repeatable), e.g.
# sparsify.method=none: dense rounds of the whole model, which a slow link
# cannot carry within the round deadline, so exchanges run late and
# receive buffers get stuck, while the nodes mostly wait (little CPU).
# Defaults: 30 minutes, 3 nodes, 10mbit, the config's max_inflight_mb,
# every 15 s, conf/examples/cluster.ini, DIR = a new directory under /tmp.
# The run ends by --timeout, so dslaunch's own exit status is 1 by design;
# this script exits 0 when every node was sampled to the end, else 1.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
minutes=30 nodes=3 rate=10mbit inflight="" every=15
config="$root/conf/examples/cluster.ini" out=""
extra=()
dslaunch="${DSLAUNCH:-$root/build/tools/dslaunch/dslaunch}"

while [ $# -gt 0 ]; do
    case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --inflight) inflight=$2; shift 2 ;;
    --every) every=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --set) extra+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "memwatch: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$minutes$nodes$every" in *[!0-9]*) echo "memwatch: --minutes, --nodes and --every take whole numbers" >&2; exit 2 ;; esac
[ -x "$dslaunch" ] || { echo "memwatch: $dslaunch not found: build first (meson)" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d /tmp/memwatch.XXXXXX)
mkdir -p "$out"
run="$out/run"
secs=$((minutes * 60))

sets=(--set train.steps=100000000 --set train.eval_every=0 --set train.log_every=500
      --set status.listen= --set status.file_interval_ms=1000)
[ -n "$inflight" ] && sets+=(--set "transport.max_inflight_mb=$inflight")
[ ${#extra[@]} -gt 0 ] && sets+=("${extra[@]}")
# Each node's status file (dslaunch puts it in the node's directory), so
# that its step can be read.
sets+=(--set "status.file=status.json")

"$dslaunch" local -n "$nodes" --config "$config" --netns-rate "$rate" "${sets[@]}" \
    --out "$run" --timeout "$secs" > "$out/dslaunch.out" 2> "$out/dslaunch.err" &
dpid=$!
trap 'kill "$dpid" 2>/dev/null || true' EXIT

echo "seconds,node,rss_kb,hwm_kb" > "$out/mem.csv"
t0=$(date +%s)
declare -A last_seen
while kill -0 "$dpid" 2>/dev/null; do
    now=$(( $(date +%s) - t0 ))
    for ((i = 0; i < nodes; i++)); do
        pid=$(pgrep -f -- "--config $run/n$i.ini" | head -1 || true)
        [ -n "$pid" ] || continue
        st=/proc/$pid/status
        rss=$(awk '/^VmRSS:/ {print $2}' "$st" 2>/dev/null || true)
        hwm=$(awk '/^VmHWM:/ {print $2}' "$st" 2>/dev/null || true)
        [ -n "$rss" ] || continue
        echo "$now,n$i,$rss,$hwm" >> "$out/mem.csv"
        last_seen[n$i]=$now
    done
    sleep "$every"
done
wait "$dpid" || true
trap - EXIT

ok=0
echo "memwatch: $nodes nodes, $rate, max_inflight_mb=${inflight:-config default}, $minutes min; samples in $out/mem.csv"
echo "node first_mb max_mb last_mb half_mb growth_2nd_half_mb steps stuck_logs resets deaths_seen exit"
for ((i = 0; i < nodes; i++)); do
    n=n$i
    steps=$(grep -o '"step":[0-9]*' "$run/$n/status.json" 2>/dev/null | head -1 | cut -d: -f2 || true)
    stuck=$(grep -c "stuck" "$run/$n.log" 2>/dev/null || true)
    resets=$(grep -c "resetting endpoint" "$run/$n.log" 2>/dev/null || true)
    deaths=$(grep -c "membership member dead" "$run/$n.log" 2>/dev/null || true)
    how=$(grep -o "dslaunch: $n exited: [a-z]*([0-9]*)" "$out/dslaunch.err" | head -1 | sed 's/.*exited: //' || true)
    awk -F, -v n="$n" -v half=$((secs / 2)) -v steps="${steps:-?}" -v stuck="${stuck:-0}" \
        -v resets="${resets:-0}" -v deaths="${deaths:-0}" -v how="${how:-?}" '
        $2 == n { if (!seen) { first = $3; seen = 1 } if ($3 > max) max = $3; last = $3
                  if ($1 <= half) h = $3 }
        END { if (!seen) { print n, "no samples"; exit 1 }
              printf "%s %.1f %.1f %.1f %.1f %+.1f %s %s %s %s %s\n", n, first / 1024,
                     max / 1024, last / 1024, h / 1024, (last - h) / 1024, steps, stuck,
                     resets, deaths, how }' "$out/mem.csv" || ok=1
    [ "${last_seen[$n]:-0}" -ge $((secs - 2 * every - 30)) ] || { echo "memwatch: $n was not sampled to the end (it exited early: $how)" >&2; ok=1; }
done
exit $ok
