#!/bin/sh
# tests/install_consumer.sh BUILD_DIR [SANITIZE]: libdsnode as a program outside the
# tree uses it. `meson install --destdir` into a fresh directory, then a
# small C program compiled with nothing but `pkg-config --cflags --libs
# dsnode` (PKG_CONFIG_SYSROOT_DIR maps the installed paths into the
# destdir) and run against the installed library: it checks the ABI, and
# that a bad override comes back as -EINVAL with the key in dsnode_error().
# Skipped (exit 77) in a sanitizer build (SANITIZE not "none").
set -eu
build="$1"
if [ "${2:-none}" != none ]; then
    echo "skip: a $2 build's library needs the sanitizer runtime loaded first"
    exit 77
fi
dir=$(mktemp -d /tmp/ds_install.XXXXXX)
trap 'rm -rf "$dir"' EXIT INT TERM
meson install -C "$build" --no-rebuild --destdir "$dir/root" >"$dir/install.log" 2>&1 || {
    cat "$dir/install.log" >&2
    exit 1
}
pc=$(find "$dir/root" -name dsnode.pc | head -n 1)
[ -n "$pc" ] || { echo "meson install wrote no dsnode.pc" >&2; exit 1; }
hdr=$(find "$dir/root" -path '*/include/dsnode/dsnode.h' | head -n 1)
[ -n "$hdr" ] || { echo "meson install wrote no include/dsnode/dsnode.h" >&2; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$dir/root"
flags=$(pkg-config --cflags --libs dsnode)
cat >"$dir/use.c" <<'C'
#include <dsnode/dsnode.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
    dsnode *d = NULL;
    const char *bad[] = {"gossip.weight=banana"};
    if (dsnode_abi_version() != DSNODE_ABI_VERSION) {
        fprintf(stderr, "ABI %u, header %d\n", dsnode_abi_version(), DSNODE_ABI_VERSION);
        return 1;
    }
    int e = dsnode_open(&d, NULL, bad, 1);
    if (e != -EINVAL || d || !strstr(dsnode_error(), "gossip.weight")) {
        fprintf(stderr, "dsnode_open: %d '%s'\n", e, dsnode_error());
        return 1;
    }
    dsnode_close(&d);
    printf("libdsnode %s: %s\n", dsnode_version(), dsnode_error());
    return 0;
}
C
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror -o "$dir/use" "$dir/use.c" $flags
LD_LIBRARY_PATH="$(dirname "$(find "$dir/root" -name 'libdsnode.so.1' | head -n 1)")" "$dir/use"
