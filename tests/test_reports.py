"""Figures from archived data, run comparison, the index page (checked in headless Chromium), rerun."""

import json
import shutil
from pathlib import Path

import pytest

from rlwb import archive
from rlwb.reports import drift
from tests.conftest import chromium, copy_archive, rlwb

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_figures_regenerate_byte_identical_png(notebook00_runs, tmp_path):
    _, (shared, _, _) = notebook00_runs
    a = tmp_path / shared.name
    shutil.copytree(shared, a)  # figures are rewritten in place: on a copy of the shared run
    before = {p.name: p.read_bytes() for p in (a / "figures").glob("*.png")}
    assert before
    r = rlwb("figures", str(a))
    assert r.returncode == 0, r.stderr
    after = {p.name: p.read_bytes() for p in (a / "figures").glob("*.png")}
    assert after == before
    r = rlwb("figures", str(a), "--style", "paper")
    assert r.returncode == 0 and (a / "figures" / "paper" / "accuracy_by_digits.pdf").exists()
    from PIL import Image

    # paper style is drawn at single-column width (3.4 in * 0.7), narrower than the notebook figure
    paper_w = Image.open(a / "figures" / "paper" / "accuracy_by_digits.png").size[0]
    assert paper_w < Image.open(a / "figures" / "accuracy_by_digits.png").size[0]
    assert (a / "figures" / "paper" / "accuracy_by_digits.svg").stat().st_size > 1000


@pytest.mark.slow
def test_compare_identical_params_agree_and_changed_params_drift(notebook00_runs):
    _, (a, b, c) = notebook00_runs
    ok, rows = drift.compare(a, b, rtol=0, atol=0)  # identical params: bit-identical metrics
    assert ok, [r for r in rows if r["status"] == "DRIFT"]
    r = rlwb("compare", str(a), str(b))
    assert r.returncode == 0, r.stdout
    r = rlwb("compare", str(a), str(c), "--json")
    assert r.returncode == 1
    out = json.loads(r.stdout)
    drifted = {row["metric"] for row in out["rows"] if row["status"] == "DRIFT"}
    assert "policy/greedy_accuracy" in drifted or "policy/mean_completion_tokens" in drifted


def test_compare_ignores_timing_unless_asked(tmp_path):
    for name, v in (("a", 1.0), ("b", 2.0)):
        (tmp_path / name).mkdir()
        archive.write_json(tmp_path / name / "metrics.json", {"x/k3_mean": 0.5, "x/step_s_mean": v})
    ok, rows = drift.compare(tmp_path / "a", tmp_path / "b")
    assert ok and {r["metric"]: r["status"] for r in rows}["x/step_s_mean"] == "timing"
    ok, _ = drift.compare(tmp_path / "a", tmp_path / "b", include_timing=True)
    assert not ok
    # every timing metric an experiment writes counts as one (notebook 07's medians and milliseconds included:
    # a rerun of 07 reported 44 of them as drift), and no measurement of a number does
    assert all(drift.is_timing(k) for k in ("l+c/step_s_median", "l+c/correction_ms_mean", "k/tok_s",
                                               "k/throughput_ratio", "l+c/step_s_mean", "bf16/per_1k_tokens_ms",
                                               "bf16/time_ratio", "compile/first_pass_s"))  # notebook 09's
    assert not any(drift.is_timing(k) for k in ("l+c/mismatch_k3_mean", "l+c/ess", "k/abs_dlogp_max",
                                                   "l+c/reward_final", "l+c/masked_frac"))


@pytest.mark.slow
@pytest.mark.browser
def test_index_page_lists_runs_in_chromium(notebook00_runs, tmp_path):
    out, copies = copy_archive(notebook00_runs[0], tmp_path / "outputs")  # a failed run is added to it
    dirs = [copies[d.name] for d in notebook00_runs[1]]
    # a failed run, archived as such, must be listed and marked
    failed = out / "00_default_policy" / "20000101-000000-deadbeef"
    shutil.copytree(dirs[0], failed)
    info = json.loads((failed / "run.json").read_text())
    info.update(status="failed", error="RuntimeError: boom", started_at="2000-01-01T00:00:00Z")
    (failed / "run.json").write_text(json.dumps(info))
    r = rlwb("index", "--outputs", str(out))
    assert r.returncode == 0
    page = out / "index.html"
    dom = chromium("--dump-dom", page.as_uri(), profile=tmp_path / "profile")
    assert dom.returncode == 0, dom.stderr[-2000:]
    rows = dom.stdout.count('<tr class="run"')
    assert rows == 4
    for d in dirs:
        assert d.name in dom.stdout
    assert 'data-status="failed"' in dom.stdout and "RuntimeError: boom" in dom.stdout
    # newest first: the fake failed run (year 2000) is the last row
    row_start = '<tr class="run" data-notebook="00_default_policy" '
    assert dom.stdout.rfind('<tr class="run"') == dom.stdout.find('data-status="failed"') - len(row_start)
    # it opens with the latest successful report of each notebook and its one-line answer (from run.json), then
    # the trends: the newest ok run is the seed-5 one (dirs[2]), not the fake failed one
    latest = dom.stdout[dom.stdout.index('id="latest"'):dom.stdout.index('id="trends"')]
    assert dirs[2].name in latest and dirs[0].name not in latest and "deadbeef" not in latest
    # one row per parameter set: the seed-0 set's newest run (dirs[1]) is not hidden by the newer seed-5 run
    assert dirs[1].name in latest and latest.count("<tr><td>") == 2
    answer = json.loads((dirs[2] / "run.json").read_text())["answer"]
    assert "greedily" in answer and answer in latest.replace("&amp;", "&")
    # the trend view: a figure per notebook (written beside the page) and a table of its points
    assert 'id="trends"' in dom.stdout and 'src="trends/00_default_policy.png"' in dom.stdout
    assert (out / "trends" / "00_default_policy.png").stat().st_size > 10_000
    trend_table = dom.stdout[dom.stdout.index('id="trends"'):dom.stdout.index('id="runs"')]
    assert "4 runs" in trend_table and ">failed<" in trend_table and dirs[0].name in trend_table
    shot = tmp_path / "index.png"
    chromium(f"--screenshot={shot}", "--window-size=1400,700", page.as_uri(), profile=tmp_path / "profile")
    assert shot.exists() and shot.stat().st_size > 5000


def test_figures_on_a_non_run_dir_is_a_clear_error(tmp_path):
    r = rlwb("figures", str(tmp_path))
    assert r.returncode == 2 and "not a run directory" in r.stderr


def test_compare_names_a_different_model_build_or_engine_version(tmp_path):
    """Drift between runs on different builds of the default model, or after a vLLM upgrade, is named as such."""
    def fake_run(name, weights, vllm_version, k3):
        d = tmp_path / name
        d.mkdir()
        archive.write_json(d / "metrics.json", {"vllm-v1/k3_mean": k3})
        archive.write_json(d / "run.json", {
            "packages": {"torch": "2.13.0+cpu"},
            "model": {"recipe_hash": "r1", "weights_sha256_16": weights},
            "engines": {"vllm-v1": {"vllm_version": vllm_version, "torch_version": "2.13.0+cpu"},
                        "hf": {"vllm_version": None, "torch_version": "2.13.0+cpu"}}})
        return d

    a = fake_run("a", "aaaa", "0.32.0", 1e-3)
    same = fake_run("same", "aaaa", "0.32.0", 1e-3)
    other = fake_run("other", "bbbb", "0.33.0", 2e-3)
    assert drift.provenance_differences(a, same) == []
    prov = drift.provenance_differences(a, other)
    assert any("model build differs: weights aaaa vs bbbb (same recipe" in p for p in prov)
    assert "engine vllm-v1: vllm 0.32.0 vs 0.33.0" in prov and not any("hf" in p for p in prov)
    r = rlwb("compare", str(a), str(other))
    assert r.returncode == 1
    assert "DRIFT in 1 metric(s): vllm-v1/k3_mean" in r.stdout
    assert "the drift may come from that" in r.stdout and "model build differs" in r.stdout
    r = rlwb("compare", str(a), str(other), "--json")
    assert json.loads(r.stdout)["provenance"] == prov


def test_a_metric_missing_from_one_run_is_drift(tmp_path):
    """A nightly rerun whose engine metrics vanished must fail, naming what is missing; a missing timing does not."""
    for name, m in (("a", {"vllm-v0/k3_mean": 1e-14, "vllm-v1/k3_mean": 4e-4, "vllm-v1/step_s_mean": 1.0}),
                    ("b", {"vllm-v0/k3_mean": 1e-14})):
        (tmp_path / name).mkdir()
        archive.write_json(tmp_path / name / "metrics.json", m)
    ok, rows = drift.compare(tmp_path / "a", tmp_path / "b")
    status = {r["metric"]: r["status"] for r in rows}
    assert not ok and status["vllm-v1/k3_mean"] == "MISSING in b" and status["vllm-v1/step_s_mean"] == "timing"
    assert [r["metric"] for r in drift.failing(rows)] == ["vllm-v1/k3_mean"]
    r = rlwb("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 1 and "present in one run only: vllm-v1/k3_mean (MISSING in b)" in r.stdout
    ok, _ = drift.compare(tmp_path / "b", tmp_path / "b")
    assert ok


@pytest.mark.slow
def test_rerun_compares_with_a_pinned_reference_run(notebook00_runs, tmp_path):
    """`--compare-to RUN_DIR` reruns that run (not the newest) and compares with it; a run of another notebook
    is refused before anything runs."""
    work, copies = copy_archive(notebook00_runs[0], tmp_path / "outputs")
    a, c = notebook00_runs[1][0], notebook00_runs[1][2]
    a_copy = copies[a.name]
    bad = rlwb("rerun", "01_logprob_mismatch", "--compare-to", str(a_copy), "--outputs", str(work))
    assert bad.returncode == 2 and "is a run of '00_default_policy'" in bad.stderr
    r = rlwb("rerun", "00_default_policy", "--compare-to", str(a_copy), "--outputs", str(work))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"rerunning {a.name}" in r.stderr and c.name not in r.stderr  # the pinned run, not the newest (c)
    assert "00_default_policy: no drift" in r.stderr and "#trends" in r.stderr  # the link to the trend view
    new = Path(r.stdout.strip().splitlines()[-1])
    verdict = json.loads((new / "run.json").read_text())["drift"]
    assert verdict["ok"] and verdict["reference"] == a.name and verdict["drifted"] == []
    assert "no drift" in (work / "index.html").read_text()  # the trend view shows the verdict


def test_the_provenance_block_names_the_gpu_a_run_computed_on(tmp_path):
    """A GPU run of record's report says which GPU (with its CUDA runtime and driver) under its title; a CPU run says
    its CPU."""
    import json

    from rlwb.reports.export import provenance_html

    cuda = {"driver": "580.159.04", "cuda_runtime": "13.0"}
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "host": {"cpu": "Intel Xeon", "gpu": "NVIDIA H100",
                                                                            "cuda": cuda}}))
    assert "on NVIDIA H100 (CUDA 13.0, driver 580.159.04)" in provenance_html(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "host": {"cpu": "AMD EPYC"}}))
    html = provenance_html(tmp_path)
    assert "on AMD EPYC (CPU)" in html and "H100" not in html
    # the instruction set, where the run recorded it: one CPU model name covers AVX-512 and AVX2-only hosts
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "host": {"cpu": "AMD EPYC", "isa": "avx2"}}))
    assert "on AMD EPYC, AVX2 (CPU)" in provenance_html(tmp_path)


@pytest.mark.browser
def test_report_html_is_lean_and_shows_its_tables_and_figures(tmp_path):
    """report.html carries a stylesheet of a few KB and no scripts (every clone and every lent GPU machine carries the
    runs of record's reports; lab's inlined theme was ~260 KB of each, and require.js/MathJax/mermaid fetched from a
    CDN fail offline). What a report holds still renders: its title in the tab, prose, a DataFrame table laid out
    as a table, an embedded figure with its size, and nothing on Chromium's console."""
    import base64
    import io

    import matplotlib
    import nbformat
    import pandas as pd

    from rlwb.reports.export import export_report

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"savefig.dpi": 100, "savefig.bbox": "standard"}):  # whatever style a test left
        fig, ax = plt.subplots(figsize=(4, 3), dpi=100)
        ax.plot([0, 1], [0, 1])
        png = io.BytesIO()
        fig.savefig(png, format="png")
        plt.close(fig)
    table = pd.DataFrame({"arm": ["none@engine", "tis@trainer"], "gap": [-0.0153, 0.0021]}).to_html()
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 99 · A report's title\n\n**Question:** does it read?"),
        nbformat.v4.new_code_cell("show()", outputs=[
            nbformat.v4.new_output("display_data", {"text/html": table, "text/plain": "table"}),
            nbformat.v4.new_output("display_data", {"image/png": base64.b64encode(png.getvalue()).decode(),
                                                    "text/plain": "<Figure>"})])])
    nbformat.write(nb, tmp_path / "notebook.ipynb")
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "host": {"cpu": "Intel Xeon"}}))
    export_report(tmp_path / "notebook.ipynb", tmp_path / "report.html", tmp_path)
    html = (tmp_path / "report.html").read_text()
    head = html.split("</head>", 1)[0]
    assert "<script" not in html and "cdnjs" not in html and "mathjax" not in html.lower()
    assert len(head.encode()) < 8_000, len(head.encode())
    assert "<title>99 · A report's title</title>" in head
    assert "<style" not in html.split("</head>", 1)[1]  # every rule in the head's stylesheet, none in the body
    dom = chromium("--dump-dom", "--enable-logging=stderr", "--v=0", (tmp_path / "report.html").as_uri(),
                   profile=tmp_path / "profile")
    assert dom.returncode == 0 and "CONSOLE" not in dom.stderr, dom.stderr[-2000:]
    assert "none@engine" in dom.stdout and "-0.0153" in dom.stdout and "does it read?" in dom.stdout
    # laid out, not just present: the table's cells are side by side and the figure keeps its 400x300 pixels
    script = ("const t=document.querySelector('table.dataframe');const r=t.rows[1].cells;"
              "const i=document.querySelector('img');document.title=[r[1].getBoundingClientRect().left<"
              "r[2].getBoundingClientRect().left, i.naturalWidth, i.getBoundingClientRect().width,"
              "getComputedStyle(document.querySelector('.rlwb-provenance')).borderLeftWidth].join(',')")
    (tmp_path / "probe.html").write_text(html.replace("</body>", f"<script>window.onload=()=>{{{script}}}</script>"
                                                                 "</body>"))
    probe = chromium("--dump-dom", "--virtual-time-budget=2000", (tmp_path / "probe.html").as_uri(),
                     profile=tmp_path / "profile")
    assert "<title>true,400,400,3px</title>" in probe.stdout, probe.stdout[:500]  # the provenance block styled
