"""The test suite's time per module, from one run's durations (a benchmark, not a test).

Why: the suite must fit CI's budget (`.ci/run` from an empty cache in 30 min on 2 cores), and "which module costs
what" decides where to save. Every `make test` writes pytest's JUnit report to `outputs/tests/junit.xml`
(pyproject.toml's addopts); each test's time there is its setup + call + teardown on its worker, so a session
fixture's cost (an engine start, the shared notebook-00 runs) lands on the first test that asks for it, wherever the
random order put it: compare modules, not single tests. Under pytest-xdist the workers' times overlap: their sum is
worker-seconds (about workers x wall time when both are busy, and longer per test than alone, since they share the
cores), not wall time; the session's wall time is the report's own `time`. Compare runs with the same workers.

usage: python scripts/suite_times.py [JUNIT.xml] [--compare OLD.xml] [--top N]
  prints per module: tests, seconds, share of the suite; then the N slowest tests. With --compare, each module's
  seconds in OLD beside the new ones and their ratio (both measured, in the runs named).
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

DEFAULT = Path(__file__).resolve().parent.parent / "outputs" / "tests" / "junit.xml"


def wall_time(path: Path) -> float:
    """The session's wall time, as pytest recorded it in the report."""
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return float(suite.get("time", "nan"))


def read(path: Path) -> dict[str, float]:
    """test id (module::name[param]) -> seconds, for every test case of the report."""
    root = ET.parse(path).getroot()
    out = {}
    for case in root.iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        out[f"{module}::{case.get('name')}"] = float(case.get("time", 0.0))
    if not out:
        raise SystemExit(f"{path}: no test cases in this JUnit report")
    return out


def per_module(times: dict[str, float]) -> dict[str, tuple[int, float]]:
    mods: dict[str, list[float]] = defaultdict(list)
    for test, s in times.items():
        mods[test.split("::")[0]].append(s)
    return {m: (len(v), sum(v)) for m, v in mods.items()}


def fmt(s: float) -> str:
    return f"{int(s // 60)} m {s % 60:04.1f} s" if s >= 60 else f"{s:.1f} s"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--compare", type=Path, help="an older run's JUnit report: per-module ratios")
    ap.add_argument("--top", type=int, default=15, help="how many of the slowest tests to list")
    a = ap.parse_args(argv)
    times = read(a.junit)
    mods = per_module(times)
    old = per_module(read(a.compare)) if a.compare else {}
    total = sum(s for _, s in mods.values())
    print(f"{a.junit}: {len(times)} tests in {fmt(wall_time(a.junit))} of wall time; {fmt(total)} of "
          "worker-seconds (the sum of the tests' times)")
    head = f"{'module':<40} {'tests':>5} {'seconds':>9} {'share':>6}"
    print(head + (f" {'before':>9} {'ratio':>6}" if old else ""))
    for m, (n, s) in sorted(mods.items(), key=lambda kv: -kv[1][1]):
        line = f"{m:<40} {n:>5} {s:>9.1f} {100 * s / total:>5.1f}%"
        if old:
            before = old.get(m, (0, 0.0))[1]
            line += f" {before:>9.1f} {s / before:>6.2f}" if before else f" {'-':>9} {'-':>6}"
        print(line)
    if old:
        gone = sorted(set(old) - set(mods))
        old_total = sum(s for _, s in old.values())
        wall, old_wall = wall_time(a.junit), wall_time(a.compare)
        print(f"worker-seconds: {fmt(total)} vs {fmt(old_total)} before ({total / old_total:.2f}x); wall time: "
              f"{fmt(wall)} vs {fmt(old_wall)} ({wall / old_wall:.2f}x)"
              + (f"; modules only before: {', '.join(gone)}" if gone else ""))
    print(f"\nslowest {a.top} tests (setup + call + teardown):")
    for t, s in sorted(times.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"{s:>8.1f} s  {t}")


if __name__ == "__main__":
    main()
