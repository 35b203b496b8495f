"""`rlwb figures`: a run's figures regenerated from its data/ alone (a bench run's from its bench.json).

Why figures come from `data/` alone: a figure in a paper must be rebuildable years later without engines,
GPUs or training - only the archived parquet files and the plotting function (the same one the notebook
called)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from rlwb import archive, plots


def notebook_of(run_dir: Path) -> str:
    info = archive.read_record(run_dir, {})
    return info.get("notebook") or run_dir.parent.name


def draw_figures(run_dir: str | os.PathLike, style: str = "notebook") -> Iterator[tuple[str, object]]:
    """(name, matplotlib figure) for every figure of a run, drawn in `style` from its `data/*.parquet` alone (what
    `regenerate_figures` saves, and what tests render); the caller closes each figure. A figure the run never made
    (its table absent and no file of it) is skipped; one whose table is missing is an error."""
    run_dir = Path(run_dir)
    if not archive.has_record(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {archive.RECORD})")
    from rlwb.registry import NOTEBOOKS

    nb = notebook_of(run_dir)
    if nb == archive.BENCH:  # `rlwb bench`: its figures are drawn from its numbers
        from rlwb.plots import bench as bench_plots

        res = archive.read_json(run_dir / "bench.json")
        if res is None:
            raise FileNotFoundError(f"{run_dir / 'bench.json'} is missing or unreadable: cannot rebuild its figures")
        yield from bench_plots.draw(res, style)
        return
    if nb not in NOTEBOOKS:
        raise ValueError(f"no figure recipes for notebook {nb!r}")
    plots.set_style(style)
    cache = {}
    for name, (data, fn) in NOTEBOOKS[nb].figures().items():
        if data not in cache:
            path = run_dir / "data" / f"{data}.parquet"
            if not path.exists():
                if not (run_dir / "figures" / f"{name}.png").exists():
                    continue  # the run never made this figure (e.g. reward_samples 0, or an older run)
                raise FileNotFoundError(f"{path} is missing: cannot rebuild figure {name!r}")
            cache[data] = pd.read_parquet(path)
        yield name, fn(cache[data], style=style)


def regenerate_figures(run_dir: str | os.PathLike, style: str = "notebook",
                       formats: tuple[str, ...] = plots.FIGURE_FORMATS) -> list[Path]:
    """Rebuild every figure of a run from `data/*.parquet`. `notebook` style overwrites `figures/`
    (reproducing the notebook's files; run.json's `figures_redrawn` records the commit that redrew them, since a
    later commit's figure code may draw them otherwise than the run's); `paper` / `blog` write to
    `figures/<style>/`. Each file names the run (`rlwb.plots.save_figure`'s `source`). `formats`: PNG and the
    vector copies by default; a check of the drawing alone asks for PNG only."""
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    out_dir = run_dir / "figures" if style == "notebook" else run_dir / "figures" / style
    info = archive.read_record(run_dir, {})
    source, written = f"{notebook_of(run_dir)}/{info.get('run_id') or run_dir.name}", []
    for name, fig in draw_figures(run_dir, style):
        written.append(plots.save_figure(fig, out_dir / name, source, formats))
        plt.close(fig)
    if style == "notebook" and written:  # the run's own figures/ now come from this code, not the run's commit
        git = archive.git_info()
        info.setdefault("figures_redrawn", []).append({"at": archive.utc_now(), "commit": git["git_commit"],
                                                       "git_dirty": git["git_dirty"]})
        archive.write_record(run_dir, info)
    return written
