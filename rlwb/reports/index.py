"""`rlwb index`: outputs/index.html, the latest report of each notebook with its answer, trends, every run."""

from __future__ import annotations

import html
import os
from pathlib import Path

from rlwb import archive, plots
from rlwb.formatting import metric, number


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
