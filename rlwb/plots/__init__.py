"""Figures: one module per notebook (`rlwb/plots/<experiment>.py`, named as `rlwb/experiments/` is) holding one
function per figure and `FIGURES`, the recipes `rlwb figures` rebuilds a run's figures from; `style` is what every
figure shares. The style API is re-exported here for code outside the notebooks (sweeps, the bench, the index)."""

from rlwb.plots.style import (
    FIGURE_FORMATS,
    FLOOR_VALUE,
    engine_color,
    engine_order,
    engine_style,
    figsize,
    figure_source,
    save_figure,
    set_style,
)

__all__ = ["FIGURE_FORMATS", "FLOOR_VALUE", "engine_color", "engine_order", "engine_style", "figsize", "figure_source",
           "save_figure", "set_style"]
