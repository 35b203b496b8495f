"""`rlwb publish RUN`: an archived run copied into the repository as a run of record (`docs/runs/<stem>/<run id>/`):
a notebook run (`outputs/<notebook stem>/<run id>`) or an `rlwb bench` run (`outputs/bench/<run id>` ->
`docs/runs/bench/<run id>/`: bench.json, bench.md, run.json and figures/; the same provenance and the same checks).

Why a run of record lives in the repository: a number the README or docs/ quote, or a figure a paper shows, must
be checkable by a reader who has nothing but a clone. `outputs/` is gitignored and exists on one machine; a run
of record is tracked, so `rlwb readme-check --clean-clone` recomputes every quoted number from it and
`rlwb figures docs/runs/<stem>/<run id> --style paper` rebuilds its figures from its `data/` alone.

What a run of record must be, checked before anything is copied (each refusal is a `PublishRefused` naming the
problem and what to do):

- a finished run (`status: ok`): a failed run answers nothing;
- made from a committed tree (`git_dirty: false`, a commit recorded): its code must be the commit it names;
- on a model build with a published checksum that its weights match
  (`rlwb.core.models.published_builds.with_published`): anyone can get the same weights (`rlwb build-model`), so a
  rerun can be compared with it;
- fit for a reader: its report.html shows no stderr, temporary path, progress bar or traceback
  (`reports.export.reader_noise`);
- small: at most `RUN_LIMIT` bytes per run and `FOLDER_LIMIT` for the whole folder. The run's logs, the jobs kept
  for a resume, the figures' vector copies (SVG, PDF) and the images embedded in the executed notebook never ship
  (every clone carries runs of record, and so does every call to a lent GPU machine, whose working tree may not pass
  64 MiB: `rlwb figures RUN --style paper` writes the figures in every format from the copy's data/ (a bench run's
  from its bench.json), which publish checks they redraw from, and each figure the notebook shows is in figures/ as
  a PNG and in report.html; the shipped notebook keeps its code and every text output). When a run is still larger
  than `RUN_LIMIT`, or than the room the folder has left, what no figure and no number needs is left out (the tables'
  wall-clock columns, data tables that no figure is drawn from and nothing reads from a run of record:
  `optional_files`) until it fits, and the copy's `run.json` says what was left out (`published`). Every figure
  must redraw from the data the copy keeps, or the copy is refused.

The copy holds the executed notebook, report.html, params.yaml, run.json (provenance: commit, model build and its
checksum, engine versions, CPU/GPU), metrics.json, data/*.parquet and figures/.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rlwb import archive
from rlwb.errors import PublishRefused
from rlwb.paths import RUNS_OF_RECORD, shown
from rlwb.reports.export import reader_noise

PUBLISHED_RUNS = RUNS_OF_RECORD  # the one tracked folder of runs of record: <stem>/<run id>/
RUN_LIMIT = 5_000_000  # bytes per run of record: runs of record are tracked, so every clone carries them
# bytes for the whole folder: a lent GPU machine takes the working tree and the carried wheels, 64 MiB in all
# (scripts/device/wheels.py); the rest of the tree (the embedded models' published builds, code, docs) is ~13 MiB
# and the wheels ~8 MiB, so the runs of record get 40 MiB and a 2 MiB margin (tests/test_gpu_runs.py checks the sum)
FOLDER_LIMIT = 42_000_000
FIGURE_COPIES = (".svg", ".pdf")  # the figures' vector copies: `rlwb figures` redraws them from data/
__all__ = ["FIGURE_COPIES", "FOLDER_LIMIT", "NOTEBOOK_IMAGES", "PUBLISHED_RUNS", "RUN_LIMIT", "LeftOut",
           "PublishRefused", "check_publishable", "figure_copies", "notebook_images", "plan", "publish",
           "timing_columns", "tidy", "tree_bytes"]


@dataclass(frozen=True)
class LeftOut:
    path: str  # relative to the run directory
    bytes: int
    why: str


def tree_bytes(path: Path) -> int:
    """Bytes of every file under `path` (0 when it does not exist)."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if Path(path).exists() else 0


def check_publishable(run_dir: Path) -> dict:
    """The run's run.json when it may become a run of record; else `PublishRefused` naming the first problem."""
    from rlwb.core.models.published_builds import with_published

    info = archive.read_record(run_dir)
    if info is None:
        raise PublishRefused(f"{run_dir} is not an archived run (no readable {archive.RECORD})")
    name = f"{info.get('notebook') or run_dir.parent.name}/{run_dir.name}"
    if info.get("status") != "ok":
        raise PublishRefused(f"{name} did not finish (status {info.get('status')!r}"
                             + (f": {str(info['error']).splitlines()[0][:200]}" if info.get("error") else "")
                             + "): a failed run answers nothing; publish a successful rerun")
    if not info.get("git_commit") or info.get("git_dirty") is not False:
        state = "no commit recorded" if not info.get("git_commit") else \
            f"commit {info['git_commit'][:10]} with uncommitted changes" if info.get("git_dirty") else \
            "no record of whether its tree was clean"
        raise PublishRefused(f"{name} was made from a dirty tree ({state}): its code is not the commit it names; "
                             f"commit, rerun it and publish the new run")
    model = info.get("model") or {}
    card = model.get("card")
    if not card:
        raise PublishRefused(f"{name} ran on {model.get('path') or 'no recorded model'}, which is not an embedded "
                             f"build with a published checksum: nobody can get its exact weights")
    card = with_published(card)
    if card["weights_match_published"] is None:
        raise PublishRefused(f"{name}'s model build {card.get('weights_sha256_16')} ({card.get('name')}) has no "
                             f"published checksum (rlwb/core/models/published_builds.py PUBLISHED_WEIGHTS): publish "
                             f"the build first or rerun on a published one")
    if card["weights_match_published"] is False:
        raise PublishRefused(f"{name}'s model build {card.get('weights_sha256_16')} differs from the published one, "
                             f"{card['weights_published_sha256_16']}: rerun on the published build (rlwb build-model)")
    report = run_dir / "report.html"
    noise = reader_noise(report.read_text(encoding="utf-8")) if report.exists() else []
    if noise:
        raise PublishRefused(f"{name}'s report.html shows what no reader should see ({', '.join(map(repr, noise))}): "
                             f"fix the notebook or the code that printed it, then rerun (or `rlwb run --reanalyze` "
                             f"it) and publish that run")
    return info


def optional_files(run_dir: Path, notebook: str) -> list[LeftOut]:
    """What a run of record may do without, in the order it is left out: its logs, the jobs kept for a resume, the
    figures' vector copies (`figure_copies`: the PNG stays), the wall-clock columns of the
    data tables (`timing_columns`: the one value no rerun reproduces), then the tables no figure is drawn from
    (largest first). Each with its size and why nothing needs it."""
    from rlwb.registry import NOTEBOOKS

    drawn = {data for data, _ in NOTEBOOKS[notebook].figures().values()} | set(NOTEBOOKS[notebook].reads) \
        if notebook in NOTEBOOKS else None  # the tables a figure is drawn from, and those read from runs of record
    out = [LeftOut(f.relative_to(run_dir).as_posix(), f.stat().st_size, "the run's logs: no figure or number")
           for f in sorted((run_dir / "logs").rglob("*")) if f.is_file()]
    jobs = [f for f in (run_dir / "data" / "jobs").rglob("*") if f.is_file()]
    if jobs:  # one entry: notebook 08's study keeps ~1,000 files there, and the list would weigh more than a figure
        out.append(LeftOut("data/jobs/", sum(f.stat().st_size for f in jobs),
                           f"the jobs kept for a resume, {len(jobs)} file(s) (every row is in "
                           f"data/curves.parquet, its provenance in {archive.RECORD})"))
    out += figure_copies(run_dir)
    out += notebook_images(run_dir)
    out += timing_columns(run_dir)
    if drawn is not None:  # an unknown notebook: every table may be needed
        unused = [f for f in (run_dir / "data").glob("*.parquet") if f.stem not in drawn]
        out += [LeftOut(f.relative_to(run_dir).as_posix(), f.stat().st_size,
                        "a data table no figure is drawn from (the quoted numbers are in metrics.json)")
                for f in sorted(unused, key=lambda f: -f.stat().st_size)]
    return out


NOTEBOOK_IMAGES = "notebook.ipynb#images"  # the executed notebook's embedded figures, as a `LeftOut` path
IMAGE_OUTPUTS = ("image/png", "image/jpeg", "image/svg+xml", "application/pdf")


def notebook_images(run_dir: Path) -> list[LeftOut]:
    """The executed notebook's embedded images (`notebook.ipynb#images`) with their bytes, or nothing.
    Why they may go: a figure the notebook shows is saved in figures/ (PNG) and embedded in report.html, so in
    the notebook it is a third copy; they were 80% of the notebooks' bytes in docs/runs."""
    import json

    nb = run_dir / "notebook.ipynb"
    try:
        book = json.loads(nb.read_text())
    except (OSError, ValueError):
        return []
    size = sum(len(json.dumps(v)) for c in book.get("cells", []) for o in c.get("outputs", [])
               for k, v in (o.get("data") or {}).items() if k in IMAGE_OUTPUTS)
    return [LeftOut(NOTEBOOK_IMAGES, size, "the executed notebook's figure images: each figure ships in figures/ "
                    "(PNG) and in report.html; the notebook keeps its code and text outputs")] if size else []


def _notebook_without_images(src: Path, dst: Path) -> None:
    """Notebook `src` with the image data of its outputs removed (their text/plain stays), written to `dst` as
    nbformat writes a notebook."""
    import json

    book = json.loads(src.read_text())
    for c in book.get("cells", []):
        for o in c.get("outputs", []):
            for part in (o.get("data"), o.get("metadata")):
                for k in IMAGE_OUTPUTS:
                    (part or {}).pop(k, None)
    dst.write_text(json.dumps(book, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def timing_columns(run_dir: Path) -> list[LeftOut]:
    """The per-step wall-clock columns (`t_*`: `rlwb.reports.drift.is_timing`) of each data table, largest first,
    as `data/<table>.parquet#<column>` with their compressed bytes.
    Why they may go: a wall-clock time is not reproducible (`rlwb compare` does not fail on it), no quoted number
    is read from a table (those are in metrics.json), and `publish` redraws every figure from the copy's data, so a
    figure that draws one (notebook 03's phase times) refuses the copy instead of losing it. A table that cannot be
    read offers nothing."""
    import pyarrow.parquet as pq

    from rlwb.reports.drift import is_timing

    out = []
    for f in sorted((run_dir / "data").glob("*.parquet")):
        try:
            meta = pq.ParquetFile(f).metadata
        except Exception:  # noqa: BLE001 - not a readable table: nothing to offer
            continue
        sizes: dict[str, int] = {}
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                col = meta.row_group(g).column(c)
                sizes[col.path_in_schema] = sizes.get(col.path_in_schema, 0) + col.total_compressed_size
        out += [LeftOut(f"{f.relative_to(run_dir).as_posix()}#{name}", size,
                        "a per-step wall-clock column: not reproducible, no quoted number or figure reads it")
                for name, size in sorted(sizes.items(), key=lambda kv: -kv[1]) if is_timing(name)]
    return out


def _is_figure_copy(rel: str) -> bool:
    """A path in a run (relative, POSIX) that is one of its figures' vector copies: `figure_copies`' rule."""
    return rel.startswith("figures/") and rel.endswith(FIGURE_COPIES)


def figure_copies(run_dir: Path) -> list[LeftOut]:
    """The vector copies of the figures (SVG, PDF) a run of record never ships: its figures redraw from the copy's
    data/ in every format (`rlwb figures RUN --style paper`, a bench run's from its bench.json; publish refuses a
    notebook's copy they do not redraw from), and the PNG stays for report.html and the README."""
    why = {".svg": "an SVG copy of a figure (the PNG kept; `rlwb figures RUN --style paper` redraws it from data/)",
           ".pdf": "a PDF copy of a figure (the PNG kept; `rlwb figures RUN --style paper` redraws it from data/)"}
    return [LeftOut(f.relative_to(run_dir).as_posix(), f.stat().st_size, why[f.suffix])
            for f in sorted((run_dir / "figures").rglob("*"))
            if f.is_file() and _is_figure_copy(f.relative_to(run_dir).as_posix())]


def plan(run_dir: Path, notebook: str, limit: int = RUN_LIMIT) -> tuple[list[LeftOut], int]:
    """(left out, bytes of the copy): the logs, the jobs kept for a resume, the figure copies and the notebook's images
    always stay out; then the other optional files, in order, until the copy is at most `limit` bytes. The copy's
    bytes include what its run.json grows by (the `published` record listing what was left out). `PublishRefused`
    when even the needed files are over it."""
    left, size = _leave_out(run_dir, notebook, limit)
    if size > limit:
        raise PublishRefused(_too_large(run_dir, size, limit))
    return left, size


def _leave_out(run_dir: Path, notebook: str, limit: int) -> tuple[list[LeftOut], int]:
    """`plan`'s choice without its refusal: where the copy cannot fit `limit`, every optional file is out and the
    size is the smallest copy's (what `publish` weighs against the folder's room)."""
    candidates = optional_files(run_dir, notebook)
    left = [c for c in candidates if c.path.startswith(("logs/", "data/jobs/", NOTEBOOK_IMAGES))
            or _is_figure_copy(c.path)]
    size = tree_bytes(run_dir) - sum(c.bytes for c in left)
    for c in candidates:
        if size + _record_bytes(left, run_dir) <= limit:
            break
        if c not in left:
            left.append(c)
            size -= c.bytes
    return left, size + _record_bytes(left, run_dir)


def _too_large(run_dir: Path, size: int, limit: int) -> str:
    return (f"{run_dir.parent.name}/{run_dir.name} is {size / 1e6:.1f} MB without everything no figure or number "
            f"needs (limit {limit / 1e6:g} MB per run of record): make the run smaller (fewer rollouts archived) or "
            f"split what it quotes")


def _record_bytes(left: list[LeftOut], run_dir: Path) -> int:
    """What the copy's run.json grows by with its `published` record (`publish`), at most: run.json rewritten
    (`jsonfile.json_text`, as `archive.write_json` writes it) with the list of what was left out, every number at
    its widest."""
    from rlwb.jsonfile import json_text

    record = archive.read_record(run_dir, {}) or {}
    before = archive.record_path(run_dir).stat().st_size if archive.has_record(run_dir) else 0
    record["published"] = {"from": "/" * 400, "at": "2026-01-01T00:00:00Z", "bytes": 10**12,
                           "left_out": [{**vars(c), "bytes": 10**12} for c in left]}
    return len(json_text(record).encode()) - before


def publish(run_dir: str | os.PathLike, dest: str | os.PathLike | None = None, *, run_limit: int = RUN_LIMIT,
            folder_limit: int = FOLDER_LIMIT) -> Path:
    """Copy archived run `run_dir` into `dest` (default `PUBLISHED_RUNS`) as `<stem>/<run id>/`; returns the copy.
    Refuses (`PublishRefused`) a failed run, a run from a dirty tree, a run on a build without a published checksum,
    a run already published, and a copy over `run_limit` or a folder over `folder_limit` bytes, after leaving out
    what nothing needs (`plan`) until the copy fits both. Atomic: the copy is written under a temporary name and
    renamed."""
    run_dir = Path(run_dir).resolve()
    info = check_publishable(run_dir)
    notebook = info.get("notebook") or run_dir.parent.name
    root = Path(dest) if dest is not None else PUBLISHED_RUNS
    target = root / notebook / run_dir.name
    if target.exists():
        raise PublishRefused(f"{notebook}/{run_dir.name} is already published at {target}")
    folder = tree_bytes(root)
    # the copy must fit the run limit and what the folder has left: optional files go until it fits both, so a
    # non-reproducible wall-clock column leaves before a cited run of record has to
    limit = min(run_limit, folder_limit - folder)
    left, size = _leave_out(run_dir, notebook, limit)
    if size > run_limit:  # too large for any folder
        raise PublishRefused(_too_large(run_dir, size, run_limit))
    if folder + size > folder_limit:
        raise PublishRefused(f"publishing {notebook}/{run_dir.name} ({size / 1e6:.1f} MB without everything no "
                             f"figure or number needs) would make {root} {(folder + size) / 1e6:.1f} MB (limit "
                             f"{folder_limit / 1e6:g} MB): remove a superseded run of record first (with the "
                             f"sentences citing it)")
    skip = {c.path for c in left if "#" not in c.path}
    folders = tuple(p for p in skip if p.endswith("/"))
    dropped: dict[str, list[str]] = {}  # table -> columns left out of it
    for c in left:
        if "#" in c.path:
            table, column = c.path.split("#", 1)
            dropped.setdefault(table, []).append(column)
    tmp = root / notebook / f".tmp-{run_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for f in sorted(run_dir.rglob("*")):
            rel = f.relative_to(run_dir).as_posix()
            if f.is_file() and rel not in skip and not rel.startswith(folders) and not f.name.startswith("."):
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                if rel in dropped and rel.endswith(".ipynb"):  # NOTEBOOK_IMAGES: the notebook less its images
                    _notebook_without_images(f, tmp / rel)
                elif rel in dropped:  # a table less its dropped columns
                    _write_without(f, tmp / rel, dropped[rel])
                else:
                    shutil.copy2(f, tmp / rel)
        _check_figures_redraw(tmp, notebook, f"{notebook}/{run_dir.name}")
        record = archive.read_record(tmp, {})
        record["published"] = {"from": shown(run_dir), "at": archive.utc_now(), "bytes": 0,
                               "left_out": [vars(c) for c in left]}
        shipped = _write_published(tmp, record)
        # the plan estimated a dropped column's share from its compressed size, and run.json grew by the record
        if shipped > limit:
            raise PublishRefused(f"{notebook}/{run_dir.name} is {shipped / 1e6:.2f} MB with its provenance "
                                 f"(limit {limit / 1e6:g} MB: {run_limit / 1e6:g} MB per run of record, "
                                 f"{(folder_limit - folder) / 1e6:g} MB left in {root})")
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _write_without(src: Path, dst: Path, columns: list[str]) -> None:
    """Table `src` less `columns`, written to `dst` (zstd: the rewrite is the chance to store it compactly; the
    values are unchanged)."""
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(src).drop_columns(columns), dst, compression="zstd", compression_level=19)


def _write_published(copy: Path, record: dict) -> int:
    """Write `record` as the copy's run.json, its `published.bytes` the copy's size as shipped, run.json included
    (whose size holds the number: a fixed point); returns that size."""
    rest = tree_bytes(copy) - (archive.record_path(copy).stat().st_size if archive.has_record(copy) else 0)
    while True:
        archive.write_record(copy, record)
        shipped = rest + archive.record_path(copy).stat().st_size
        if record["published"]["bytes"] == shipped:
            return shipped
        record["published"]["bytes"] = shipped


# Reasons a copy's record gave for what it left out while its figures' PDF copies still shipped; true then, false
# once `tidy` took the PDFs out: each, as it reads since (no longer than it was: the folder is at its limit).
STALE_REASONS = {
    "an SVG copy of a figure (PNG and PDF kept)": "an SVG copy of a figure (the PNG kept)",
    "the executed notebook's figure images: each figure ships in figures/ (PNG, PDF) and in report.html; the notebook "
    "keeps its code and text outputs": "the executed notebook's figure images: each figure ships in figures/ (PNG) and "
    "in report.html; the notebook keeps its code and text outputs",
}


def tidy(root: str | os.PathLike | None = None) -> dict[str, list[LeftOut]]:
    """Take out of every run of record under `root` (default `PUBLISHED_RUNS`) the files a publish today would leave
    out of it (`figure_copies`: a rule may tighten after a run shipped), each added to its run.json's
    `published.left_out` and its `bytes` brought up to date, and correct the reasons that said a file so taken out
    was kept (`STALE_REASONS`); returns the files taken out per run (`<stem>/<run id>`). Why: the folder's room is
    the device's (`FOLDER_LIMIT`), and what a copy holds, and what its record says of it, should not depend on when
    it shipped."""
    root = Path(root) if root is not None else PUBLISHED_RUNS
    done: dict[str, list[LeftOut]] = {}
    for copy in sorted(d for d in root.glob("*/*") if d.is_dir() and archive.has_record(d)):
        extra = figure_copies(copy)
        record = archive.read_record(copy, {})
        left = (record.get("published") or {}).get("left_out", [])
        stale = [c for c in left if c.get("why") in STALE_REASONS]
        if not extra and not stale:
            continue
        for c in extra:
            (copy / c.path).unlink()
        for c in stale:
            c["why"] = STALE_REASONS[c["why"]]
        published = record.setdefault("published", {"from": None, "at": None, "bytes": 0, "left_out": []})
        published["left_out"] = [*published.get("left_out", []), *map(vars, extra)]
        published["bytes"] = 0
        _write_published(copy, record)
        if extra:
            done[f"{copy.parent.name}/{copy.name}"] = extra
    return done


def _check_figures_redraw(copy: Path, notebook: str, name: str) -> None:
    """Every figure of the copy draws from the copy's data alone (`rlwb figures` on the run of record must work):
    else `PublishRefused` naming the figure. A bench run's figures are drawn from bench.json, which is kept."""
    import matplotlib.pyplot as plt

    from rlwb.registry import NOTEBOOKS
    from rlwb.reports.figures import draw_figures

    if notebook not in NOTEBOOKS:
        return
    try:
        for _, fig in draw_figures(copy, "notebook"):
            plt.close(fig)
    except Exception as e:  # noqa: BLE001 - any failure to draw means the shipped data does not suffice
        raise PublishRefused(f"{name}: a figure does not redraw "
                             f"from the data the copy keeps ({type(e).__name__}: {e}); publish a smaller run") from e
