#!/bin/sh
# tests/systemd_unit.sh SOURCE_ROOT DSNODE: `systemd-analyze verify` accepts
# tools/systemd/dsnode@.service with no warning at all (an unknown or
# misspelt directive is only a warning to systemd). The unit names the
# installed /usr/local/bin/dsnode, which verify wants to exist, so a copy
# names the dsnode just built instead; nothing else is changed. Skipped
# (exit 77, meson's skip) when systemd-analyze is not installed.
set -eu
unit="$1/tools/systemd/dsnode@.service"
dsnode="$2"
if ! command -v systemd-analyze >/dev/null 2>&1; then
    echo "skip: no systemd-analyze (Debian: apt-get install systemd)"
    exit 77
fi
grep -q '^ExecStart=/usr/local/bin/dsnode run --config /etc/dsnode/%i.ini$' "$unit" || {
    echo "$unit: expected ExecStart=/usr/local/bin/dsnode run --config /etc/dsnode/%i.ini" >&2
    exit 1
}
dir=$(mktemp -d /tmp/ds_systemd_unit.XXXXXX)
trap 'rm -rf "$dir"' EXIT INT TERM
sed "s|/usr/local/bin/dsnode|$dsnode|" "$unit" >"$dir/dsnode@.service"
cd "$dir"
rc=0
systemd-analyze verify "$dir/dsnode@check.service" >"$dir/out" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] || [ -s "$dir/out" ]; then
    echo "systemd-analyze verify $unit (ExecStart's dsnode: $dsnode): expected exit 0 and no" \
        "output, found exit $rc and:" >&2
    cat "$dir/out" >&2
    exit 1
fi
echo "systemd-analyze verify: $unit accepted"
