#!/usr/bin/env python3
"""The bookkeeping of scripts/test: runs cargo test commands, reads what
each test binary reported, and ends the run with one honest closing line.

    testrun.py run LOG LABEL -- CMD...
                                        run CMD (a cargo test command), its
                                        output streamed; one record a test
                                        binary appended to LOG (JSON lines)
    testrun.py declared MANIFEST         the [[test]] names of MANIFEST, one
                                        a line; fails (after printing them)
                                        naming any tests/*.rs beside them
                                        that is not declared
    testrun.py step LOG LABEL START END STATUS [CPU]
                                        a step that is not a cargo test (the
                                        kernel, fuzzing) recorded for the
                                        table of times; CPU is /proc/stat's
                                        first line read at its start
    testrun.py summary LOG               the table of times and the closing
                                        line; exits 1 on any failure. Parts
                                        may run at once (scripts/test's two
                                        lanes): the total is the time from
                                        the first part's start to the last
                                        one's end

A test binary counts as failed, beside its failed tests, when it crashed
(it printed no `test result:` line: a signal, an abort, a panic outside a
test), when cargo could not build it, and when an integration test file
(a declared tests/*.rs) ran no test. The closing line is
`tests: N passed, M failed, K skipped`, where M counts those binaries too.
tests/harness.rs runs this on a throwaway crate with each kind of failure.
"""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

# Cargo's own lines, with its exact indentation (a test's captured output,
# printed when it fails, may hold look-alikes, but not at these columns
# before the real ones: see parse()).
HEADER = re.compile(r"^(?:     Running|   Doc-tests) (.+?)(?: \((.+)\))?$")
RUNNING = re.compile(r"^running (\d+) tests?$")
RESULT = re.compile(
    r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored;"
)
# Cargo's word on a binary that exited non-zero: `process didn't exit
# successfully: `PATH ...` (exit status: N)` or `(signal: N, ...)`.
EXITED = re.compile(r"process didn't exit successfully: `([^` ]+)[^`]*` \((.+)\)")
# One test's line with libtest's time (`--report-time`, which
# scripts/lib/test-runner adds): `test NAME ... ok <12.345s>`.
TIMED = re.compile(r"^test (\S+) \.\.\. (?:ok|FAILED) <([\d.]+)s>$")


# How many of the slowest tests a run's summary names.
SLOWEST = 12


def cpu_now(line=None):
    """(busy, total) clock ticks of all cores from /proc/stat's first line
    (`cpu user nice system idle iowait ...`); None where there is none."""
    try:
        if line is None:
            with open("/proc/stat") as f:
                line = f.readline()
        ticks = [int(v) for v in line.split()[1:]]
    except (OSError, ValueError):
        return None
    if len(ticks) < 5:
        return None
    total = sum(ticks[:8])
    return (total - ticks[3] - ticks[4], total)


def busy(start, end):
    """The share of the machine's cores that worked between two cpu_now()
    readings, in percent (100: every core all the time): what tells a part
    that waits (one test binding a file, a build on one core) from one that
    keeps the machine full."""
    if not start or not end or end[1] <= start[1]:
        return None
    return round(100 * (end[0] - start[0]) / (end[1] - start[1]))


def parse(lines):
    """The test binaries a cargo test output reports, in order: dicts with
    name, kind (unit, integration, doc), tests, passed, failed, ignored and
    result (None when the binary printed no result line)."""
    bins = []
    cur = None
    for line in lines:
        m = HEADER.match(line)
        # A binary's section ends with its result line or cargo's word on
        # its exit; a header before that is a look-alike in its output.
        ended = cur is None or cur["result"] is not None or cur["exit"] is not None
        if m and ended:
            name, exe = m.group(1), m.group(2)
            if line.startswith("   Doc-tests"):
                kind = "doc"
            elif name.startswith("unittests "):
                kind = "unit"
                name = name[len("unittests "):]
            else:
                kind = "integration"
            cur = {"name": name, "kind": kind, "exe": exe, "tests": None,
                   "passed": 0, "failed": 0, "ignored": 0, "result": None,
                   "exit": None, "times": []}
            bins.append(cur)
            continue
        m = EXITED.search(line)
        if m:
            # Cargo names the binary's path (relative or absolute).
            for b in reversed(bins):
                if b["exe"] and (m.group(1).endswith(b["exe"]) or b["exe"].endswith(m.group(1))):
                    b["exit"] = m.group(2)
                    break
            continue
        if cur is None:
            continue
        # The first `running N tests` is the binary's own (a look-alike in
        # a failed test's output comes after it).
        m = RUNNING.match(line)
        if m and cur["tests"] is None:
            cur["tests"] = int(m.group(1))
            continue
        # The last result line is the binary's own: a failed test's output,
        # printed before it, may hold look-alikes.
        m = TIMED.match(line)
        if m and cur["result"] is None:
            cur["times"].append((m.group(1), float(m.group(2))))
            continue
        m = RESULT.match(line)
        if m:
            cur["result"] = m.group(1)
            cur["passed"] = int(m.group(2))
            cur["failed"] = int(m.group(3))
            cur["ignored"] = int(m.group(4))
    return bins


def problems(bins, status):
    """What went wrong beside failed tests, one sentence each."""
    out = []
    for b in bins:
        if b["result"] is None:
            out.append(f"{b['name']}: the test binary crashed or was killed "
                       "(no `test result:` line; its last output is above)")
        elif b["exit"] is not None and b["failed"] == 0:
            out.append(f"{b['name']}: the test binary exited with {b['exit']} "
                       "though no test failed (a crash after its tests?)")
        elif b["kind"] == "integration" and b["tests"] == 0:
            out.append(f"{b['name']}: a declared test file that ran no test")
    failed_tests = sum(b["failed"] for b in bins)
    if status != 0 and not out and failed_tests == 0:
        if not bins:
            out.append(f"cargo exited with {status} before running any test "
                       "binary: a test did not compile (cargo's errors are above)")
        else:
            out.append(f"cargo exited with {status} though every binary it ran "
                       "passed: a later one did not compile (its errors are above)")
    return out


def run(log, label, cmd):
    start = time.time()
    cpu = cpu_now()
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, errors="replace") as p:
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line.rstrip("\n"))
        status = p.wait()
    end = time.time()
    bins = parse(lines)
    record = {
        "label": label,
        "seconds": round(end - start, 1),
        "start": start,
        "end": end,
        "busy": busy(cpu, cpu_now()),
        "status": status,
        "passed": sum(b["passed"] for b in bins),
        "failed": sum(b["failed"] for b in bins),
        "ignored": sum(b["ignored"] for b in bins),
        "problems": problems(bins, status),
        # The slowest tests, for the table at the end.
        "slowest": sorted(((t, s) for b in bins for t, s in b["times"]),
                          key=lambda ts: -ts[1])[:SLOWEST],
    }
    with open(log, "a") as f:
        f.write(json.dumps(record) + "\n")
    bad = record["failed"] or record["problems"] or status != 0
    for p in record["problems"]:
        print(f"test: {label}: {p}", file=sys.stderr)
    return 1 if bad else 0


def step(log, label, start, end, status, cpu=None):
    record = {"label": label, "seconds": round(float(end) - float(start), 1),
              "start": float(start), "end": float(end),
              "busy": busy(cpu_now(cpu) if cpu else None, cpu_now()),
              "status": int(status), "passed": 0, "failed": 0, "ignored": 0,
              "problems": [] if int(status) == 0 else
              [f"exited with {status} (its output is above)"]}
    with open(log, "a") as f:
        f.write(json.dumps(record) + "\n")
    return 0


def declared(manifest):
    """[[test]] names of a Cargo.toml, checked against the tests/*.rs files
    their paths sit beside."""
    manifest = Path(manifest)
    text = manifest.read_text()
    tests = []
    for block in re.split(r"^\[", text, flags=re.M):
        if not block.startswith("[test]]"):
            continue
        name = re.search(r'^name\s*=\s*"([^"]+)"', block, re.M)
        path = re.search(r'^path\s*=\s*"([^"]+)"', block, re.M)
        if not name:
            print(f"test: a [[test]] of {manifest} has no name", file=sys.stderr)
            return 1
        rel = path.group(1) if path else f"tests/{name.group(1)}.rs"
        tests.append((name.group(1), (manifest.parent / rel).resolve()))
    dirs = {p.parent for _, p in tests} or {(manifest.parent / "tests").resolve()}
    paths = {p for _, p in tests}
    missing = [p for _, p in tests if not p.is_file()]
    undeclared = sorted(f for d in dirs for f in d.glob("*.rs") if f not in paths)
    for p in missing:
        print(f"test: {p} is declared in {manifest} but does not exist", file=sys.stderr)
    for f in undeclared:
        print(f"test: {f} is not declared as a [[test]] in {manifest}: "
              "declare it, or it never runs", file=sys.stderr)
    for n, p in tests:
        if p.is_file():
            print(n)
    return 1 if missing or undeclared else 0


def summary(log):
    records = [json.loads(l) for l in Path(log).read_text().splitlines() if l.strip()]
    print("test: seconds by part, and how busy the machine's cores were")
    for r in records:
        mark = "" if (r["status"] == 0 and not r["failed"] and not r["problems"]) else "  FAILED"
        counts = f"{r['passed']} passed, {r['failed']} failed" if r["passed"] or r["failed"] else ""
        load = f"{r['busy']:3d}%" if r.get("busy") is not None else "    "
        print(f"  {r['seconds']:8.1f} {load}  {r['label']:<28} {counts}{mark}")
    # Parts overlap (two lanes): the total is the run's span. Records of a
    # step with no times of its own (start 0) do not count.
    spans = [(r["start"], r["end"]) for r in records if r.get("start")]
    if spans:
        total = max(e for _, e in spans) - min(s for s, _ in spans)
        print(f"  {total:8.1f}       total (from the first part's start to the last one's end)")
    else:
        # A record kept from before the lanes: its parts ran one after the
        # other, but for one beside them.
        total = sum(r["seconds"] for r in records if not r.get("beside"))
        print(f"  {total:8.1f}       total")
    slow = sorted(((s, r["label"], t) for r in records for t, s in r.get("slowest", [])),
                  reverse=True)[:SLOWEST]
    if slow:
        print("test: the slowest tests (seconds)")
        for s, label, t in slow:
            print(f"  {s:8.1f}  {label}: {t}")
    passed = sum(r["passed"] for r in records)
    ignored = sum(r["ignored"] for r in records)
    probs = [(r["label"], p) for r in records for p in r["problems"]]
    # A non-zero exit with no failed test and no named problem still fails.
    unexplained = [r["label"] for r in records
                   if r["status"] != 0 and not r["failed"] and not r["problems"]]
    failed = sum(r["failed"] for r in records) + len(probs) + len(unexplained)
    for label, p in probs:
        print(f"test: FAILED: {label}: {p}")
    for label in unexplained:
        print(f"test: FAILED: {label}: exited non-zero (its output is above)")
    if passed == 0 and failed == 0:
        print("test: FAILED: no test ran")
        failed += 1
    print(f"tests: {passed} passed, {failed} failed, {ignored} skipped")
    return 1 if failed else 0


def main(argv):
    if len(argv) >= 4 and argv[0] == "run" and "--" in argv:
        i = argv.index("--")
        if i != 3:
            print(__doc__, file=sys.stderr)
            return 2
        return run(argv[1], argv[2], argv[i + 1:])
    if len(argv) in (6, 7) and argv[0] == "step":
        return step(*argv[1:])
    if len(argv) == 2 and argv[0] == "declared":
        return declared(argv[1])
    if len(argv) == 2 and argv[0] == "summary":
        return summary(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
