"""report.html of a run: the notebook exported with the answer first, code hidden, provenance on top."""

from __future__ import annotations

from pathlib import Path

from rlwb import archive
from rlwb.host import cpu_name

# -- report.html ------------------------------------------------------------------------------------
REMOVED_CELL_TAGS = ("parameters", "injected-parameters")  # shown in the provenance block instead
# lab's markup, a reading stylesheet of a few KB, no scripts: every clone and every lent GPU carries the runs of
# record's reports, and the lab theme they inlined was half of each (templates/nbconvert/rlwb_report)
REPORT_TEMPLATE = Path(__file__).with_name("templates") / "nbconvert" / "rlwb_report"
# what a reader must not meet in a report: a stderr output, a path object or a temporary path, a progress bar, a
# model loader's chatter, a traceback, the runner's own start marker (`reader_noise`)
REPORT_NOISE = ('data-mime-type="application/vnd.jupyter.stderr"', "PosixPath", "/tmp/", ".tmp-", "it/s]", "s/it]",
                "Loading weights", "IProgress", "TqdmWarning", "Traceback", "rlwb.notebook.start")


def reader_noise(html: str) -> list[str]:
    """The `REPORT_NOISE` strings a report's HTML shows (none: it is fit for a reader)."""
    return [n for n in REPORT_NOISE if n in html]


def _engine_what(info: dict) -> str:
    if info.get("backend") == "hf":
        return f"transformers {info.get('transformers_version', '?')} (reference)"
    if info.get("backend") == "openai":
        return f"served vLLM {info.get('server_version', '?')} at {info.get('url', '?')} ({info.get('served_model')})"
    return f"vLLM {info.get('vllm_version', '?')} ({str(info.get('engine', '?')).upper()})"


def _model_fields(model: dict | None) -> dict | None:
    if not model:
        return None
    card = model.get("card") or {}
    if card.get("recipe_hash"):
        from rlwb.core.models.published_builds import published_verdict

        return {"embedded": True, "name": str(card.get("name", "default")), "params": f"{card.get('params', 0):,}",
                "recipe": card["recipe_hash"], "weights": str(card.get("weights_sha256_16")),
                "verdict": None if card.get("weights_match_published") is None else published_verdict(card)}
    return {"embedded": False, "path": Path(str(model.get("path", "?"))).name}


def _source_fields(source: dict | None) -> dict | None:
    """Where an audit's rollouts came from: its prompts file, or the archived run it re-scored."""
    if not source:
        return None
    if source.get("kind") == "archived run":
        return {"archived": True, "run_id": str(source.get("run_id")), "notebook": str(source.get("notebook"))}
    return {"archived": False, "file": Path(str(source.get("path", "?"))).name, "rows": source.get("rows"),
            "sha256": str(source.get("sha256", ""))[:12]}


def _reanalysis_fields(again: dict | None) -> dict | None:
    """The run whose data a reanalysis (`rlwb run --reanalyze`) analysed again, and the commit that trained it."""
    if not again:
        return None
    trained = again.get("training") or {}
    return {"run_id": str(trained.get("run_id") or "unknown"), "commit": str(trained.get("commit") or "unknown")[:10],
            "via": [str(v.get("run_id")) for v in again.get("via") or []]}


def device_line(host: dict | None) -> str:
    """Where the run computed, for the provenance block: the GPU with its CUDA runtime and driver where it had one
    (`host.cuda`), else the CPU."""
    host = host or {}
    if host.get("gpu"):
        cuda = host.get("cuda") or {}
        extra = ", ".join(x for x in (f"CUDA {cuda['cuda_runtime']}" if cuda.get("cuda_runtime") else "",
                                      f"driver {cuda['driver']}" if cuda.get("driver") else "") if x)
        return f"{host['gpu']}" + (f" ({extra})" if extra else "")
    return f"{cpu_name(host)} (CPU)" if host.get("cpu") else "?"


def provenance_html(run_dir: Path, error: str | None = None) -> str:
    """The compact block under a report's title: what ran, on what, from which commit; params folded; a failure
    stated (`templates/provenance.html`, autoescaped: no value can break the page)."""
    import yaml

    from rlwb.reports.pages import render

    info = archive.read_record(run_dir, {})
    params = yaml.safe_load((run_dir / "params.yaml").read_text()) if (run_dir / "params.yaml").exists() else {}
    pk = info.get("packages") or {}
    commit = (info.get("git_commit") or "unknown")[:10] + (" (uncommitted changes)" if info.get("git_dirty") else "")
    return render("provenance.html", run_id=str(info.get("run_id", run_dir.name)),
                  started_at=str(info.get("started_at", "?")), commit=commit, torch=str(pk.get("torch", "?")),
                  transformers=str(pk.get("transformers", "?")), device=device_line(info.get("host")),
                  model=_model_fields(info.get("model")),
                  engines=[(k, _engine_what(v)) for k, v in (info.get("engines") or {}).items()],
                  source=_source_fields(info.get("source")), reanalysis=_reanalysis_fields(info.get("reanalysis")),
                  params_hash=str(info.get("params_hash", "?")),
                  params=[(k, str(v)) for k, v in (params or {}).items()], error=error)


def report_notebook(nb, run_dir: Path, error: str | None = None):
    """The notebook as a reader gets it: parameters cells out (the provenance block under the title holds
    them), a failure stated first. Code is hidden by the exporter (`export_report`)."""
    import nbformat
    from nbconvert.preprocessors import TagRemovePreprocessor

    nb = nbformat.from_dict(nb)
    nb, _ = TagRemovePreprocessor(remove_cell_tags=set(REMOVED_CELL_TAGS)).preprocess(nb, {})
    block = provenance_html(run_dir, error or None)  # styled by the template's report.css
    title_at = 1 if nb.cells and nb.cells[0].cell_type == "markdown" else 0
    nb.cells.insert(title_at, nbformat.v4.new_markdown_cell(block))
    return nb


def report_title(nb) -> str:
    """The browser tab's title: the notebook's first heading ("08 · What mismatch costs..."), not nbconvert's
    "Notebook"."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return "rlwb report"


def export_report(nb_path: Path, html_path: Path, run_dir: Path, error: str | None = None) -> None:
    """`report.html`: answer-first notebooks rendered without code or prompts (the code stays in
    notebook.ipynb), with the provenance block under the title."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = report_notebook(nbformat.read(nb_path, as_version=4), run_dir, error)
    from traitlets.config import Config

    nb.metadata["title"] = report_title(nb)
    # no code is shown, so pygments' stylesheet has nothing to colour
    exporter = HTMLExporter(config=Config({"CSSHTMLHeaderPreprocessor": {"enabled": False}}),
                            template_name=REPORT_TEMPLATE.name, extra_template_basedirs=[str(REPORT_TEMPLATE.parent)],
                            exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb)
    html_path.write_text(body, encoding="utf-8")
