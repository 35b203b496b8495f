"""`rlwb figures`: a run's figures regenerated from its data/ alone.

Why figures come from `data/` alone: a figure in a paper must be rebuildable years later without engines,
GPUs or training - only the archived parquet files and the plotting function (the same one the notebook
called)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from rlwb import archive, plots


def notebook_of(run_dir: Path) -> str:
    info = archive.read_json(run_dir / "run.json", {})
    return info.get("notebook") or run_dir.parent.name


def regenerate_figures(run_dir: str | os.PathLike, style: str = "notebook") -> list[Path]:
    """Rebuild every figure of a run from `data/*.parquet`. `notebook` style overwrites `figures/`
    (reproducing the notebook's files); `paper` / `blog` write to `figures/<style>/`."""
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    if not (run_dir / "run.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no run.json)")
    from rlwb.registry import NOTEBOOKS

    nb = notebook_of(run_dir)
    if nb not in NOTEBOOKS:
        raise ValueError(f"no figure recipes for notebook {nb!r}")
    plots.set_style(style)
    out_dir = run_dir / "figures" if style == "notebook" else run_dir / "figures" / style
    written, cache = [], {}
    for name, (data, fn) in NOTEBOOKS[nb].figures().items():
        if data not in cache:
            path = run_dir / "data" / f"{data}.parquet"
            if not path.exists():
                if not (run_dir / "figures" / f"{name}.png").exists():
                    continue  # the run never made this figure (e.g. reward_samples 0, or an older run)
                raise FileNotFoundError(f"{path} is missing: cannot rebuild figure {name!r}")
            cache[data] = pd.read_parquet(path)
        fig = fn(cache[data], style=style)
        written.append(plots.save_figure(fig, out_dir / name))
        plt.close(fig)
    return written
