"""Where a run's wall time goes: model, engine start-up, sampling, scoring, training, weight sync, archiving.

Why: "how long does `make reports` take, and what share of it is engine start-up" decides what to speed up.
Each phase is timed where it happens (`EngineWorker` start / generate / update_weights, the trainer's scoring,
the GRPO update, the archive's writes) and accumulated per process as *exclusive* wall time: a phase entered
inside another pauses the outer one, so the phases never double count. Threads (notebooks 03 and 07 train two
GRPO runs at once) share the wall clock: while k threads are each inside a phase, each of their innermost
phases is credited 1/k of the elapsed time, so the split still adds up to the wall time, not to more. The
notebook's kernel writes its totals to `logs/timing.json` whenever it archives something; `rlwb run` adds the
report's rendering, calls the rest `other` and stores the split in run.json (`time_s`); `rlwb times`
tabulates it per notebook.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from contextlib import contextmanager

PHASES = ("model", "engine_start", "sampling", "scoring", "training", "weight_sync", "archiving")

_totals: dict[str, float] = defaultdict(float)
_stacks: dict[int, list[str]] = {}  # thread id -> its phases, innermost last
_last = time.perf_counter()  # when the elapsed time was last credited
_lock = threading.Lock()


def _credit(now: float) -> None:
    """Credit the time since the last event to the innermost phase of every thread inside one, in equal
    shares (caller holds the lock)."""
    global _last
    tops = [st[-1] for st in _stacks.values() if st]
    for name in tops:
        _totals[name] += (now - _last) / len(tops)
    _last = now


@contextmanager
def phase(name: str):
    if name not in PHASES:
        raise ValueError(f"unknown timing phase {name!r}; known: {PHASES}")
    tid = threading.get_ident()
    with _lock:
        _credit(time.perf_counter())
        _stacks.setdefault(tid, []).append(name)
    try:
        yield
    finally:
        with _lock:
            _credit(time.perf_counter())
            st = _stacks[tid]
            st.pop()
            if not st:
                del _stacks[tid]


def totals() -> dict[str, float]:
    """Seconds per phase so far in this process (phases never entered are 0), up to now."""
    with _lock:
        _credit(time.perf_counter())
        return {p: round(_totals.get(p, 0.0), 3) for p in PHASES}


def reset() -> None:
    global _last
    with _lock:
        _totals.clear()
        _stacks.clear()
        _last = time.perf_counter()


def split(kernel: dict[str, float], total_s: float, report_s: float) -> dict[str, float]:
    """The run's split: the kernel's phases, the report rendering added to archiving, `other` the rest of the
    wall time (kernel start, imports, metrics and statistics, figures' drawing), and the total."""
    out = {p: float(kernel.get(p, 0.0)) for p in PHASES}
    out["archiving"] += report_s
    out["other"] = max(0.0, total_s - sum(out.values()))
    out["total"] = total_s
    return {k: round(v, 2) for k, v in out.items()}
