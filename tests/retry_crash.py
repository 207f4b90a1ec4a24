#!/usr/bin/env python3
"""Run a Criterion test binary; rerun, up to twice, a test that crashed
when that test is named as one that libfabric 1.17 can crash
(docs/transport.md: ofi_rxm's connection teardown reads a closed endpoint
in about 1 run in 10 of a peer killed mid-stream, more on a loaded
machine; fixed upstream in no release yet).

    retry_crash.py --known SUITE/TEST [--known ...] -- BINARY [ARGS...]

Exit status: the first run's, unless every failed test of it crashed and
is a known one; then the reruns' (of those tests only), each taken only
when the run before failed by such crashes alone. A failed assertion is
never retried, nor a crash of any other test, nor a third crash.
Criterion's JSON report is read for each test's status (its messages are
not valid JSON, so the statuses are matched, not parsed).

A crash is what Criterion reports as ERRORED ("The test crashed."), or
FAILED with no message at all: that is how it reports a worker that
exited without a failed assertion, which is what a crash becomes where
the environment installs its own SIGSEGV handler that prints a backtrace
and exits (seen in CI: "boxfort-worker:PID terminated with signal 11",
then "[FAIL] ... (0.00s)" and "Crashing: 0"). A failed assertion always
carries its message, so it is never taken for a crash.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

STATUS = re.compile(r'"name": "([^"]+)",\s*"assertions": \d+,\s*"status": "([A-Z]+)"'
                    r'(,\s*"messages": \[\s*\])?')
RERUNS = 2  # a known crash is rerun at most this many times

SUITE = re.compile(r'\{\s*"name": "([^"]+)",\s*"passed"')


def statuses(path):
    """{suite/test: status} from Criterion's JSON report."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = {}
    suites = [(m.start(), m.group(1)) for m in SUITE.finditer(text)]
    for m in STATUS.finditer(text):
        owner = [name for at, name in suites if at < m.start()]
        if owner:
            status = m.group(2)
            if status == "FAILED" and m.group(3):
                status = "EXITED"  # failed with no message: the worker died
            out[owner[-1] + "/" + m.group(1)] = status
    return out


def run(cmd, report):
    return subprocess.run(cmd + ["--json=" + report]).returncode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--known", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no test binary given")
    with tempfile.TemporaryDirectory(prefix="retry_crash.") as d:
        report = os.path.join(d, "run0.json")
        code = run(cmd, report)
        # The reruns: the same command, filtered to the crashed tests.
        rest, skip = [], False
        for arg in cmd[1:]:
            if skip:
                skip = False
                continue
            if arg == "--filter":
                skip = True
                continue
            if arg.startswith("--filter="):
                continue
            rest.append(arg)
        for attempt in range(1, RERUNS + 1):
            if code == 0:
                return 0
            try:
                st = statuses(report)
            except OSError as e:
                print(f"retry_crash: no report ({e}): not retried", file=sys.stderr)
                return code
            bad = {t: s for t, s in st.items() if s not in ("PASSED", "SKIPPED")}
            if not bad or any(s not in ("ERRORED", "EXITED") or t not in a.known
                              for t, s in bad.items()):
                return code
            for t in sorted(bad):
                print(f"retry_crash: {t} crashed; it is known to crash inside libfabric 1.17's "
                      f"ofi_rxm (docs/transport.md): rerun {attempt} of {RERUNS}",
                      file=sys.stderr)
            pattern = "|".join(sorted(bad))
            pattern = f"({pattern})" if len(bad) > 1 else pattern
            report = os.path.join(d, f"run{attempt}.json")
            code = run([cmd[0], "--filter", pattern] + rest, report)
            print(f"retry_crash: rerun {attempt} exited {code}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
