"""The figure style machinery on figures made to break it: `overlapping_text` finds titles run into each other and
crammed tick labels, `tidy` fixes them, a glyph the paper font lacks falls back instead of printing as a box, and
every saved file names the run that made it. Every real figure in every style is checked on each notebook's smoke
run (tests/test_notebooks.py, `check_figures_fit`)."""

import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest

from rlwb.plots import figure_source, save_figure, set_style
from rlwb.plots.style import overlapping_text, tidy


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def crowded(style: str):
    """Three narrow panels with long two-line titles and a log axis under one decade (its minor ticks labelled)."""
    set_style(style)
    fig, axes = plt.subplots(1, 3, figsize=(5.6, 2.8), sharey=True)
    for ax in axes:
        ax.plot([3e-5, 3e-4], [0, 1])
        ax.set_xscale("log")
        ax.set_title("distribution mismatch\n(engine samples perturbed weights)")
    fig.tight_layout()
    return fig


@pytest.mark.parametrize("style", ["notebook", "paper", "blog"])
def test_overlapping_titles_and_tick_labels_are_found_then_tidied(style):
    fig = crowded(style)
    found = overlapping_text(fig)
    assert any("title" in a and "title" in b for a, b in found), found
    assert any(" tick " in a and " tick " in b for a, b in found), found
    tidy(fig)
    assert overlapping_text(fig) == []
    assert all(len(ax.title.get_text().splitlines()) >= 3 for ax in fig.axes)  # re-wrapped, not shrunk or cut
    tidy(fig)  # idempotent
    assert overlapping_text(fig) == []


def test_a_legend_over_an_axis_label_is_found():
    set_style("paper")
    fig, ax = plt.subplots(figsize=(2.7, 2.4))
    ax.barh(["a"], [1.0], label="rollout")
    ax.set_xlabel("seconds per GRPO step (mean)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.05))
    assert {"axes 0 x label", "axes 0 legend"} in [{a, b} for a, b in overlapping_text(fig)]


def test_the_paper_font_draws_every_symbol_the_figures_use(tmp_path):
    """★ (a real engine in 08's figure), ‖ (k3's arguments), −, ≤, →, Δ: none missing from the paper style's fonts
    (DejaVu Serif lacks ★: matplotlib warns 'Glyph 9733 missing' and prints a box unless a font falls back)."""
    set_style("paper")
    fig, ax = plt.subplots()
    ax.set_title("★ real engines; k3(engine ‖ trainer) − ≤ → Δlogp")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        save_figure(fig, tmp_path / "symbols")
    assert not [w for w in caught if "missing from font" in str(w.message)]


def test_each_saved_figure_names_the_run_that_made_it(tmp_path):
    set_style("notebook")
    fig, ax = plt.subplots()
    ax.plot(np.arange(3))
    png = save_figure(fig, tmp_path / "f", source="08_mismatch_cost/20261125-123908-0efc38c7")
    assert figure_source(png) == "08_mismatch_cost/20261125-123908-0efc38c7"
    assert b"rlwb run 08_mismatch_cost/20261125-123908-0efc38c7" in (tmp_path / "f.svg").read_bytes()
    assert b"rlwb run 08_mismatch_cost/20261125-123908-0efc38c7" in (tmp_path / "f.pdf").read_bytes()
    assert figure_source(save_figure(fig, tmp_path / "g")) is None  # a scratch figure names no run


def test_a_figure_saved_as_png_only_writes_no_vector_copy_and_png_cannot_be_left_out(tmp_path):
    set_style("notebook")
    fig, ax = plt.subplots()
    ax.plot(np.arange(3))
    assert save_figure(fig, tmp_path / "f", formats=("png",)).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.png"]
    for bad in (("svg",), ("png", "eps")):
        with pytest.raises(ValueError, match="'png' and any of"):
            save_figure(fig, tmp_path / "g", formats=bad)
    assert not list(tmp_path.glob("g.*"))
    plt.close(fig)


def test_a_short_figure_whose_title_wraps_keeps_its_axes_under_it():
    """07's race_gaps in paper style (a column wide, 1.6 in tall): its title wraps to three lines, and tidy's
    relayout must leave the axes and their title under it at a readable height (tight_layout counted the title twice,
    gave up, and the title stayed over the axes' title; padded at every pass the axes shrank to a sliver)."""
    set_style("paper")
    fig, ax = plt.subplots(figsize=(3.4, 1.6))
    ax.errorbar([0.1, 0.1, 0.0], [0, 1, 2], xerr=1.5, fmt="o")
    ax.set_yticks([0, 1, 2], ["verl.geo_rs", "trl.sequence_mask", "none"])
    ax.set_title("level: vllm-v1-bf16")
    ax.set_xlabel("final reward − baseline")
    fig.suptitle("What recovers the baseline (95% CI over seeds, paired by seed; shaded: equivalence margin)")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tidy(fig)
    assert overlapping_text(fig) == []
    assert not [w for w in caught if "Tight layout not applied" in str(w.message)]
    assert ax.get_window_extent().height >= 0.25 * fig.dpi  # a quarter inch for three rows at least
    assert all(t.get_text() for t in ax.get_yticklabels())  # every name kept


def test_an_equal_aspect_panel_keeps_its_size_through_tidy():
    """10's prob_scatter with one engine: an equal-aspect axes is drawn narrower than its slot; tidy's relayout must
    lay out the slot, not shrink to what is drawn at every pass (it did, until its title met its y label)."""
    set_style("paper")
    fig, ax = plt.subplots(figsize=(2.2, 1.9))
    ax.plot([0, 1], [0, 1])
    ax.set_aspect("equal")
    ax.set_title("vllm-v1-processed\nPearson 1 − r = 3.9e-13", fontsize="small")
    ax.set(xlabel="p trainer", ylabel="p engine")
    fig.suptitle("Sampled-token probability: engine vs trainer")
    fig.tight_layout()
    tidy(fig)
    assert overlapping_text(fig) == []
    assert ax.get_window_extent().width >= 0.7 * fig.dpi


def test_the_dose_response_legend_names_an_arm_trained_at_some_kinds_only():
    """The study trims rows (`row_arms`): the length-scaled Geo-RS arm has no stale doses, so it has no line in the
    last panel, where the legend sits. Seen on the 2026-11-26 study: its line was drawn, its name was missing."""
    import pandas as pd

    from rlwb.plots.mismatch_cost import dose_response

    rows = []
    for kind in ("ratio", "stale"):
        for arm in ("none@engine", "geo_rs_len@trainer"):
            if kind == "stale" and arm == "geo_rs_len@trainer":
                continue
            rows += [{"kind": kind, "arm": arm, "name": kind, "part": "group", "dose": dose, "y": y, "low": y - 0.05,
                      "high": y + 0.05, "baseline": 0.3, "gain": 0.3, "status": None, "label": None, "control": None}
                     for dose, y in ((0.0, 0.6), (0.01, 0.55), (0.1, 0.45))]
    fig = dose_response(pd.DataFrame(rows))
    legend = fig.axes[-1].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["none@engine", "geo_rs_len@trainer"]
    plt.close(fig)


def test_an_arm_keeps_its_colour_whichever_arms_a_figure_shows():
    """Decoupled is drawn in decoupled's colour in a run that trains decoupled and TIS alone (the bracketing study) as
    in one that trains bypass first (the studies of record): a reader sets their figures side by side. Seen on the
    2026-11-30 bracketing run: decoupled came out in bypass's black."""
    import pandas as pd
    from matplotlib.colors import to_hex

    from rlwb.plots.mismatch_cost import dose_response, reward_curves

    def fits(arms):
        return pd.DataFrame([{"kind": "weights", "arm": arm, "name": "weights", "part": "group", "dose": dose, "y": y,
                              "low": y - 0.05, "high": y + 0.05, "baseline": 0.3, "gain": 0.3, "status": None,
                              "label": None, "control": None}
                             for arm in arms for dose, y in ((0.0, 0.6), (0.01, 0.55), (0.1, 0.45))])

    def colours(fig):
        legend = fig.axes[-1].get_legend()
        out = {t.get_text(): to_hex(h.get_color() if hasattr(h, "get_color") else h.lines[0].get_color())
               for t, h in zip(legend.get_texts(), legend.legend_handles)}
        plt.close(fig)
        return out

    every = colours(dose_response(fits(["none@engine", "none@trainer", "tis@trainer"])))
    some = colours(dose_response(fits(["none@trainer", "tis@trainer"])))
    assert len(set(every.values())) == 3 and some == {a: every[a] for a in ("none@trainer", "tis@trainer")}
    curves = pd.DataFrame([{"label": "clean", "kind": "clean", "dose": 0.0, "arm": arm, "seed": seed, "step": step,
                            "temperature": 0.7, "reward_mean": 0.5} for arm in ("tis@trainer", "none@trainer")
                           for seed in (0, 1) for step in range(6)])
    assert colours(reward_curves(curves)) == {a: every[a] for a in ("tis@trainer", "none@trainer")}


def test_the_dose_response_draws_the_long_horizon_as_its_own_series_and_no_further_regime():
    """A horizon run fits its arm at the study's horizon and at the long one (`weights` and `weights+long`): both
    drawn, the long one named as such, in one panel; a further PPO regime's row (`weights+ppo4`) is not drawn (its
    own regimes table reads it)."""
    import pandas as pd

    from rlwb.plots.mismatch_cost import dose_response

    rows = [{"kind": "weights", "arm": "none@engine", "name": name, "part": "group", "dose": dose, "y": y - drop,
             "low": y - drop - 0.05, "high": y - drop + 0.05, "baseline": 0.3, "gain": 0.3, "status": None,
             "label": None, "control": None}
            for name, drop in (("weights", 0.0), ("weights+long", 0.1), ("weights+ppo4", 0.2))
            for dose, y in ((0.0, 0.6), (1e-5, 0.55), (1e-4, 0.45), (1e-3, 0.4), (1e-2, 0.35))]
    fig = dose_response(pd.DataFrame(rows))
    assert len(fig.axes) == 1
    legend = fig.axes[-1].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["none@engine", "none@engine, long horizon"]
    assert len(fig.axes[0].containers) == 2  # two error-bar series: the ppo4 row is not drawn
    plt.close(fig)
