"""Reports for people: regenerate figures from archived data, compare runs, rerun notebooks, index page.

Why figures come from `data/` alone: a figure in a paper must be rebuildable years later without engines,
GPUs or training - only the archived parquet files and the plotting function (the same one the notebook
called). Why `compare` separates timings: a nightly rerun should fail on drifted *numbers*, not on a
busier machine.
"""

from __future__ import annotations

import html
import json
import math
import os
from pathlib import Path

import pandas as pd

from rlwb import archive, plots
from rlwb.formatting import metric, number, text_table

TIMING_SUFFIXES = ("_s", "_s_mean", "_s_max", "_s_median", "_ms", "_ms_mean", "_ms_median", "tok_s", "throughput",
                   "throughput_ratio", "time_ratio")


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


def is_timing(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return name.startswith("t_") or name.endswith(TIMING_SUFFIXES) or key.startswith(("tput/", "bench/"))


def compare(run_a: str | os.PathLike, run_b: str | os.PathLike, rtol: float = 1e-6, atol: float = 1e-9,
            include_timing: bool = False) -> tuple[bool, list[dict]]:
    """Every metric of either run: both values, difference, and whether it agrees within tolerance.

    A metric present in one run only is drift (status `MISSING in a` / `MISSING in b`): a nightly rerun in
    which an engine's metrics vanished (the engine failed to start, a section was skipped) must not pass.
    Timing metrics are listed but only fail the comparison with `include_timing`, missing ones included."""
    ma = archive.read_json(Path(run_a) / "metrics.json")
    mb = archive.read_json(Path(run_b) / "metrics.json")
    for p, m in ((run_a, ma), (run_b, mb)):
        if m is None:
            raise FileNotFoundError(f"{p}/metrics.json is missing or unreadable")
    rows, ok = [], True
    for k in sorted(set(ma) | set(mb)):
        a, b = ma.get(k), mb.get(k)
        timing = is_timing(k)
        if k not in ma or k not in mb:
            missing = "MISSING in " + ("b" if k in ma else "a")
            status = "timing" if timing and not include_timing else missing
            ok &= status == "timing"
            rows.append({"metric": k, "a": a, "b": b, "diff": None, "status": status, "timing": timing})
            continue
        if a is None or b is None:
            agree = a is None and b is None
            diff = None
        else:
            diff = b - a
            agree = math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
        status = "ok" if agree else ("timing" if timing and not include_timing else "DRIFT")
        ok &= status != "DRIFT"
        rows.append({"metric": k, "a": a, "b": b, "diff": diff, "status": status, "timing": timing})
    return ok, rows


def failing(rows: list[dict]) -> list[dict]:
    """The rows that make a comparison fail: drifted values and metrics missing from one run."""
    return [r for r in rows if r["status"] == "DRIFT" or r["status"].startswith("MISSING")]


def provenance_differences(run_a: str | os.PathLike, run_b: str | os.PathLike) -> list[str]:
    """What differs between two runs' builds, in words: the model's weights (checksum), torch, and each
    engine's vLLM / torch / transformers version. A metric that drifts between runs with a difference listed
    here may be explained by the build or the upgrade, not by the engine's behaviour; `compare` and `rerun`
    print these lines beside the drift so nobody has to guess."""
    ra = archive.read_json(Path(run_a) / "run.json", {}) or {}
    rb = archive.read_json(Path(run_b) / "run.json", {}) or {}
    out = []

    def model_fact(r: dict, key: str):
        m = r.get("model") or {}
        return m.get(key, (m.get("card") or {}).get(key))

    wa, wb = model_fact(ra, "weights_sha256_16"), model_fact(rb, "weights_sha256_16")
    if wa != wb:
        same_recipe = model_fact(ra, "recipe_hash") == model_fact(rb, "recipe_hash")
        out.append(f"model build differs: weights {wa or 'unknown'} vs {wb or 'unknown'}"
                   + (" (same recipe, another build)" if same_recipe else
                      f" (recipe {model_fact(ra, 'recipe_hash')} vs {model_fact(rb, 'recipe_hash')})"))
    pa, pb = (ra.get("packages") or {}), (rb.get("packages") or {})
    for pkg in sorted(set(pa) | set(pb)):
        if pkg in ("torch", "transformers", "vllm") and pa.get(pkg) != pb.get(pkg):
            out.append(f"kernel {pkg} differs: {pa.get(pkg)} vs {pb.get(pkg)}")
    ea, eb = (ra.get("engines") or {}), (rb.get("engines") or {})
    for name in sorted(set(ea) | set(eb)):
        a, b = ea.get(name) or {}, eb.get(name) or {}
        if not a or not b:
            continue  # an engine used by one run only shows up as metrics present in one run
        for key in ("vllm_version", "torch_version", "transformers_version"):
            if a.get(key) != b.get(key):
                out.append(f"engine {name}: {key.replace('_version', '')} {a.get(key)} vs {b.get(key)}")
    return out


def drift_summary(ok: bool, rows: list[dict], provenance: list[str]) -> str:
    """The closing line(s) of `compare` / `rerun`: what drifted and, if the builds differ, that they do."""
    drift = [r["metric"] for r in rows if r["status"] == "DRIFT"]
    missing = [f"{r['metric']} ({r['status']})" for r in rows if r["status"].startswith("MISSING")]
    lines = ["OK: all metrics agree" if ok else "; ".join(
        ([f"DRIFT in {len(drift)} metric(s): " + ", ".join(drift)] if drift else [])
        + ([f"{len(missing)} metric(s) present in one run only: " + ", ".join(missing)] if missing else []))]
    if provenance:
        head = "the runs differ in build or versions" + (" - the drift may come from that:" if not ok else ":")
        lines += [head] + [f"  {p}" for p in provenance]
    return "\n".join(lines)


def record_drift(run_dir: Path, reference: Path, ok: bool, rows: list[dict], provenance: list[str]) -> None:
    """A rerun's verdict in its run.json (`drift`), so the index's trend view can mark the run."""
    info = archive.read_json(run_dir / "run.json", {})
    info["drift"] = {"reference": reference.name, "ok": ok,
                     "drifted": [r["metric"] for r in failing(rows)], "provenance": provenance}
    archive.write_json(run_dir / "run.json", info)


def latest_ok_run(root: Path, notebook: str) -> Path | None:
    runs = [r for r in archive.list_runs(root) if r["notebook"] == notebook and r.get("status") == "ok"]
    return Path(runs[0]["dir"]) if runs else None


def engine_versions(engines: dict) -> str:
    """`vLLM 0.8.5 · 0.32.0` (or `transformers 5.19.0` for the hf reference alone): what a trend point ran on."""
    vllm = sorted({str(v["vllm_version"]) for v in engines.values() if v.get("vllm_version")})
    if vllm:
        return "vLLM " + " · ".join(vllm)
    hf = sorted({str(v["transformers_version"]) for v in engines.values() if v.get("transformers_version")})
    return "transformers " + " · ".join(hf) if hf else "no engine"


def run_model_name(run: dict) -> str:
    """The model a run used, short: an embedded model's name (`default`, `qwen2-chat`), else its path or id."""
    m = run.get("model") or {}
    card = m.get("card") or {}
    if card.get("name"):
        return {"rlwb-default-policy": "default"}.get(card["name"], card["name"].removeprefix("rlwb-"))
    return str(m.get("path") or "?")


def trend_points(runs: list[dict], metrics: list[str]) -> list[dict]:
    """A notebook's runs, oldest first, as `rlwb.plots.trends.trend_figure` points."""
    out = []
    for r in sorted(runs, key=lambda r: (r.get("started_at") or "", r["run_id"])):
        drift, when = r.get("drift"), (r.get("started_at") or "")[5:16].replace("T", " ")
        out.append({"label": f"{when}\n{(r.get('git_commit') or '?')[:7]}",
                    "versions": engine_versions(r.get("engines") or {}), "status": r.get("status", "?"),
                    "drift": None if drift is None else not drift.get("ok"), "run": r,
                    "params": r.get("params_hash"), "model": run_model_name(r),
                    "values": {m: r["metrics"].get(m) for m in metrics}})
    return out


def trends_html(root: Path, runs: list[dict]) -> str:
    """Per notebook: the trend figure (`trends/<notebook>.png`) and a table of its points."""
    import matplotlib.pyplot as plt

    from rlwb.plots.trends import trend_figure
    from rlwb.registry import headline

    plots.set_style("notebook")
    parts = []
    for nb in sorted({r["notebook"] for r in runs}):
        metrics = headline(nb)
        points = trend_points([r for r in runs if r["notebook"] == nb], metrics)
        if not metrics or len(points) < 2:  # one point is no trend: the latest report above says it all
            continue
        fig = trend_figure(points, metrics, f"{nb}: headline metrics, run after run")
        plots.save_figure(fig, root / "trends" / nb)
        plt.close(fig)
        rows = "".join(
            f"<tr><td>{html.escape((p['run'].get('started_at') or '')[:16].replace('T', ' '))}</td>"
            f'<td><a href="{html.escape(os.path.relpath(p["run"]["dir"], root))}/report.html">'
            f"{html.escape(p['run']['run_id'])}</a></td><td>{html.escape(p['status'])}</td>"
            f"<td><code>{html.escape((p['run'].get('git_commit') or '')[:10])}</code></td>"
            f"<td>{html.escape(p['versions'])}</td>"
            f"<td>{'' if p['drift'] is None else 'DRIFT' if p['drift'] else 'no drift'}</td>"
            + "".join(f"<td>{html.escape(metric(m, p['values'][m], '.3g'))}</td>" for m in metrics) + "</tr>"
            for p in reversed(points))
        head = "".join(f"<th><code>{html.escape(m)}</code></th>" for m in metrics)
        width = 320 * len(metrics) + 160  # px: the same scale for every notebook's panels
        runs_text = f"{len(points)} run" + ("s" if len(points) != 1 else "")
        parts.append(f'<h3>{html.escape(nb)}</h3><img class="trend" src="trends/{html.escape(nb)}.png" '
                     f'style="width: {width}px" alt="trend of {html.escape(nb)}"><details><summary>{runs_text}: '
                     f"when, commit, engine versions, verdict</summary><table>"
                     f"<tr><th>started (UTC)</th><th>run</th><th>status</th><th>commit</th><th>engines</th>"
                     f"<th>rerun verdict</th>{head}</tr>{rows}</table></details>")
    return "".join(parts)


NO_ANSWER = "(no answer recorded: a run made before answers were archived)"


def latest_html(root: Path, runs: list[dict]) -> str:
    """The index's opening: per notebook (registry order, then any others), its latest successful run's report
    link, when and on which model build it ran, and its one-line answer."""
    from rlwb.registry import NOTEBOOKS

    newest = {}
    for r in runs:  # newest first
        if r.get("status") == "ok":
            newest.setdefault(r["notebook"], r)
    order = [nb for nb in NOTEBOOKS if nb in newest] + sorted(set(newest) - set(NOTEBOOKS))
    rows = []
    for nb in order:
        r = newest[nb]
        rel = os.path.relpath(r["dir"], root)
        question = NOTEBOOKS[nb].question if nb in NOTEBOOKS else ""
        model = r.get("model") or {}
        build = model.get("weights_sha256_16") or ""
        rows.append(f"<tr><td><b>{html.escape(nb)}</b><div class=q>{html.escape(question)}</div></td>"
                    f'<td><a href="{html.escape(rel)}/report.html">{html.escape(r["run_id"])}</a>'
                    f"<div class=q>{html.escape((r.get('started_at') or '')[:16].replace('T', ' '))} UTC"
                    + (f" · {html.escape(run_model_name(r) or '')} <code>{html.escape(build)}</code>" if build else "")
                    + f"</div></td><td>{html.escape(r.get('answer') or NO_ANSWER)}</td></tr>")
    if not rows:
        return "<p>No successful run yet: <code>make reports</code> makes one per notebook.</p>"
    return ("<table class=latest><thead><tr><th>notebook</th><th>latest report</th><th>answer</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def build_index(root: Path) -> Path:
    """`<outputs>/index.html`: the trend of every notebook's headline metrics across runs (versions, commits,
    drift and failures marked), then every run, newest first, filterable. Static HTML + PNGs, offline."""
    from rlwb.registry import headline

    runs = archive.list_runs(root)
    latest = latest_html(root, runs)
    trends = trends_html(root, runs) or "<p>Trends appear once a notebook has two or more runs.</p>"
    rows = []
    for r in runs:
        rel = os.path.relpath(r["dir"], root)
        engines = r.get("engines") or {}
        eng = ", ".join(f"{k} ({v.get('engine')}{' ' + v['vllm_version'] if v.get('vllm_version') else ''})"
                        for k, v in engines.items())
        heads = headline(r["notebook"])
        head = "<br>".join(f"<code>{html.escape(k)}</code> = {html.escape(metric(k, r['metrics'].get(k), '.4g'))}"
                           for k in heads[:3])
        figs = sorted(Path(r["dir"], "figures").glob("*.png"))
        fig_links = " ".join(f'<a href="{html.escape(os.path.relpath(f, root))}">{html.escape(f.stem)}</a>'
                             for f in figs)
        commit = (r.get("git_commit") or "")[:10] + (" (dirty)" if r.get("git_dirty") else "")
        status = r.get("status", "?")
        rows.append(
            f'<tr class="run" data-notebook="{html.escape(r["notebook"])}" data-status="{html.escape(status)}">'
            f"<td>{html.escape(r['notebook'])}</td>"
            f'<td><a href="{html.escape(rel)}/report.html">{html.escape(r["run_id"])}</a></td>'
            f"<td>{html.escape((r.get('started_at') or '')[:19].replace('T', ' '))}</td>"
            f'<td class="status {html.escape(status)}">{html.escape(status)}'
            + (f'<div class="err">{html.escape((r.get("error") or "")[:200])}</div>' if status != "ok" else "")
            + f"</td><td>{html.escape(number(r.get('duration_s'), '.4g'))}</td>"
            f"<td><code>{html.escape(commit)}</code></td>"
            f"<td>{html.escape(eng)}</td><td>{head}</td>"
            f'<td>{fig_links} · <a href="{html.escape(rel)}/params.yaml">params</a></td></tr>')
    notebooks = sorted({r["notebook"] for r in runs})
    opts = "".join(f'<option value="{html.escape(n)}">{html.escape(n)}</option>' for n in notebooks)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rlwb runs</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem; color: #222; }}
table {{ border-collapse: collapse; width: 100%; font-size: 0.9rem; }}
th, td {{ border-bottom: 1px solid #ddd; padding: 0.4rem 0.6rem; text-align: left; vertical-align: top; }}
th {{ background: #f4f4f4; position: sticky; top: 0; }}
.status.ok {{ color: #009E73; font-weight: 600; }}
.status.failed {{ color: #fff; background: #D55E00; font-weight: 600; }}
.err {{ font-size: 0.75rem; font-weight: 400; }}
.filters {{ margin: 1rem 0; }}
img.trend {{ max-width: 100%; display: block; }}
details table {{ width: auto; font-size: 0.8rem; }}
.q {{ font-size: 0.8rem; color: #555; }}
table.latest td:last-child {{ max-width: 60rem; }}
</style></head><body>
<h1>rlwb runs</h1>
<h2 id="latest">Latest report of each notebook</h2>
{latest}
<h2 id="trends">Trends</h2>
<p>Each notebook's headline metrics, run after run (oldest left); one line per parameter set (runs with other
parameters measure something else). Dotted lines: the engines' versions changed. Red rings: a rerun flagged drift
against the run it repeated. Red crosses: failed runs.</p>
{trends}
<h2 id="runs">Every run</h2>
<p>{len(runs)} archived runs under <code>{html.escape(str(root))}</code>, newest first.</p>
<div class="filters">notebook <select id="nb"><option value="">all</option>{opts}</select>
status <select id="st"><option value="">all</option><option>ok</option><option>failed</option></select></div>
<table id="runs"><thead><tr><th>notebook</th><th>run</th><th>started (UTC)</th><th>status</th><th>duration s</th>
<th>git commit</th><th>engines</th><th>headline metrics</th><th>files</th></tr></thead>
<tbody>{''.join(rows)}</tbody></table>
<script>
function apply() {{
  const nb = document.getElementById('nb').value, st = document.getElementById('st').value;
  for (const tr of document.querySelectorAll('tr.run'))
    tr.style.display = (!nb || tr.dataset.notebook === nb) && (!st || tr.dataset.status === st) ? '' : 'none';
}}
document.getElementById('nb').onchange = apply; document.getElementById('st').onchange = apply;
</script></body></html>
"""
    root.mkdir(parents=True, exist_ok=True)
    out = root / "index.html"
    tmp = root / ".index.html.tmp"
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out


def compare_table(rows: list[dict], only_interesting: bool = False) -> str:
    shown = [r for r in rows if not only_interesting or r["status"] != "ok"]
    table = [("metric", "run A", "run B", "B - A", "status")]
    table += [(r["metric"], *(number(r[k], ".5g", "-") for k in ("a", "b", "diff")), r["status"]) for r in shown]
    return text_table(table, "<>>>-", widths=[None, 12, 12, 12, None])


def dump_json(obj) -> str:
    return json.dumps(obj, indent=2, default=str)


# -- report.html ------------------------------------------------------------------------------------
REMOVED_CELL_TAGS = ("parameters", "injected-parameters")  # shown in the provenance block instead

REPORT_CSS = """
<style>
.rlwb-provenance { font-size: 12px; color: #444; border-left: 3px solid #bbb; padding: 4px 10px; margin: 8px 0 16px; }
.rlwb-provenance code { font-size: 11px; }
.rlwb-provenance table { font-size: 11px; margin-top: 4px; }
.rlwb-provenance td, .rlwb-provenance th { padding: 1px 8px 1px 0; text-align: left; }
.rlwb-failed { background: #fde8e8; border-left: 3px solid #c00; padding: 6px 10px; margin: 8px 0; }
</style>
"""


def _engine_line(preset: str, info: dict) -> str:
    if info.get("backend") == "hf":
        what = f"transformers {info.get('transformers_version', '?')} (reference)"
    elif info.get("backend") == "openai":
        what = f"served vLLM {info.get('server_version', '?')} at {info.get('url', '?')} ({info.get('served_model')})"
    else:
        what = f"vLLM {info.get('vllm_version', '?')} ({str(info.get('engine', '?')).upper()})"
    return f"<code>{html.escape(preset)}</code> {html.escape(what)}"


def _model_line(model: dict | None) -> str:
    if not model:
        return "–"
    card = model.get("card") or {}
    if card.get("recipe_hash"):
        from rlwb.core.models.store import published_verdict

        match = card.get("weights_match_published")
        verdict = "" if match is None else f" ({html.escape(published_verdict(card))})"
        return (f"embedded {html.escape(str(card.get('name', 'default')))}, {card.get('params', 0):,} parameters, "
                f"recipe <code>{html.escape(card['recipe_hash'])}</code>, weights "
                f"<code>{html.escape(str(card.get('weights_sha256_16')))}</code>{verdict}")
    return f"<code>{html.escape(Path(str(model.get('path', '?'))).name)}</code>"


def _source_line(source: dict) -> str:
    """Where an audit's rollouts came from: its prompts file, or the archived run it re-scored."""
    if source.get("kind") == "archived run":
        return (f"re-scored from run <code>{html.escape(str(source.get('run_id')))}</code> of "
                f"{html.escape(str(source.get('notebook')))}")
    return (f"prompts file <code>{html.escape(Path(str(source.get('path', '?'))).name)}</code>, "
            f"{source.get('rows')} rows, sha256 <code>{html.escape(str(source.get('sha256', ''))[:12])}</code>")


def provenance_html(run_dir: Path) -> str:
    """The compact block under a report's title: what ran, on what, from which commit; params folded."""
    import yaml

    info = archive.read_json(run_dir / "run.json", {})
    params = yaml.safe_load((run_dir / "params.yaml").read_text()) if (run_dir / "params.yaml").exists() else {}
    pk = info.get("packages") or {}
    commit = (info.get("git_commit") or "unknown")[:10] + (" (uncommitted changes)" if info.get("git_dirty") else "")
    engines = " · ".join(_engine_line(k, v) for k, v in (info.get("engines") or {}).items()) or "none"
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code></td><td>{html.escape(str(v))}</td></tr>"
                   for k, v in params.items())
    parts = [
        f"<div><b>Run</b> <code>{html.escape(str(info.get('run_id', run_dir.name)))}</code> · "
        f"started {html.escape(str(info.get('started_at', '?')))} · git <code>{html.escape(commit)}</code> · "
        f"torch {html.escape(str(pk.get('torch', '?')))}, transformers {html.escape(str(pk.get('transformers', '?')))}"
        f"</div>",
        f"<div><b>Model</b> {_model_line(info.get('model'))}</div>",
        f"<div><b>Engines</b> {engines}</div>",
        *([f"<div><b>Source</b> {_source_line(info['source'])}</div>"] if info.get("source") else []),
        f"<details><summary>Parameters (hash <code>{html.escape(str(info.get('params_hash', '?')))}</code>)"
        f"</summary><table>{rows}</table></details>",
    ]
    return '<div class="rlwb-provenance">' + "".join(parts) + "</div>"


def report_notebook(nb, run_dir: Path, error: str | None = None):
    """The notebook as a reader gets it: parameters cells out (the provenance block under the title holds
    them), a failure stated first. Code is hidden by the exporter (`export_report`)."""
    import nbformat

    nb = nbformat.from_dict(nb)
    nb.cells = [c for c in nb.cells if not set(c.metadata.get("tags", [])) & set(REMOVED_CELL_TAGS)]
    block = REPORT_CSS + provenance_html(run_dir)
    if error:
        block += f'<div class="rlwb-failed"><b>This run failed:</b> {html.escape(error)}</div>'
    title_at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells.insert(title_at, nbformat.v4.new_markdown_cell(block))
    return nb


def export_report(nb_path: Path, html_path: Path, run_dir: Path, error: str | None = None) -> None:
    """`report.html`: answer-first notebooks rendered without code or prompts (the code stays in
    notebook.ipynb), with the provenance block under the title."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = report_notebook(nbformat.read(nb_path, as_version=4), run_dir, error)
    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb)
    html_path.write_text(body, encoding="utf-8")


def time_table(runs: list[dict], since: str | None = None) -> list[dict]:
    """The latest finished run of each notebook (started at or after `since`, an ISO UTC time, when given):
    its wall time split by phase (`time_s` in run.json; runs archived before the split have the total only),
    then a total row. Rows are dicts: notebook, run_id, then the phases of `rlwb.timing`, other and total."""
    from rlwb.timing import PHASES

    latest: dict[str, dict] = {}
    for r in runs:  # newest first
        if r.get("status") != "ok" or r["notebook"] in latest or (since and (r.get("started_at") or "") < since):
            continue
        latest[r["notebook"]] = r
    cols = [*PHASES, "other", "total"]
    rows = []
    for nb in sorted(latest):
        r = latest[nb]
        split = r.get("time_s") or {"total": r.get("duration_s")}
        rows.append({"notebook": nb, "run_id": r["run_id"], **{c: split.get(c) for c in cols}})
    if rows:
        rows.append({"notebook": "all", "run_id": "", **{c: (sum(x[c] for x in rows) if all(x[c] is not None
                                                               for x in rows) else None) for c in cols}})
    return rows
