"""Where a run's wall time goes: model, engine start-up, sampling, scoring, training, weight sync, archiving.

Why: "how long does `make reports` take, and what share of it is engine start-up" decides what to speed up.
Each phase is timed where it happens (`EngineWorker` start / generate / update_weights, the trainer's scoring,
the GRPO update, the archive's writes) and accumulated per process as *exclusive* time: a phase entered inside
another pauses the outer one, so the phases never double count. The notebook's kernel writes its totals to
`logs/timing.json` whenever it archives something; `rlwb run` adds the report's rendering, calls the rest
`other` and stores the split in run.json (`time_s`); `rlwb times` tabulates it per notebook.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

PHASES = ("model", "engine_start", "sampling", "scoring", "training", "weight_sync", "archiving")

_totals: dict[str, float] = defaultdict(float)
_stack: list[list] = []  # [phase, time it (re)started]


@contextmanager
def phase(name: str):
    if name not in PHASES:
        raise ValueError(f"unknown timing phase {name!r}; known: {PHASES}")
    now = time.perf_counter()
    if _stack:  # pause the enclosing phase
        _totals[_stack[-1][0]] += now - _stack[-1][1]
    _stack.append([name, now])
    try:
        yield
    finally:
        end = time.perf_counter()
        n, t = _stack.pop()
        _totals[n] += end - t
        if _stack:
            _stack[-1][1] = end


def totals() -> dict[str, float]:
    """Seconds per phase so far in this process (phases never entered are 0)."""
    return {p: round(_totals.get(p, 0.0), 3) for p in PHASES}


def reset() -> None:
    _totals.clear()
    _stack.clear()


def split(kernel: dict[str, float], total_s: float, report_s: float) -> dict[str, float]:
    """The run's split: the kernel's phases, the report rendering added to archiving, `other` the rest of the
    wall time (kernel start, imports, metrics and statistics, figures' drawing), and the total."""
    out = {p: float(kernel.get(p, 0.0)) for p in PHASES}
    out["archiving"] += report_s
    out["other"] = max(0.0, total_s - sum(out.values()))
    out["total"] = total_s
    return {k: round(v, 2) for k, v in out.items()}
