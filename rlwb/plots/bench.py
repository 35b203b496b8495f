"""Figures of an `rlwb bench` run, drawn from its bench.json alone (the bench's numbers: a run has no data/ tables),
so `rlwb figures <bench run>` redraws them as it redraws a notebook run's.

One function per figure, each returning None when the run measured nothing it would show, and `FIGURES`: figure name
-> ("bench", the function), "bench" naming bench.json where a notebook's recipes name a data/<table>.parquet."""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np

from rlwb.plots.style import engine_color, figsize, set_style


def measured_presets(res: dict) -> list[str]:
    """The presets whose tokens/s the run measured at every batch size, in the order it measured them."""
    bss = res["settings"]["batch_sizes"]
    named = dict.fromkeys(m.group(1) for k in res if (m := re.fullmatch(r"tput/(.+)/bs\d+", k)))
    return [p for p in named if all(f"tput/{p}/bs{b}" in res for b in bss)]


def throughput(res: dict, style: str = "notebook"):
    """Generated tokens/s per preset at each batch size (log scale); None when no preset was measured."""
    bss, presets = res["settings"]["batch_sizes"], measured_presets(res)
    if not presets:
        return None
    set_style(style)
    fig, ax = plt.subplots(figsize=figsize(style))
    w = 0.8 / len(presets)
    for i, p in enumerate(presets):
        ax.bar(np.arange(len(bss)) + (i - (len(presets) - 1) / 2) * w, [res[f"tput/{p}/bs{b}"] for b in bss], w,
               label=p, color=engine_color(p))
    ax.set_xticks(range(len(bss)), [f"batch {b}" for b in bss])
    ax.set_yscale("log")
    ax.set_ylabel("generated tokens / s")
    ax.set_title(f"Rollout throughput on {res['machine']['cores']} CPU cores (fp32, tiny model)")
    ax.grid(axis="x", visible=False)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def scaling(res: dict, style: str = "notebook"):
    """Step time and completion-token throughput vs completions per step, rlwb vs TRL + vLLM (same engine); None
    when neither loop was measured."""
    loops = {"rlwb": ("rlwb, vllm-v1-fixed worker", "#009E73", "-"),
             "trl_vllm": ("TRL GRPOTrainer, vLLM colocate", "#D55E00", "--")}
    series = {lp: sorted((int(k.split("/")[2][1:]), v) for k, v in res.items()
                         if k.startswith(f"scaling/{lp}/") and k.endswith("/step_s") and v) for lp in loops}
    if not any(series.values()):
        return None
    set_style(style)
    fig, axes = plt.subplots(1, 2, figsize=figsize(style, 1.3))
    for lp, (label, color, ls) in loops.items():
        pts = series[lp]
        if not pts:
            continue
        n = [c for c, _ in pts]
        axes[0].plot(n, [v for _, v in pts], marker="o", color=color, ls=ls, label=label)
        axes[1].plot(n, [res[f"scaling/{lp}/n{c}/tok_s"] for c in n], marker="o", color=color, ls=ls, label=label)
    ticks = sorted({c for pts in series.values() for c, _ in pts})
    for ax, ylabel in zip(axes, ("seconds per GRPO step (median)", "completion tokens / s")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("completions per step (group 8)")
        ax.set_ylabel(ylabel)
    axes[0].legend(fontsize="small", loc="upper left")
    fig.suptitle(f"GRPO step scaling on {res['machine']['cores']} CPU cores: same vLLM engine settings (fp32), "
                 f"both with TRL's IS correction (rlwb: trl.sequence_mask)", fontsize="medium")
    fig.tight_layout()
    return fig


FIGURES = {"throughput": ("bench", throughput), "scaling": ("bench", scaling)}


def draw(res: dict, style: str = "notebook"):
    """(name, figure) for each figure the bench result `res` (its bench.json) holds; the caller closes each."""
    for name, (_, fn) in FIGURES.items():
        fig = fn(res, style)
        if fig is not None:
            yield name, fig
