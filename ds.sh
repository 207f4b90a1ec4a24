#!/usr/bin/env bash
# ds.sh: the project's entry point (README's two commands).
#
#   ./ds.sh run     install what is missing, build, train a 4-node cluster on
#                   this host (the main job: dslaunch local -n 4)
#   ./ds.sh test    install what is missing, build, run the whole test suite
#                   (release build + ASan/UBSan and TSan builds); .ci/run runs exactly this
#   ./ds.sh deps | build | bench
#
# Runs as root on Debian 12 (apt-get); as another user it uses sudo when a
# package is missing.
set -euo pipefail
cd "$(dirname "$0")"

PKGS=(meson ninja-build pkg-config gcc clang libc6-dev
      libfabric-dev libfabric-bin libsodium-dev libssl-dev libinih-dev libcriterion-dev
      libopenblas-dev zlib1g-dev libdeflate-dev libjansson-dev libmicrohttpd-dev libcurl4-openssl-dev
      dataset-fashion-mnist
      python3-torch python3-numpy iproute2 nftables libclang-rt-14-dev
      openssh-client)
# Only for the test suite: the multihost tests start their own sshd in
# network namespaces, the slurm tests their own munged, slurmctld and slurmd.
# Debian's packages also enable and start the system services where systemd
# runs, so `run` does not install them. python3-pytest runs the Python
# package's tests (meson suite python).
TEST_PKGS=(openssh-server slurmctld slurmd munge slurm-client python3-pytest prometheus chromium)

# nvcc lives outside PATH on Debian's CUDA install.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
fi

deps() {
  local missing=()
  for p in "${PKGS[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "ds.sh: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

build() {
  local dir=${1:-build}; shift || true
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" "$@"
  fi
  ninja -C "$dir"
}

cmd_run() {
  deps
  build build
  # Four dsnode processes on 127.0.0.1: keys, configs, live progress and a
  # final table with the consensus distance (docs/dslaunch.md).
  exec build/tools/dslaunch/dslaunch local -n 4 --config conf/examples/cluster.ini "$@"
}

cmd_test() {
  deps "${TEST_PKGS[@]}"
  # playwright-core (from the npm registry, version pinned by
  # tests/browser/package-lock.json) drives chromium in dsviz's slider
  # test; without node and npm, or the registry, that one test skips.
  if command -v npm > /dev/null; then
    (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error) ||
      echo "ds.sh: playwright-core not installed (npm ci failed): dsviz's slider test will skip"
  fi
  build build
  meson test -C build --print-errorlogs --num-processes 2
  # Sanitizer build: AddressSanitizer + UBSan over the unit suites.
  build build-asan -Dbuildtype=debug -Db_sanitize=address,undefined -Db_lundef=false -Dcuda=disabled
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    LSAN_OPTIONS=suppressions="$PWD/tests/lsan.supp" \
    meson test -C build-asan --suite unit --print-errorlogs --num-processes 2
  # ThreadSanitizer build: the suites whose code runs threads, then a real
  # cluster of TSan-built nodes; one test at a time (and one Criterion job),
  # since TSan's slowdown on a 2-core machine would otherwise crowd the
  # tests' deadlines. halt_on_error: the first report fails the test.
  build build-tsan -Dbuildtype=debug -Db_sanitize=thread -Dcuda=disabled
  CRITERION_JOBS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    meson test -C build-tsan --print-errorlogs --num-processes 1 \
    tsan_transport tsan_net tsan_inproc status gossip group membership runtime api tsan_cluster
  # libFuzzer (clang) on the wire decoder, sessions and handshake: about a
  # minute from the committed seed corpus (docs/protocol.md for longer runs).
  tests/fuzz/run.sh 60
}

cmd_bench() {
  deps
  build build
  build/tools/dsbench/dsbench "$@"
}

case "${1:-}" in
  run) shift; cmd_run "$@" ;;
  test) shift; cmd_test "$@" ;;
  deps) deps ;;
  build) shift; deps; build build "$@" ;;
  bench) shift; cmd_bench "$@" ;;
  *) echo "usage: $0 run|test|deps|build|bench" >&2; exit 2 ;;
esac
