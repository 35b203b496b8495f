"""The style every figure shares: palette, engine colours and order, sizes, saving, seed bands.

Why fixed colours: a reader comparing the mismatch, KL and GRPO figures should recognise `vllm-v1` by
colour everywhere. The palette is Okabe-Ito (colour-blind safe). Saved files are deterministic (no
dates or random ids in PDF/SVG metadata) so regenerating a run's figures reproduces them.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

OKABE_ITO = ["#000000", "#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7"]
ENGINE_COLORS = {
    "hf": "#000000",
    "vllm-v0": "#0072B2",
    "vllm-v1": "#D55E00",
    "vllm-v1-processed": "#E69F00",
    "vllm-v1-fixed": "#009E73",
}
LADDER = ["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"]
# Line styles too, so curves that coincide (e.g. processed and fixed at the float floor) stay visible
# and figures survive black-and-white printing.
ENGINE_STYLES = {"hf": "-", "vllm-v0": "--", "vllm-v1": "-", "vllm-v1-processed": ":", "vllm-v1-fixed": "-."}


def engine_style(name: str) -> str:
    return ENGINE_STYLES.get(name.split("+")[0], "-")


def engine_color(name: str) -> str:
    base = name.split("+")[0]
    if base in ENGINE_COLORS:
        return ENGINE_COLORS[base]
    return OKABE_ITO[(sum(map(ord, base)) % 3) + 4]  # user presets: stable, distinct from the ladder


def set_style(style: str = "notebook") -> None:
    """`notebook` (screen), `paper` (serif, single-column width, vector) or `blog` (larger type)."""
    if style not in ("notebook", "paper", "blog"):
        raise ValueError(f"style must be notebook, paper or blog, got {style!r}")
    plt.rcdefaults()
    rc = {
        "figure.dpi": 110, "savefig.dpi": 200, "savefig.bbox": "tight", "axes.spines.top": False,
        "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3, "legend.frameon": False,
        "font.size": 10, "axes.titlesize": 11, "svg.hashsalt": "rlwb", "pdf.fonttype": 42,
    }
    if style == "paper":
        # DejaVu Sans after the serif fonts: glyphs the serif lacks (★ marks real engines) fall back to it, not to a box
        rc.update({"font.family": ["serif", "DejaVu Sans"], "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8,
                   "legend.fontsize": 7, "xtick.labelsize": 7, "ytick.labelsize": 7, "lines.linewidth": 1.2})
    if style == "blog":
        rc.update({"font.size": 12, "axes.titlesize": 13, "lines.linewidth": 2})
    plt.rcParams.update(rc)


FIGSIZE = {"notebook": (7.0, 4.0), "paper": (3.4, 2.4), "blog": (8.0, 4.5)}
PAPER_TEXT_WIDTH = 7.0  # inches: a two-column paper's text width (a figure* spanning both columns)


def figsize(style: str = "notebook", wide: float = 1.0, tall: float = 1.0) -> tuple[float, float]:
    """(width, height) in inches: the style's size times `wide` and `tall`. A wide paper figure (several panels, a
    heatmap) spans the page, up to its text width, instead of keeping a column's proportions: at a column's width
    its titles and cell labels, at the paper's type size, ran into each other."""
    w, h = FIGSIZE.get(style, FIGSIZE["notebook"])
    if style == "paper" and wide > 1.15:
        width = min(PAPER_TEXT_WIDTH, w * wide * 1.3)
        return (width, h * tall * width / (w * wide))  # the proportions kept: rows of a heatmap grow too
    return (w * wide, h * tall)


def lay_out(fig):
    """Lay a figure out as drawing it would (text positions and sizes, ticks, a layout engine) without rasterising
    anything, and return the renderer its extents are measured with. Why not `fig.canvas.draw()`: `tidy` and
    `overlapping_text` need extents only, and painting every pixel (every point of a scatter of a run's tokens) at
    each of their several layout passes is wasted work. Same renderer (Agg at the figure's dpi), so the extents are
    those a draw gives."""
    fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def legend_below(fig, handles, labels, max_cols: int = 4):
    """A figure legend centred under the panels, in as many columns (up to `max_cols`) as fit the figure's width,
    and the panels laid out above it with the legend's measured height kept free. Why measured: a fixed fraction of
    the figure kept for it is too little in a short paper-style figure (the legend ran into the x label), and a row
    of entries wider than a column-wide figure ran past its edges."""
    renderer = fig.canvas.get_renderer()
    for ncols in range(max(1, min(max_cols, len(labels))), 0, -1):
        legend = fig.legend(handles, labels, fontsize="small", ncols=ncols, loc="lower center",
                            bbox_to_anchor=(0.5, 0.0))
        if ncols == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            break
        legend.remove()
    room = (legend.get_window_extent(renderer).height + 3 * fig.dpi / 72) / fig.bbox.height
    fig.tight_layout(rect=(0, room, 1, 1))
    return legend


def text_boxes(fig) -> list[tuple[str, object, object]]:
    """(what, text artist or legend, window extent) of every piece of text the figure draws, after a draw: the
    suptitle and supxlabel/supylabel, each axes' titles, axis labels, offset texts, drawn tick labels and
    annotations, and each legend as one box (its entries are inside it by design). A figure laid out since its
    last change (`tidy` leaves it so) is not laid out again."""
    renderer = lay_out(fig) if fig.stale else fig.canvas.get_renderer()
    out = []

    def add(what, artist, extent=None):
        if artist is None or not artist.get_visible():
            return
        if hasattr(artist, "get_text") and not artist.get_text().strip():
            return
        bb = extent if extent is not None else artist.get_window_extent(renderer)
        if bb.width > 0 and bb.height > 0:
            out.append((what, artist, bb))

    for t in fig.texts:
        add("figure text", t)
    for i, ax in enumerate(fig.axes):
        if not ax.get_visible():
            continue
        for loc in ("left", "center", "right"):
            add(f"axes {i} title", getattr(ax, {"left": "_left_title", "center": "title",
                                                "right": "_right_title"}[loc]))
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            add(f"axes {i} {name} label", axis.label)
            add(f"axes {i} {name} offset", axis.offsetText)
            for tick in axis._update_ticks():  # the ticks the axis draws (inside its view), majors and minors
                for label in (tick.label1, tick.label2):
                    add(f"axes {i} {name} tick {label.get_text()!r}", label)
        for t in ax.texts:
            add(f"axes {i} annotation {t.get_text()!r}", t)
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            out.append((f"axes {i} legend", legend, legend.get_window_extent(renderer)))
    for legend in fig.legends:
        out.append(("figure legend", legend, legend.get_window_extent(renderer)))
    return out


def overlapping_text(fig, tolerance: float = 1.0) -> list[tuple[str, str]]:
    """Pairs of text boxes (`text_boxes`) that overlap by more than `tolerance` pixels each way: titles run into
    each other, tick labels crammed, a legend over a label. What `tidy` fixes and the figure tests assert is empty."""
    boxes = text_boxes(fig)
    out = []
    for i, (a, _, ba) in enumerate(boxes):
        for b, _, bb in boxes[i + 1:]:
            w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if w > tolerance and h > tolerance:
                out.append((a, b))
    return out


class _HideAt:
    """A tick formatter that writes nothing at `hidden` locations and delegates everywhere else."""

    def __init__(self, inner, hidden: set):
        self.inner, self.hidden = inner, hidden

    def __call__(self, x, pos=None):
        return "" if any(np.isclose(x, h, rtol=1e-9, atol=0) for h in self.hidden) else self.inner(x, pos)

    def __getattr__(self, name):  # set_axis, set_locs, format_ticks ...: the wrapped formatter's
        return getattr(self.inner, name)


def _wrap_to(text, length_px: float, renderer, along: str = "width") -> bool:
    """Re-wrap `text` (a Text) at spaces so that it is at most `length_px` long `along` its window extent's "width"
    (horizontal text) or "height" (a rotated y label); True when it changed."""
    import textwrap

    def length() -> float:
        return getattr(text.get_window_extent(renderer), along)

    words = text.get_text().replace("\n", " ").split()
    full = length()
    if full <= length_px or len(words) < 2:
        return False
    chars = max(8, int(len(" ".join(words)) * length_px / full))
    for c in range(chars, 7, -2):
        text.set_text("\n".join(textwrap.wrap(" ".join(words), c)))
        if length() <= length_px:
            break
    return True


def _layout_region(fig, renderer) -> tuple[float, float, float, float]:
    """The figure-fraction rectangle the axes and their decorations occupy now: what `tidy` lays them out in again,
    so room a figure kept for a figure legend or a note (its own `tight_layout(rect=...)`) stays kept."""
    from matplotlib.transforms import Bbox

    # each axes' slot too (its position before an aspect was applied): an equal-aspect axes is drawn narrower than
    # its slot, and a region shrunk to what is drawn shrank it again at every layout
    u = Bbox.union([b for ax in fig.axes if ax.get_visible()
                    for b in (ax.get_tightbbox(renderer), ax.get_position(original=True).transformed(fig.transFigure))])
    u = u.transformed(fig.transFigure.inverted())
    x0, y0, x1, y1 = max(0.0, u.x0), max(0.0, u.y0), min(1.0, u.x1), min(1.0, u.y1)
    # the side of a figure title or label: up to it (as it is now: re-wrapped, it may have grown)
    pad = 4 / fig.bbox.height
    if fig._suptitle is not None and fig._suptitle.get_text():
        y1 = fig._suptitle.get_window_extent(renderer).y0 / fig.bbox.height - pad
    if fig._supxlabel is not None and fig._supxlabel.get_text():
        y0 = max(y0, fig._supxlabel.get_window_extent(renderer).y1 / fig.bbox.height + pad)
    return x0, y0, x1, y1


def _lay_out_in(fig, region) -> None:
    """`tight_layout` of the axes and their decorations into `region` (`_layout_region`), which already leaves out the
    figure's title and x label: tight_layout would take their height off a second time (its `rect` pass adds the
    margins it computed against the whole figure), and a short figure's margins then overran it and it laid nothing
    out (a wrapped title stayed over the axes' title). No pad at the region's edges either (it is where the
    decorations already end; padded again at every pass, a short figure's axes shrank to a sliver), the usual one
    between panels."""
    sup = [t for t in (fig._suptitle, fig._supxlabel) if t is not None and t.get_in_layout()]
    for t in sup:
        t.set_in_layout(False)
    try:
        fig.tight_layout(rect=region, pad=0, h_pad=1.08, w_pad=1.08)  # 1.08: tight_layout's default pad
    finally:
        for t in sup:
            t.set_in_layout(True)


def _crowded(labels, renderer, horizontal: bool, pad: float = 2.0) -> list:
    """The labels (Texts) that overlap an earlier one along the axis, in the order given."""
    kept, out = [], []
    for label in labels:
        bb = label.get_window_extent(renderer)
        lo, hi = (bb.x0, bb.x1) if horizontal else (bb.y0, bb.y1)
        if any(lo < k_hi + pad and hi > k_lo - pad for k_lo, k_hi in kept):
            out.append(label)
        else:
            kept.append((lo, hi))
    return out


def _legends_below_labels(fig, renderer, region) -> bool:
    """A legend hung below its axes (anchored at a negative axes fraction) that meets the axes' tick labels or x label
    is hung again just below them; True when one moved."""
    moved = False
    for _ in range(3):  # the layout moves the axes; the anchor is in axes fractions: settle it
        again = False
        for ax in fig.axes:
            legend = ax.get_legend()
            if legend is None or not legend.get_visible():
                continue
            anchor = legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted())
            if anchor.y0 >= 0:
                continue
            texts = [ax.xaxis.label] + [t.label1 for t in ax.xaxis._update_ticks() if t.label1.get_visible()]
            bottoms = [t.get_window_extent(renderer).y0 for t in texts if t.get_text().strip()]
            top = legend.get_window_extent(renderer).y1
            if not bottoms or top <= min(bottoms) - 2:
                continue
            y = ax.transAxes.inverted().transform((0, min(bottoms) - 3 * fig.dpi / 72))[1]
            legend.set_bbox_to_anchor((anchor.x0, y), transform=ax.transAxes)
            again = moved = True
        if not again:
            break
        _lay_out_in(fig, region)
        lay_out(fig)
    return moved


def _shrink_crowded_annotations(fig, renderer, smallest: float = 4.5) -> bool:
    """An axes whose annotations (cell values of a heatmap, point names) run into each other or into its tick labels
    gets all its annotations smaller, 10% at a time, down to `smallest` points; True when any shrank."""
    shrunk = False
    for ax in fig.axes:
        notes = [t for t in ax.texts if t.get_visible() and t.get_text().strip()]
        ticks = [t.label1 for axis in (ax.xaxis, ax.yaxis) for t in axis._update_ticks()
                 if t.label1.get_visible() and t.label1.get_text().strip()]

        def crowded() -> bool:
            boxes = [t.get_window_extent(renderer) for t in notes]
            others = boxes + [t.get_window_extent(renderer) for t in ticks]
            return any(i != j and a.overlaps(b) and min(a.x1, b.x1) - max(a.x0, b.x0) > 1
                       and min(a.y1, b.y1) - max(a.y0, b.y0) > 1
                       for i, a in enumerate(boxes) for j, b in enumerate(others))

        while notes and crowded() and min(t.get_fontsize() for t in notes) * 0.9 >= smallest:
            for t in notes:
                t.set_fontsize(t.get_fontsize() * 0.9)
            shrunk = True
    return shrunk


def tidy(fig) -> None:
    """Make a figure's text fit its layout, in whatever style it was drawn: an axes' title or x label wider than the
    room up to halfway to its neighbour is re-wrapped to fit it, a y label taller than its axes to its height, a
    figure title or label wider than the figure to the figure's; crowded tick labels are thinned where they are
    numbers (a label that would overlap a neighbour is left blank, majors kept before minors) and slanted where they
    are names (every name stays). Then the axes are laid out again in the region they occupied. Called by
    `save_figure` and `rlwb figures`; idempotent."""
    from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter

    renderer = lay_out(fig)
    if not any(ax.get_visible() for ax in fig.axes):
        return
    changed = False
    fig_w = fig.bbox.width * 0.98
    for t in fig.texts:
        before = t.get_window_extent(renderer).height
        if _wrap_to(t, fig_w, renderer):  # a figure title on more lines: the figure grows by them, the axes keep theirs
            changed = True
            fig.set_figheight(fig.get_figheight() + (t.get_window_extent(renderer).height - before) / fig.dpi)
            renderer = lay_out(fig)  # a new size: a new renderer
    region = _layout_region(fig, renderer)
    boxes = {ax: ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()}
    for ax, bb in boxes.items():  # a centred title may use the room up to halfway to the next title in its row
        cx, gap = (bb.x0 + bb.x1) / 2, 6 * fig.dpi / 72  # 6 pt between neighbouring titles
        row = [(o.x0 + o.x1) / 2 for a, o in boxes.items() if a is not ax and o.y0 < bb.y1 and o.y1 > bb.y0]
        half = min([cx, fig.bbox.width - cx] + [abs(c - cx) / 2 for c in row if c != cx])
        changed |= _wrap_to(ax.title, 2 * half - gap, renderer)
        changed |= _wrap_to(ax.xaxis.label, 2 * half - gap, renderer)
        changed |= _wrap_to(ax.yaxis.label, bb.height, renderer, "height")  # longer than its axes: into the x label
    if changed:
        _lay_out_in(fig, region)
        lay_out(fig)
    changed |= _legends_below_labels(fig, renderer, region)
    changed |= _shrink_crowded_annotations(fig, renderer)
    for ax in fig.axes:
        for axis, horizontal in ((ax.xaxis, True), (ax.yaxis, False)):
            ticks = [t for t in axis._update_ticks() if t.label1.get_visible() and t.label1.get_text().strip()]
            if not _crowded([t.label1 for t in ticks], renderer, horizontal):
                continue
            changed = True
            fmt = axis.get_major_formatter()  # set_ticks(locs, labels) makes a FixedLocator + FuncFormatter
            names = (isinstance(fmt, FixedFormatter) or axis.get_converter() is not None
                     or (isinstance(fmt, FuncFormatter) and isinstance(axis.get_major_locator(), FixedLocator)))
            if names and horizontal:  # categories: every name stays; wrapped at spaces to its slot, else upright
                locs = [axis.get_transform().transform(t.get_loc()) for t in ticks]
                slot = (ax.transData.transform((locs[1], 0))[0] - ax.transData.transform((locs[0], 0))[0]
                        if len(locs) > 1 else ax.get_window_extent(renderer).width)
                for t in ticks:
                    _wrap_to(t.label1, abs(slot) - 4, renderer)
                _lay_out_in(fig, region)
                lay_out(fig)
                if _crowded([t.label1 for t in ticks], renderer, horizontal):
                    for t in ticks:
                        t.label1.set(rotation=90, ha="center", va="top", text=t.label1.get_text().replace("\n", " "))
                    _lay_out_in(fig, region)
                    lay_out(fig)
                continue
            majors = set(axis.get_majorticklocs())
            order = sorted(ticks, key=lambda t: t.get_loc() not in majors)
            hidden = {t.get_loc() for t in order if t.label1 in _crowded([o.label1 for o in order], renderer,
                                                                         horizontal)}
            for major, fmt, setter in ((True, axis.get_major_formatter(), axis.set_major_formatter),
                                       (False, axis.get_minor_formatter(), axis.set_minor_formatter)):
                locs = {x for x in hidden if (x in majors) == major}
                if locs:
                    setter(_HideAt(fmt, locs))
    if changed:
        _lay_out_in(fig, region)
        lay_out(fig)
        _legends_below_labels(fig, renderer, region)  # slanted tick labels are taller: below them again


FIGURE_FORMATS = ("png", "pdf", "svg")  # every saved figure: the report's PNG, and vector copies for papers


def save_figure(fig, path_stem: str | Path, source: str | None = None,
                formats: tuple[str, ...] = FIGURE_FORMATS) -> Path:
    """Write `<stem>.png`, `.pdf` and `.svg` (or the `formats` asked for, PNG always among them) with reproducible
    metadata; returns the PNG path. `source`, the run that made the figure (`<notebook>/<run id>`), goes into each
    file (PNG text chunk `Source`, PDF `Subject`, SVG `dc:source`: `figure_source` reads it back), so a figure
    copied into a paper still says where it came from."""
    if "png" not in formats or not set(formats) <= set(FIGURE_FORMATS):
        raise ValueError(f"formats {formats!r}: 'png' and any of {FIGURE_FORMATS}")
    path_stem = Path(path_stem)
    path_stem.parent.mkdir(parents=True, exist_ok=True)
    tidy(fig)
    tag = f"rlwb run {source}" if source else None
    metadata = {"png": {"Software": None, **({"Source": tag} if tag else {})},
                "pdf": {"CreationDate": None, "Producer": None, "Creator": None, **({"Subject": tag} if tag else {})},
                "svg": {"Date": None, "Creator": None, **({"Source": tag} if tag else {})}}
    for fmt in FIGURE_FORMATS:
        if fmt == "png":
            _save_png(fig, path_stem.with_suffix(".png"), metadata["png"])
        elif fmt in formats:
            fig.savefig(path_stem.with_suffix(f".{fmt}"), metadata=metadata[fmt])
    return path_stem.with_suffix(".png")


def _save_png(fig, path: Path, metadata: dict) -> None:
    """The PNG as matplotlib draws it, stored compactly: RGB where every pixel is opaque (a white figure always is;
    matplotlib writes RGBA) and zlib's best compression, the pixels unchanged (every clone and every lent GPU
    machine carries the runs of record's figures: ~13% smaller). Deterministic, like savefig's own."""
    import io

    from PIL import Image, PngImagePlugin

    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata=metadata)
    with Image.open(buf) as im:
        im.load()
        dpi = im.info.get("dpi")
        out = im.convert("RGB") if im.mode == "RGBA" and im.getchannel("A").getextrema() == (255, 255) else im
        info = PngImagePlugin.PngInfo()
        for k, v in im.text.items():
            info.add_text(k, v)
        out.save(path, format="PNG", optimize=True, pnginfo=info, **({"dpi": dpi} if dpi else {}))


def figure_source(png: str | Path) -> str | None:
    """The run a PNG written by `save_figure` names (`<notebook>/<run id>`), or None."""
    from PIL import Image

    with Image.open(png) as im:
        tag = im.text.get("Source", "")
    return tag.removeprefix("rlwb run ") if tag.startswith("rlwb run ") else None


FLOOR_VALUE = 1e-9  # log-scale plots: values at or below this are drawn at the floor


def engine_order(engines) -> list[str]:
    """Engines in ladder order (`LADDER`), then any others alphabetically: the same order in every figure."""
    engines = list(dict.fromkeys(engines))
    return sorted(engines, key=lambda e: (LADDER.index(e) if e in LADDER else len(LADDER), e))


def finite(x):
    x = np.asarray(x, dtype=float)
    return x[np.isfinite(x)]


def t_quantile(n):
    """Two-sided 95% Student-t quantile for n samples (NaN for n < 2: no interval from one seed)."""
    from scipy import stats as st

    n = np.asarray(n, dtype=float)
    return np.where(n >= 2, st.t.ppf(0.975, np.maximum(n - 1, 1)), np.nan)


def seed_band(d, column: str, smooth: int, log: bool = False):
    """Mean over seeds of each seed's `smooth`-step moving average, and its 95% Student-t band (NaN, no band,
    for one seed). `log`: of log10 values (a geometric mean, never below zero) for columns spanning decades."""
    per_seed = d.pivot_table(index="step", columns="seed", values=column, aggfunc="mean")
    per_seed = per_seed.rolling(smooth, center=True, min_periods=1).mean()
    if log:
        per_seed = np.log10(np.maximum(per_seed, FLOOR_VALUE))
    mean = per_seed.mean(axis=1)
    half = per_seed.sem(axis=1) * t_quantile(per_seed.count(axis=1))
    return mean, mean - half, mean + half


