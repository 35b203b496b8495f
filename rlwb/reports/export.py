"""report.html of a run: the notebook exported with the answer first, code hidden, provenance on top."""

from __future__ import annotations

import html
from pathlib import Path

from rlwb import archive

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
    from nbconvert.preprocessors import TagRemovePreprocessor

    nb = nbformat.from_dict(nb)
    nb, _ = TagRemovePreprocessor(remove_cell_tags=set(REMOVED_CELL_TAGS)).preprocess(nb, {})
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
