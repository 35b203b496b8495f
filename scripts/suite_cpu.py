"""How busy the machine was while each test ran (a benchmark, not a test): a pytest plugin and its report.

Why: on CI's 2 cores the suite's wall time is what counts, and "this test took 40 s" does not say whether both cores
worked for it or one sat idle (an engine start, a kernel's imports and a papermill run are single-threaded; the
trainer and the V0 and HF engines run two OpenMP threads). This plugin reads the machine-wide CPU counters of
/proc/stat before and after each test (setup, call and teardown, as the JUnit times are), so every process counts:
pytest and its xdist workers, the engine workers, notebook kernels and vLLM servers. `busy` is user + system time
at normal priority, `nice` the time of niced processes, `idle` idle + iowait; all in CPU-seconds, so on 2 cores
busy + nice + idle is about twice the wall time.

usage:
  make test PYTEST_ARGS="-p scripts.suite_cpu"        # writes outputs/tests/cpu.json (RLWB_SUITE_CPU=FILE: elsewhere)
  python scripts/suite_cpu.py [outputs/tests/cpu.json] [--top N]   # totals, then the N longest tests
Under pytest-xdist each worker writes FILE.<worker id>.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import pytest

DEFAULT = Path(__file__).resolve().parent.parent / "outputs" / "tests" / "cpu.json"
_ROWS: list[dict] = []


def _counters() -> tuple[float, float, float]:
    """(busy, nice, idle) CPU-seconds since boot, over all CPUs."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
    hz = os.sysconf("SC_CLK_TCK")
    return (user + system + irq + softirq) / hz, nice / hz, (idle + iowait) / hz


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    before, t0 = _counters(), time.monotonic()
    yield
    after = _counters()
    _ROWS.append({"id": item.nodeid, "wall": round(time.monotonic() - t0, 3),
                  **{k: round(b - a, 2) for k, a, b in zip(("busy", "nice", "idle"), before, after, strict=True)}})


def pytest_sessionfinish(session):
    if not _ROWS:
        return
    out = Path(os.environ.get("RLWB_SUITE_CPU", DEFAULT))
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    out = out.with_name(f"{out.name}.{worker}") if worker else out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(_ROWS, indent=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", nargs="?", type=Path, default=DEFAULT)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args()
    rows = json.loads(a.file.read_text())
    wall, busy, nice, idle = (sum(r[k] for r in rows) for k in ("wall", "busy", "nice", "idle"))
    print(f"{a.file}: {len(rows)} tests, {wall:.0f} s of test time; CPU-seconds: {busy:.0f} busy, {nice:.0f} niced, "
          f"{idle:.0f} idle ({idle / max(busy + nice + idle, 1e-9):.0%} of the machine)")
    print(f"{'wall s':>7} {'busy':>6} {'nice':>6} {'idle':>6}  test")
    for r in sorted(rows, key=lambda r: -r["wall"])[:a.top]:
        print(f"{r['wall']:7.1f} {r['busy']:6.1f} {r['nice']:6.1f} {r['idle']:6.1f}  {r['id']}")


if __name__ == "__main__":
    main()
