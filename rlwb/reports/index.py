"""`rlwb index`: outputs/index.html, the latest report of each notebook with its answer, trends, every run."""

from __future__ import annotations

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


def trend_sections(root: Path, runs: list[dict]) -> list[dict]:
    """Per notebook with two or more runs: its trend figure (written to `trends/<notebook>.png`) and a table of
    its points, newest first, for the index template."""
    import matplotlib.pyplot as plt

    from rlwb.plots.trends import trend_figure
    from rlwb.registry import headline

    plots.set_style("notebook")
    sections = []
    for nb in sorted({r["notebook"] for r in runs}):
        metrics = headline(nb)
        points = trend_points([r for r in runs if r["notebook"] == nb], metrics)
        if not metrics or len(points) < 2:  # one point is no trend: the latest report above says it all
            continue
        fig = trend_figure(points, metrics, f"{nb}: headline metrics, run after run")
        # PNG for the page, PDF for a paper: no SVG copy (docs/runs travels to every clone and every lent GPU call)
        plots.save_figure(fig, root / "trends" / nb, formats=("png", "pdf"))
        plt.close(fig)
        rows = [{"started": (p["run"].get("started_at") or "")[:16].replace("T", " "),
                 "rel": os.path.relpath(p["run"]["dir"], root), "page": run_page(p["run"]["dir"]),
                 "run_id": p["run"]["run_id"], "status": p["status"],
                 "commit": (p["run"].get("git_commit") or "")[:10], "versions": p["versions"],
                 "verdict": "" if p["drift"] is None else "DRIFT" if p["drift"] else "no drift",
                 "values": [metric(m, p["values"][m], ".3g") for m in metrics]}
                for p in reversed(points)]
        sections.append({"notebook": nb, "metrics": metrics, "rows": rows,
                         "width": 320 * len(metrics) + 160,  # px: the same scale for every notebook's panels
                         "runs_text": f"{len(points)} run" + ("s" if len(points) != 1 else "")})
    return sections


NO_ANSWER = "(no answer recorded: a run made before answers were archived)"
PAGES = ("report.html", "bench.md")  # a run's page, the first it has: a notebook's report, a bench run's table


def run_page(run_dir: str | os.PathLike) -> str:
    """The file the index links a run by: its report.html, or, for an `rlwb bench` run (no notebook, no report), its
    bench.md (a Markdown table a browser shows as text)."""
    return next((f for f in PAGES if (Path(run_dir) / f).exists()), PAGES[0])


def run_files(root: Path, run: dict) -> list[dict]:
    """What the index links beside a run's page and figures: its params.yaml and, for a bench run, the bench.json
    its numbers and figures come from (those it has)."""
    d = Path(run["dir"])
    return [{"href": os.path.relpath(d / f, root), "name": name}
            for f, name in (("params.yaml", "params"), ("bench.json", "bench.json")) if (d / f).exists()]


def latest_rows(root: Path, runs: list[dict]) -> list[dict]:
    """The index's opening: per notebook (registry order, then any others) and parameter set (newest first), its
    latest successful run's report link, when and on which model build it ran, and its one-line answer. One row
    per parameter set, as the trends draw one line per set: runs with other params answer other questions (08's
    study per model and its one-sided follow-ups), and the newest of them must not hide the others."""
    from rlwb.registry import NOTEBOOKS

    newest: dict[tuple, dict] = {}
    for r in runs:  # newest first
        if r.get("status") == "ok":
            newest.setdefault((r["notebook"], r.get("params_hash")), r)
    notebooks = {nb for nb, _ in newest}
    order = [nb for nb in NOTEBOOKS if nb in notebooks] + sorted(notebooks - set(NOTEBOOKS))
    rows = []
    for r in sorted(newest.values(), key=lambda r: order.index(r["notebook"])):  # stable: newest first within one
        nb = r["notebook"]
        build = (r.get("model") or {}).get("weights_sha256_16") or ""
        rows.append({"notebook": nb, "question": NOTEBOOKS[nb].question if nb in NOTEBOOKS else r.get("question") or "",
                     "rel": os.path.relpath(r["dir"], root), "page": run_page(r["dir"]), "run_id": r["run_id"],
                     "started": (r.get("started_at") or "")[:16].replace("T", " "), "build": build,
                     "model_name": (run_model_name(r) or "") if build else "",
                     "answer": r.get("answer") or NO_ANSWER})
    return rows


def run_rows(root: Path, runs: list[dict]) -> list[dict]:
    """Every run, newest first, for the index's filterable table."""
    from rlwb.registry import headline

    rows = []
    for r in runs:
        engines = r.get("engines") or {}
        status = r.get("status", "?")
        rows.append({
            "notebook": r["notebook"], "rel": os.path.relpath(r["dir"], root), "page": run_page(r["dir"]),
            "run_id": r["run_id"],
            "started": (r.get("started_at") or "")[:19].replace("T", " "), "status": status,
            "error": (r.get("error") or "")[:200], "duration": number(r.get("duration_s"), ".4g"),
            "reanalysis": reanalysis_note(r.get("reanalysis")),
            "commit": (r.get("git_commit") or "")[:10] + (" (dirty)" if r.get("git_dirty") else ""),
            "engines": ", ".join(f"{k} ({v.get('engine')}{' ' + v['vllm_version'] if v.get('vllm_version') else ''})"
                                 for k, v in engines.items()),
            "headline": [{"key": k, "value": metric(k, r["metrics"].get(k), ".4g")}
                         for k in headline(r["notebook"])[:3]],
            "figures": [{"href": os.path.relpath(f, root), "name": f.stem}
                        for f in sorted(Path(r["dir"], "figures").glob("*.png"))],
            "files": run_files(root, r)})
    return rows


def reanalysis_note(again: dict | None) -> str:
    """What the index says of a run that trained nothing (`rlwb run --reanalyze`): whose data it analysed again and
    what training them took (each part of the chain's own duration), so its own seconds are not read as the study's."""
    if not again:
        return ""
    trained = again.get("training") or {}
    spent = sum(float(c.get("duration_s") or 0) for c in trained.get("chain") or []) or float(
        trained.get("duration_s") or 0)
    return (f"reanalysis of {trained.get('run_id', '?')} (commit {str(trained.get('commit') or '?')[:7]}"
            + (f", {spent:.0f} s to train" if spent else "") + ")")


def shown_path(root: Path) -> str:
    """The archive root as the page names it: repository-relative inside the repository (a committed index, e.g. of
    docs/runs, must not name one machine's path), else absolute."""
    from rlwb.paths import shown

    return shown(Path(root).resolve())


def build_index(root: Path) -> Path:
    """`<outputs>/index.html`: the trend of every notebook's headline metrics across runs (versions, commits,
    drift and failures marked), then every run, newest first, filterable. Static HTML + PNGs, offline
    (`templates/index.html`)."""
    from rlwb.reports.pages import render

    runs = archive.list_runs(root)
    page = render("index.html", latest=latest_rows(root, runs), trends=trend_sections(root, runs),
                  runs=run_rows(root, runs), notebooks=sorted({r["notebook"] for r in runs}), root=shown_path(root))
    root.mkdir(parents=True, exist_ok=True)
    out = root / "index.html"
    tmp = root / ".index.html.tmp"
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out
