#!/bin/sh
# tools/gpu-check.sh: build dsnode with CUDA and run every GPU test and
# benchmark, in a few minutes, on a machine with an NVIDIA GPU whose image
# has nvcc, python3, meson and ninja but none of dsnode's Debian libraries
# and no network (docs/deploy.md, "GPU check").
#
#   tools/gpu-check.sh fetch   here, on the Debian 12 development machine:
#                              the Debian packages the build needs into
#                              .gpu/debs, the dataset into .gpu/data
#                              (.gpu/ is ignored: add it to a run's carry)
#   tools/gpu-check.sh run     on the GPU machine, from the repository
#                              root: unpack them under /tmp/dsdeps (never
#                              over /), build build-gpu with CUDA, run the
#                              tests and benchmarks; the log to $OUT (or
#                              .gpu/) as gpu-check.log
#   tools/gpu-check.sh local   here: the same build from the unpacked
#                              packages only (PKG_CONFIG_LIBDIR limited to
#                              them), to check the packaging without a GPU
#
# Exit status: 0 when every step passed, else non-zero.
set -eu

GPU_DIR=.gpu
PREFIX=${DSNODE_GPU_PREFIX:-/tmp/dsdeps}
LIB=$PREFIX/usr/lib/x86_64-linux-gnu

# The -dev packages meson asks for, their libraries that a CUDA image
# lacks, and pkgconf (meson finds dependencies through pkg-config).
PACKAGES="libfabric-dev libfabric1 libibverbs1 librdmacm1 libnl-3-200 libnl-route-3-200
libpsm2-2 libpsm-infinipath1 libnuma1 libsodium-dev libsodium23 libssl-dev libssl3
libinih-dev libinih1 libinireader0 zlib1g-dev libopenblas-dev libopenblas-pthread-dev
libopenblas0-pthread libopenblas0 libgfortran5 libjansson-dev libjansson4
libmicrohttpd-dev libmicrohttpd12 libcurl4-openssl-dev libcurl4 libcriterion-dev
libcriterion3 libnanomsg5 libgit2-1.5 libhttp-parser2.9 libmbedtls14 libmbedx509-1
libmbedcrypto7 libssh2-1 libboxfort-dev pkgconf pkgconf-bin libpkgconf3"

die() {
    echo "gpu-check: $*" >&2
    exit 1
}

fetch() {
    [ -f meson.build ] || die "run from the repository root"
    mkdir -p "$GPU_DIR/debs" "$GPU_DIR/data"
    grep -qx "/$GPU_DIR/" .git/info/exclude 2>/dev/null || echo "/$GPU_DIR/" >>.git/info/exclude
    # shellcheck disable=SC2086 # one word per package
    (cd "$GPU_DIR/debs" && apt-get download $PACKAGES)
    cp /usr/share/datasets/fashion-mnist/*.gz "$GPU_DIR/data/" ||
        die "no dataset: apt-get install dataset-fashion-mnist"
    du -sh "$GPU_DIR"
}

# Unpack the packages under $PREFIX and point their pkg-config files there.
unpack() {
    [ -d "$GPU_DIR/debs" ] || die "no $GPU_DIR/debs: run 'tools/gpu-check.sh fetch' first (and carry $GPU_DIR)"
    rm -rf "$PREFIX"
    mkdir -p "$PREFIX"
    for f in "$GPU_DIR"/debs/*.deb; do
        dpkg -x "$f" "$PREFIX"
    done
    # Paths under $PREFIX; no Requires.private (static linking only, and
    # pkg-config would want those packages' .pc files: gnutls, libidn2...).
    find "$PREFIX" -name '*.pc' -exec sed -i -e "s#^\([A-Za-z_]*\)=/usr#\1=$PREFIX/usr#" \
        -e '/^Requires.private:/d' {} +
    PKG_CONFIG_LIBDIR=$LIB/pkgconfig:$LIB/openblas-pthread/pkgconfig:$PREFIX/usr/share/pkgconfig
    LD_LIBRARY_PATH=$LIB:$LIB/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    PATH=$PREFIX/usr/bin:$PATH
    export PKG_CONFIG_LIBDIR LD_LIBRARY_PATH PATH
    command -v pkg-config >/dev/null || die "pkg-config missing after unpacking"
}

meson_cmd() {
    if command -v meson >/dev/null; then meson "$@"; else python3 -m mesonbuild.mesonmain "$@"; fi
}

# step NAME CMD...: run, log, remember the first failure.
FAILED=0
step() {
    name=$1
    shift
    echo "== $name: $*"
    t0=$(date +%s)
    if "$@"; then
        echo "== $name: ok ($(($(date +%s) - t0)) s)"
    else
        rc=$?
        echo "== $name: FAILED (exit $rc, $(($(date +%s) - t0)) s)"
        [ "$FAILED" -ne 0 ] || FAILED=$rc
    fi
}

build() {
    cuda=$1
    meson_cmd setup build-gpu --wipe -Dcuda="$cuda" -Dgpu_sm=90 >/dev/null 2>&1 ||
        meson_cmd setup build-gpu -Dcuda="$cuda" -Dgpu_sm=90
    ninja -C build-gpu
}

# One node on the GPU against one on the CPU, same steps: accuracy within
# 0.5 pt (issue 11), each summary line in the log.
train_pair() {
    model=$1
    steps=$2
    for be in cuda cpu; do
        build-gpu/node/dsnode run --config conf/examples/single.ini --set train.model="$model" \
            --set train.backend="$be" --set train.steps="$steps" --set train.eval_every=0 \
            --set train.dataset_dir="$PWD/$GPU_DIR/data" --set node.data_dir="/tmp/gpu-$model-$be" \
            2>&1 | grep '^summary' | tee "/tmp/gpu-$model-$be.sum" || return 1
    done
    a=$(sed -n 's/.*test_acc=\([0-9.]*\).*/\1/p' "/tmp/gpu-$model-cuda.sum")
    b=$(sed -n 's/.*test_acc=\([0-9.]*\).*/\1/p' "/tmp/gpu-$model-cpu.sum")
    python3 -c "import sys; a, b = $a, $b; print(f'$model: cuda {a:.4f} cpu {b:.4f} diff {100 * (a - b):+.2f} pt'); sys.exit(abs(a - b) > 0.005)"
}

torch_cuda() {
    if ! python3 -c 'import torch, pytest, numpy' 2>/dev/null; then
        echo "no torch, pytest or numpy in this image's python3: skipped"
        return 0
    fi
    DSNODE_BUILD=$PWD/build-gpu python3 -m pytest -q tools/python/tests/test_dsnode.py \
        -k 'torch_checkpoint_resume_and_mirrors'
}

# Four nodes sharing the GPU (dslaunch local, train.device = auto: device
# rank mod the GPUs), MiCRO 1% gossip: every node done on cuda.
cluster_gpu() {
    rm -rf /tmp/gpu-cluster
    build-gpu/tools/dslaunch/dslaunch local -n 4 --config conf/examples/cluster.ini \
        --set train.backend=cuda --set train.steps=600 --set train.eval_every=0 \
        --set train.dataset_dir="$PWD/$GPU_DIR/data" --out /tmp/gpu-cluster --json \
        --timeout 240 --dsnode build-gpu/node/dsnode >/tmp/gpu-cluster.json || return 1
    tail -n 1 /tmp/gpu-cluster.json | python3 -c '
import json, sys
r = json.load(sys.stdin)
for name, n in sorted(r["nodes"].items()):
    print(name, n["status"], n["backend"], n["test_acc"], n["samples_per_s"])
    assert n["status"] == "done" and n["backend"].startswith("cuda"), name
print("consensus", r["consensus_distance"], "mean_test_acc", r["mean_test_acc"])'
}

bench_gpu() {
    torch=--no-torch
    python3 -c 'import torch' 2>/dev/null && torch=
    build-gpu/tools/dsbench/dsbench sparsify --gpu --json &&
        build-gpu/tools/dsbench/dsbench train --gpu --steps 1000 --rounds 1 $torch --json &&
        build-gpu/tools/dsbench/dsbench train --gpu --model cnn --lr 0.03 --steps 300 \
            --rounds 1 $torch --json
}

run_checks() {
    nvidia-smi -L || die "no GPU answers nvidia-smi"
    step build build enabled
    step unit-cuda meson_cmd test -C build-gpu --print-errorlogs cuda select_cuda kernels model \
        train select sparsify
    # Each summary's samples_per_s is the GPU's and the CPU's training
    # speed, accuracy within 0.5 pt of the CPU's at the same steps.
    step mlp-cuda-vs-cpu train_pair mlp 3000
    step cnn-cuda-vs-cpu train_pair cnn 1000
    step cluster-4-on-one-gpu cluster_gpu
    # Selection GB/s against a plain read and CUB's radix top-k; training
    # samples/s on the GPU beside the CPU's.
    step bench-gpu bench_gpu
    # The PyTorch wrapper's CUDA path (host mirrors through libdsnode's copy
    # callbacks), when the image's python3 has torch and pytest.
    step torch-cuda torch_cuda
    echo "gpu-check: first failure: $FAILED"
}

case "${1:-}" in
fetch) fetch ;;
run)
    log=${OUT:-$GPU_DIR}/gpu-check.log
    mkdir -p "$(dirname "$log")"
    unpack
    run_checks 2>&1 | tee "$log"
    grep -qx "gpu-check: first failure: 0" "$log"
    ;;
local)
    unpack
    step build build disabled
    step unit meson_cmd test -C build-gpu --print-errorlogs kernels model train
    exit "$FAILED"
    ;;
*)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
