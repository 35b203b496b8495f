"""The shape every experiment shares, and the helpers more than one of them uses.

Each notebook `notebooks/NN_<stem>.ipynb` has one module `rlwb/experiments/<stem>.py` whose entry point is

    run(params, model_path, *, on_start=None, progress=True) -> Result

`params` is the notebook's validated params object, `on_start` receives each engine's `info()` as it starts
(the archive records it), `progress` turns the progress bars on. The returned `Result` carries `.metrics`
(flat `group/name` numbers, what `metrics.json` and `rlwb compare` see), `.frames()` (the tables archived
as `data/<name>.parquet`), `.summary()` (the key table a report opens with) and `.conclusion()` (Markdown
whose every number comes from `.metrics`). The notebook only wires these to the archive and the plots.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rlwb.engines.worker import EngineWorker
from rlwb.formatting import metric

OnStart = Callable[[dict], None] | None


@dataclass
class Result:
    """What `run` returns. Subclasses add their own fields (rollouts, curves, ...) for the plots."""

    params: Any
    metrics: dict[str, float]

    def frames(self) -> dict[str, pd.DataFrame]:
        """Every table to archive, by name (`data/<name>.parquet`)."""
        raise NotImplementedError

    def summary(self) -> pd.DataFrame:
        """The key table, shown right under the conclusion."""
        raise NotImplementedError

    def conclusion(self) -> str:
        """The answer, in Markdown; every number from `self.metrics`."""
        raise NotImplementedError


def iter_engines(presets: list[str], model_path, dtype: str, progress: bool = True,
                 on_start: OnStart = None) -> Iterator[EngineWorker]:
    """Start each preset in turn (one engine process alive at a time), yield it, close it."""
    from rlwb.progress import progress_bar

    bar = progress_bar(presets, desc="engines", disable=not progress)
    for name in bar:
        bar.set_postfix_str(name)
        with EngineWorker(name, model_path, dtype=dtype) as w:
            if on_start:
                on_start(w.info())
            yield w


def ci_text(metrics: dict, group: str, name: str, fmt: str = ".1e") -> str:
    """`[low, high]` of `group/name`'s 95% interval (bounds at the float floor read as such), or "" when the
    metrics have none."""
    lo, hi = metrics.get(f"{group}/{name}_ci_low"), metrics.get(f"{group}/{name}_ci_high")
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi)):
        return ""
    return f"[{metric(name, lo, fmt)}, {metric(name, hi, fmt)}]"


def split_metrics(metrics: dict[str, float], group: str = "engine", name: str = "metric") -> pd.DataFrame:
    """`{"a/b/c": v}` -> rows (group="a/b", name="c", value=v): the long form the plots and tables use."""
    return pd.DataFrame([{group: k.rsplit("/", 1)[0], name: k.rsplit("/", 1)[1], "value": v}
                         for k, v in metrics.items()], columns=[group, name, "value"])


def measures_table(measures: pd.DataFrame, engines: list[str]) -> pd.DataFrame:
    """(engine, measure, value) rows -> measures (rows, in the order they were measured) by engine (columns, in
    params order): the summary of experiments that measure many different things per engine."""
    t = measures.pivot(index="measure", columns="engine", values="value")
    return t.loc[list(dict.fromkeys(measures["measure"])), [e for e in engines if e in t.columns]]
