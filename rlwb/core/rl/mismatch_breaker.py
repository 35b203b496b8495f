"""A circuit breaker on engine/trainer mismatch for RL steps: stop training when the mismatch appears.

Why: a mismatch that enters the importance ratios (raw logprobs at T != 1, a stale prefix cache after a
weight update, a bf16 head) biases every later update silently; reward curves show it only much later.
The monitor watches the per-step engine-vs-trainer mismatch the GRPO loop already measures on the
step's own tokens (k3 and mean |Δlogp|), averages it over consecutive non-overlapping windows of steps,
and trips after `patience` windows in a row above the threshold — the "correctness before corrections"
advice made mechanical.
On trip it writes the offending rollout batch to `data/` for a post-mortem.

k3: Schulman, http://joschu.net/blog/kl-approx.html; monitoring it per step as verl's `rollout_corr/k3_kl`
and prime-rl's `mismatch_kl` do. Any correction health column (`correction_catalog.HEALTH`: ESS, masked
fraction, ...) can be watched instead; for ESS, the wrong side is the level falling *below* the threshold.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlwb.core.rl.correction_catalog import HEALTH, LOWER_IS_WORSE
from rlwb.errors import MismatchBreakerTripped

MONITORED = ("mismatch_k3", "abs_dlogp_mean", *HEALTH)  # per-step curve columns a monitor can watch


@dataclass
class MismatchBreaker:
    """Feed it each step's row (`mismatch_k3`, `abs_dlogp_mean`, health columns) and, optionally, the batch.

    threshold: on the window mean of `metric` (above it trips; below it for ESS); window: steps averaged;
    patience: consecutive windows on the wrong side of the threshold before tripping; raise_on_trip: raise
    `MismatchBreakerTripped` (else only set `tripped`); save_dir, name: where the tripping step's rollouts go,
    `<save_dir>/<name>_step<N>.parquet`."""

    threshold: float
    window: int = 3
    patience: int = 2
    metric: str = "mismatch_k3"
    raise_on_trip: bool = True
    save_dir: Path | None = None
    name: str = "mismatch"
    values: deque = field(default_factory=deque, repr=False)
    above: int = 0
    tripped: bool = False
    trip_step: int | None = None
    history: list[dict] = field(default_factory=list, repr=False)

    def __post_init__(self):
        if not (self.threshold > 0 and np.isfinite(self.threshold)):
            raise ValueError(f"mismatch breaker threshold must be a finite number > 0, got {self.threshold!r}")
        if self.window < 1 or self.patience < 1:
            raise ValueError(f"window and patience must be >= 1, got {self.window} and {self.patience}")
        if self.metric not in MONITORED:
            raise ValueError(f"metric must be one of {', '.join(MONITORED)}; got {self.metric!r}")
        self.values = deque()

    def update(self, row: dict, batch: dict | None = None) -> bool:
        """One RL step. Returns True when the breaker has tripped (now or before)."""
        v = float(row[self.metric])
        if not np.isfinite(v):
            raise ValueError(f"step {row.get('step')}: {self.metric} is {v}; a broken measurement, not a mismatch")
        self.values.append(v)
        if len(self.values) < self.window:  # windows do not overlap: one spike counts once
            return self.tripped
        level = float(np.mean(self.values))
        self.values.clear()
        bad = level < self.threshold if self.metric in LOWER_IS_WORSE else level > self.threshold
        self.above = self.above + 1 if bad else 0
        self.history.append({"step": row.get("step"), "window_mean": level, "above": self.above})
        if self.tripped or self.above < self.patience:
            return self.tripped
        self.tripped, self.trip_step = True, row.get("step")
        saved = self._save(batch) if batch is not None and self.save_dir is not None else None
        if self.raise_on_trip:
            raise MismatchBreakerTripped(int(row.get("step", -1)), self.metric, level, self.threshold, saved)
        return True

    def _save(self, batch: dict) -> Path:
        """The offending step's rollouts, one row per completion, as parquet."""
        import pandas as pd

        self.save_dir.mkdir(parents=True, exist_ok=True)
        n = len(batch["token_ids"])
        rows = [{k: (np.asarray(batch[k][i]).tolist() if k != "reward" else float(batch[k][i])) for k in batch}
                for i in range(n)]
        path = self.save_dir / f"{self.name}_step{self.trip_step}.parquet"
        pd.DataFrame(rows).to_parquet(path)
        return path
