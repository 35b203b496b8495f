"""`rlwb publish` on real archived runs (tests/conftest.py `notebook00_runs`, read-only: every test that changes a run
changes a copy), and the runs of record it makes: their figures regenerate from their shipped data and name the run.

A refusal test changes one field of a copy's run.json (status, git_dirty, the model card) or adds bytes to it: the
only way to have, in one session, a failed run, a dirty-tree run and a run on an unpublished build of the same
notebook."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rlwb import publish
from rlwb.paths import REPO_ROOT, RUNS_OF_RECORD
from rlwb.reports.index import run_page
from tests.conftest import copy_archive, rlwb
from tests.test_notebooks import check_report


def _copy(notebook00_runs, tmp_path) -> Path:
    """A writable copy of the session's first notebook-00 run."""
    outputs, (first, _, _) = notebook00_runs
    _, runs = copy_archive(outputs, tmp_path / "archive")
    return runs[first.name]


def _edit(run: Path, change) -> Path:
    info = json.loads((run / "run.json").read_text())
    change(info)
    (run / "run.json").write_text(json.dumps(info))
    return run


def _as_committed(info: dict) -> None:
    """The session's runs are made from this working tree: clean in CI, dirty while someone edits it. The tests of
    what publish copies need a run from a clean tree either way; the dirty-tree refusal has its own test."""
    info["git_dirty"] = False


@pytest.mark.slow
def test_publish_copies_the_run_with_what_its_figures_and_numbers_need(notebook00_runs, tmp_path):
    run = _edit(_copy(notebook00_runs, tmp_path), _as_committed)
    (run / "data" / "unused_rollouts.parquet").write_bytes(b"x" * 100)  # a table no figure is drawn from: kept (small)
    dest = tmp_path / "runs"
    r = rlwb("publish", str(run), "--to", str(dest))
    assert r.returncode == 0, r.stderr
    copy = Path(r.stdout.strip().splitlines()[-1])
    assert copy == dest / "00_default_policy" / run.name
    for f in ("notebook.ipynb", "report.html", "params.yaml", "run.json", "metrics.json", "data/samples.parquet",
              "data/unused_rollouts.parquet", "figures/accuracy_by_digits.png"):
        assert (copy / f).is_file(), f
    # never shipped, and the copy says so: the logs, the figures' vector copies (they redraw from data/)
    assert (run / "figures" / "accuracy_by_digits.pdf").is_file() and list(run.rglob("*.svg"))
    assert not (copy / "logs").exists() and not list(copy.rglob("*.svg")) and not list(copy.rglob("*.pdf"))
    record = json.loads((copy / "run.json").read_text())
    assert {c["path"] for c in record["published"]["left_out"]} == {
        f.relative_to(run).as_posix() for f in [*(run / "logs").rglob("*"), *run.rglob("*.svg"), *run.rglob("*.pdf")]
        if f.is_file()} | {publish.NOTEBOOK_IMAGES}
    # a run of record published before a rule tightened is brought to it (`publish.tidy`): nothing else moves
    old = dest / "00_default_policy" / "older"
    shutil.copytree(copy, old)
    shutil.copy2(run / "figures" / "accuracy_by_digits.pdf", old / "figures")
    # ... whose record says, as records of that time did, that the PDF copies were kept
    svg_then, images_then = publish.STALE_REASONS  # the two reasons as they read then
    older = json.loads((old / "run.json").read_text())
    older["published"]["left_out"] = [c for c in older["published"]["left_out"] if not c["path"].endswith(".pdf")]
    for c in older["published"]["left_out"]:
        if c["path"].endswith(".svg"):
            c["why"] = svg_then
        elif c["path"] == publish.NOTEBOOK_IMAGES:
            c["why"] = images_then
    (old / "run.json").write_text(json.dumps(older))
    assert {c["why"] for c in older["published"]["left_out"]} >= {svg_then, images_then}
    before = {f.relative_to(old): f.read_bytes() for f in old.rglob("*") if f.is_file() and f.name != "run.json"}
    done = publish.tidy(dest)
    assert [c.path for c in done["00_default_policy/older"]] == ["figures/accuracy_by_digits.pdf"] and len(done) == 1
    after = {f.relative_to(old): f.read_bytes() for f in old.rglob("*") if f.is_file() and f.name != "run.json"}
    assert after == {k: v for k, v in before.items() if k.suffix != ".pdf"}
    tidied = json.loads((old / "run.json").read_text())["published"]
    assert tidied["left_out"][-1]["path"] == "figures/accuracy_by_digits.pdf"
    assert [c["path"] for c in tidied["left_out"][:-1]] == [c["path"] for c in older["published"]["left_out"]]
    assert len({c["path"] for c in tidied["left_out"]}) == len(tidied["left_out"])  # each file listed once
    assert tidied["bytes"] == publish.tree_bytes(old)
    # the reasons say what ships: each stale one as it reads since, the others as they were
    assert [c["why"] for c in tidied["left_out"][:-1]] == [publish.STALE_REASONS.get(c["why"], c["why"])
                                                          for c in older["published"]["left_out"]]
    assert not any(c["why"] in publish.STALE_REASONS for c in tidied["left_out"])
    assert publish.tidy(dest) == {}  # nothing left to take out
    # the notebook ships with its code and text outputs, without the images figures/ and report.html hold
    shipped, whole = (json.loads((d / "notebook.ipynb").read_text()) for d in (copy, run))
    kinds = lambda book: {k for c in book["cells"] for o in c.get("outputs", []) for k in o.get("data", {})}  # noqa: E731
    assert "image/png" in kinds(whole) and not kinds(shipped) & set(publish.IMAGE_OUTPUTS)
    assert kinds(shipped) == kinds(whole) - set(publish.IMAGE_OUTPUTS) and "text/plain" in kinds(shipped)
    assert [c["source"] for c in shipped["cells"]] == [c["source"] for c in whole["cells"]]
    assert record["published"]["bytes"] == pytest.approx(publish.tree_bytes(copy), rel=0.01)
    assert json.loads((copy / "metrics.json").read_text()) == json.loads((run / "metrics.json").read_text())
    assert f"published: {publish.tree_bytes(copy) / 1e6:.2f} MB" in r.stdout
    # the folder's index page is rebuilt: the run's report one click away, its answer beside it
    index = (dest / "index.html").read_text()
    assert f'href="00_default_policy/{run.name}/report.html"' in index and record["answer"][:40] in index
    # once is enough: publishing it again is refused, not a silent overwrite (a refusal: one line, exit 2)
    r = rlwb("publish", str(run), "--to", str(dest))
    assert r.returncode == 2 and r.stderr.startswith("rlwb publish: error: 00_default_policy/"), r.stderr
    assert "already published" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("change, message", [
    (lambda i: i.update(status="failed", error="RunFailed: CUDA out of memory"), "did not finish"),
    (lambda i: i.update(git_dirty=True), "dirty tree"),
    (lambda i: i.update(git_dirty=None), "dirty tree"),
    (lambda i: i["model"]["card"].update(recipe_hash="0" * 12), "has no published checksum"),
    (lambda i: i["model"]["card"].update(weights_sha256_16="0123456789abcdef"), "differs from the published"),
    (lambda i: i.update(model={"path": "Qwen/Qwen2.5-0.5B", "card": None}), "not an embedded build"),
], ids=["failed", "dirty", "dirty-unknown", "unpublished-recipe", "other-build", "hub-model"])
def test_publish_refuses_a_run_that_cannot_be_a_run_of_record(notebook00_runs, tmp_path, change, message):
    run = _edit(_copy(notebook00_runs, tmp_path), lambda i: (_as_committed(i), change(i)))
    dest = tmp_path / "runs"
    with pytest.raises(publish.PublishRefused, match=message) as e:  # the CLI prints it (exit 2): the test above
        publish.publish(run, dest)
    assert str(e.value).startswith(f"00_default_policy/{run.name}")
    assert not (dest / "00_default_policy" / run.name).exists()


@pytest.mark.slow
def test_publish_refuses_a_report_a_reader_should_not_see(notebook00_runs, tmp_path):
    """A warning printed into the report (a stderr output naming a checkout's path) would ship to every clone:
    refused, naming what the report shows."""
    run = _edit(_copy(notebook00_runs, tmp_path), _as_committed)
    html = (run / "report.html").read_text()
    warning = ('<div class="jp-RenderedText jp-OutputArea-output" data-mime-type="application/vnd.jupyter.stderr">'
               "<pre>/tmp/x/rlwb/plots/mismatch_cost.py:243: UserWarning: Tight layout not applied.</pre></div>")
    (run / "report.html").write_text(html.replace("</main>", warning + "</main>"))
    with pytest.raises(publish.PublishRefused, match=r"report\.html shows what no reader should see \('data-mime-type="
                                                     r"\"application/vnd\.jupyter\.stderr\"', '/tmp/'\)"):
        publish.publish(run, tmp_path / "runs")
    (run / "report.html").write_text(html)
    assert publish.publish(run, tmp_path / "runs").is_dir()


@pytest.mark.slow
def test_publish_leaves_out_what_nothing_needs_and_refuses_what_stays_too_large(notebook00_runs, tmp_path):
    """Over 5 MB: a table no figure is drawn from is left out (and named in the copy's provenance); a figure's own
    table that large is refused; a folder that would pass 42 MB is refused. The large files are sparse (their size
    is what publish measures)."""
    run = _edit(_copy(notebook00_runs, tmp_path), _as_committed)
    with open(run / "data" / "rollouts.parquet", "wb") as f:
        f.truncate(6_000_000)
    copy = publish.publish(run, tmp_path / "runs")
    left = json.loads((copy / "run.json").read_text())["published"]["left_out"]
    assert {"path": "data/rollouts.parquet", "bytes": 6_000_000,
            "why": "a data table no figure is drawn from (the quoted numbers are in metrics.json)"} in left
    assert not (copy / "data" / "rollouts.parquet").exists() and publish.tree_bytes(copy) < publish.RUN_LIMIT

    with open(run / "data" / "samples.parquet", "r+b") as f:  # the table accuracy_by_digits is drawn from
        f.truncate(6_000_000)
    with pytest.raises(publish.PublishRefused, match=r"is 6\.\d MB without everything no figure or number needs"):
        publish.publish(run, tmp_path / "other-runs")

    run = _edit(_copy(notebook00_runs, tmp_path / "again"), _as_committed)
    full = tmp_path / "full-runs"
    full.mkdir()
    with open(full / "older-run.bin", "wb") as f:
        f.truncate(publish.FOLDER_LIMIT - 100_000)
    with pytest.raises(publish.PublishRefused, match=r"without everything no figure or number needs\) would make .* "
                                                     r"MB \(limit 42 MB\)"):
        publish.publish(run, full)


@pytest.mark.slow
def test_publish_leaves_out_wall_clock_columns_before_tables_and_refuses_a_copy_whose_figure_cannot_redraw(
        notebook00_runs, tmp_path):
    """Notebook 08's study is 5.5 MB without logs and SVGs, 0.8 MB of it per-step wall-clock columns: those go
    after the figures' vector copies and before any whole table (the values no rerun reproduces; here a table no
    figure is drawn from stays), the rest of the table is kept value for value; the jobs kept for a resume never
    ship (one entry); and a copy whose data no longer draws a figure is refused (a drawn table lacking the column the
    figure reads)."""
    import pandas as pd

    run = _edit(_copy(notebook00_runs, tmp_path), _as_committed)
    samples = pd.read_parquet(run / "data" / "samples.parquet")
    timed = samples.assign(t_score=np.random.default_rng(0).random(len(samples)))
    timed.to_parquet(run / "data" / "samples.parquet")
    pd.DataFrame({"x": np.arange(50)}).to_parquet(run / "data" / "unused.parquet")  # no figure is drawn from it
    (run / "data" / "jobs").mkdir()
    for i in range(3):
        (run / "data" / "jobs" / f"job{i}.parquet").write_bytes(b"x" * 100)
    always, whole = publish.plan(run, "00_default_policy", publish.RUN_LIMIT)  # logs, jobs, figure copies never ship
    copies = sorted(p.relative_to(run).as_posix() for p in (run / "figures").rglob("*") if p.suffix in (".svg", ".pdf"))
    assert copies and [c.path for c in always if not c.path.startswith(("logs/", "data/jobs/"))] \
        == copies + [publish.NOTEBOOK_IMAGES]
    left, size = publish.plan(run, "00_default_policy", whole - 1)  # one byte over
    optional = [c.path for c in left if not c.path.startswith(("logs/", "data/jobs/"))]
    assert optional == copies + [publish.NOTEBOOK_IMAGES, "data/samples.parquet#t_score"], \
        "the timing column, and no whole table"
    column = next(c.bytes for c in left if c.path.startswith("data/") and "#" in c.path)
    copy = publish.publish(run, tmp_path / "runs", run_limit=size + column // 2)
    shipped = pd.read_parquet(copy / "data" / "samples.parquet")
    pd.testing.assert_frame_equal(shipped, samples)  # every other column, value for value
    assert (copy / "data" / "unused.parquet").exists() and not (copy / "data" / "jobs").exists()
    record = json.loads((copy / "run.json").read_text())["published"]
    why = {c["path"]: c["why"] for c in record["left_out"]}
    assert "wall-clock" in why["data/samples.parquet#t_score"] and "3 file(s)" in why["data/jobs/"]
    assert record["bytes"] == publish.tree_bytes(copy) <= size + column // 2  # as shipped, run.json included

    # the same copy into a folder with that little room left (the run limit wide): the column leaves there too
    full = tmp_path / "full-runs"
    full.mkdir()
    with open(full / "older-run.bin", "wb") as f:
        f.truncate(publish.FOLDER_LIMIT - (size + column // 2))
    copy = publish.publish(run, full)
    record = json.loads((copy / "run.json").read_text())["published"]
    assert "data/samples.parquet#t_score" in {c["path"] for c in record["left_out"]}
    assert publish.tree_bytes(full) <= publish.FOLDER_LIMIT
    pd.testing.assert_frame_equal(pd.read_parquet(copy / "data" / "samples.parquet"), samples)

    samples.drop(columns=["reward"]).to_parquet(run / "data" / "samples.parquet")  # accuracy_by_digits reads it
    with pytest.raises(publish.PublishRefused, match=r"a figure does not redraw from the data the copy keeps"):
        publish.publish(run, tmp_path / "other-runs")
    assert not (tmp_path / "other-runs" / "00_default_policy" / run.name).exists()


def test_a_table_read_from_runs_of_record_is_never_left_out(tmp_path):
    """Notebook 08's benchmarks table is drawn by no figure, but `rlwb audit` reads it from the study's runs of
    record (registry `reads`): a large run leaves out everything else first and refuses rather than drop it."""
    from rlwb.registry import NOTEBOOKS

    assert "benchmarks" in NOTEBOOKS["08_mismatch_cost"].reads
    run = tmp_path / "08_mismatch_cost" / "20260101-000000-ok"
    (run / "data").mkdir(parents=True)
    (run / "data" / "benchmarks.parquet").write_bytes(b"x" * 100_000)
    (run / "data" / "contrasts.parquet").write_bytes(b"x" * 100_000)
    left, size = publish.plan(run, "08_mismatch_cost", limit=150_000)
    assert [c.path for c in left] == ["data/contrasts.parquet"] and 100_000 < size < 150_000
    with pytest.raises(publish.PublishRefused, match="without everything no figure or number needs"):
        publish.plan(run, "08_mismatch_cost", limit=90_000)


def _published_runs() -> list[Path]:
    return sorted(d for d in RUNS_OF_RECORD.glob("*/*") if (d / "run.json").exists())


def test_runs_of_record_are_within_their_size_limits_and_publishable():
    """What `rlwb publish` checks still holds for every run in docs/runs: a finished run from a clean tree on a
    published build, at most 5 MB, the folder at most 42 MB, no file a publish today leaves out; its run.json says
    where it came from and what it left out; its report is what a reader may see (`check_report`: no stderr, no
    temporary paths, answer first)."""
    runs = _published_runs()
    assert runs, "docs/runs holds no run of record"
    assert publish.tree_bytes(RUNS_OF_RECORD) <= publish.FOLDER_LIMIT
    for run in runs:
        publish.check_publishable(run)
        assert publish.tree_bytes(run) <= publish.RUN_LIMIT, run
        assert "left_out" in json.loads((run / "run.json").read_text())["published"]
        # what a publish today leaves out (`publish.tidy` takes it out of a run published before the rule): the
        # figures' vector copies; a clone carries the same whenever a run shipped
        assert not publish.figure_copies(run), f"{run}: a figure's vector copy ships"
        assert not publish.notebook_images(run), f"{run}: its notebook ships images (publish leaves them out)"
        left_out = json.loads((run / "run.json").read_text())["published"]["left_out"]
        assert not [c["why"] for c in left_out if c["why"] in publish.STALE_REASONS], f"{run}: says a PDF is kept"
        if (run / "report.html").exists():  # a bench run has none
            check_report(run)
    tracked = subprocess.run(["git", "ls-files", "docs/runs"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert all(f"{r.relative_to(REPO_ROOT).as_posix()}/run.json" in tracked for r in runs), "a run is untracked"
    # the index page of the folder (rebuilt by `rlwb publish`) has every run's report (a bench run's table) one click
    # away
    index = (RUNS_OF_RECORD / "index.html").read_text()
    for run in runs:
        assert f'href="{run.parent.name}/{run.name}/{run_page(run)}"' in index, run


def test_a_shipped_figure_regenerates_from_its_shipped_data(tmp_path):
    """`rlwb figures` on a copy of a run of record redraws each figure from data/ alone: pixel-close to the shipped
    PNG (same size, mean |difference| below 1% of full scale), and the file names the run that made it."""
    from rlwb.plots import figure_source

    run = _published_runs()[0]
    copy = tmp_path / run.parent.name / run.name
    shutil.copytree(run, copy)
    r = rlwb("figures", str(copy), "--style", "notebook")
    assert r.returncode == 0, r.stderr
    pngs = sorted((copy / "figures").glob("*.png"))
    assert pngs and {Path(p).name for p in r.stdout.split()} == {p.name for p in pngs}
    for png in pngs:
        shipped = np.asarray(Image.open(run / "figures" / png.name).convert("RGB"), dtype=float)
        redrawn = np.asarray(Image.open(png).convert("RGB"), dtype=float)
        assert shipped.shape == redrawn.shape, png.name
        assert np.abs(shipped - redrawn).mean() < 0.01 * 255, png.name
        assert figure_source(png) == figure_source(run / "figures" / png.name) == f"{run.parent.name}/{run.name}"
    redrawn_by = json.loads((copy / "run.json").read_text())["figures_redrawn"][-1]  # the run's own figures/ changed
    assert redrawn_by["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                                  text=True).stdout.strip()


def _bench_copy(bench_run, tmp_path) -> Path:
    """A writable copy of the session's bench run, as if made from a committed tree (`_as_committed`)."""
    run_dir, _ = bench_run
    copy = tmp_path / "archive" / "bench" / run_dir.name
    shutil.copytree(run_dir, copy)
    return _edit(copy, _as_committed)


@pytest.mark.engines
def test_a_bench_run_publishes_as_a_run_of_record(bench_run, tmp_path):
    """`rlwb publish outputs/bench/<id>` (tests/conftest.py `bench_run`: a real, small bench run) copies it to
    `<runs of record>/bench/<id>/` with its numbers, table, provenance and figures; the folder's index lists it, its
    table and figure one click away (a bench run has no report.html); its figures regenerate from the shipped
    bench.json and name it. The figures' vector copies are left out, and the copy says so. The checks are a
    notebook run's: a run from a dirty tree is refused."""
    from rlwb.plots import figure_source
    from rlwb.reports.figures import regenerate_figures

    run = _bench_copy(bench_run, tmp_path)
    dest = tmp_path / "runs"
    r = rlwb("publish", str(run), "--to", str(dest))
    assert r.returncode == 0, r.stderr
    copy = Path(r.stdout.strip().splitlines()[-1])
    assert copy == dest / "bench" / run.name
    for f in ("bench.json", "bench.md", "run.json", "figures/throughput.png"):
        assert (copy / f).is_file(), f
    # the vector copies never ship: `rlwb figures` redraws them from bench.json (below)
    assert not list((copy / "figures").glob("*.svg")) and not list((copy / "figures").glob("*.pdf"))
    assert json.loads((copy / "bench.json").read_text()) == json.loads((run / "bench.json").read_text())
    record = json.loads((copy / "run.json").read_text())
    assert [c["path"] for c in record["published"]["left_out"]] == ["figures/throughput.pdf", "figures/throughput.svg"]
    assert record["git_commit"] and record["model"]["card"]
    index = (dest / "index.html").read_text()
    rel = f"bench/{run.name}"
    assert f'href="{rel}/bench.md"' in index and f'href="{rel}/figures/throughput.png"' in index
    assert f'href="{rel}/bench.json"' in index and "hf samples" in index
    hrefs = re.findall(r'(?:href|src)="([^"#]+)"', index)
    assert hrefs and [h for h in hrefs if not (dest / h).is_file()] == []  # every link of the page resolves

    redrawn = tmp_path / "redrawn" / "bench" / run.name
    shutil.copytree(copy, redrawn)
    (redrawn / "figures" / "throughput.png").unlink()
    assert regenerate_figures(redrawn) == [redrawn / "figures" / "throughput.png"]
    shipped = np.asarray(Image.open(copy / "figures" / "throughput.png").convert("RGB"), dtype=float)
    again = np.asarray(Image.open(redrawn / "figures" / "throughput.png").convert("RGB"), dtype=float)
    assert shipped.shape == again.shape and np.abs(shipped - again).mean() < 0.01 * 255
    assert figure_source(redrawn / "figures" / "throughput.png") == rel

    svgs = sorted((run / "figures").glob("*.svg"))
    out = [c for c in publish.optional_files(run, "bench") if c.path.startswith(("logs/", "figures/"))]
    assert {c.path for c in out if c.path.endswith(".svg")} == {f.relative_to(run).as_posix() for f in svgs}

    _edit(run, lambda i: i.update(git_dirty=True))
    with pytest.raises(publish.PublishRefused, match=f"^bench/{run.name} was made from a dirty tree"):
        publish.publish(run, tmp_path / "other-runs")


