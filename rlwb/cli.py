"""`rlwb` command line: run | audit | rescore | runs | figures | compare | index | rerun | sweep | bench | validate |
build-model | engines check | sync-params | readme-check.

Exit codes: 0 success, 1 a run failed / a check did not pass, 2 bad input (params, paths, presets).
`rlwb run` prints the run directory as the last line of stdout, so scripts can `dir=$(rlwb run ... | tail -1)`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlwb.core.models.store import EMBEDDED_NAMES
from rlwb.errors import ParamError, RunFailed, SetupFailed
from rlwb.formatting import number
from rlwb.params import parse_override


def _archived_run(notebook: str, a, overrides: dict, cmd: str) -> int:
    """One archived run (`rlwb run`, `audit`, `rescore`): the run directory is the last line of stdout, a failed
    run's too (it is archived as failed), with its error on stderr and exit 1."""
    from rlwb import runner

    try:
        run_dir = runner.run(notebook, a.file or [], overrides, a.outputs, log_output=a.log_output)
    except RunFailed as e:
        print(f"rlwb {cmd}: {e.error}", file=sys.stderr)
        print(e.run_dir)
        return 1
    print(run_dir)
    return 0


def _cmd_run(a) -> int:
    return _archived_run(a.notebook, a, {key: parse_override(key, value) for key, value in a.param or []}, "run")


def _run_audit(a, overrides: dict) -> int:
    """`rlwb run notebooks/10_audit.ipynb` with the audit's overrides on top of `-f`/`-p` (a flag such as --model
    wins over `-p model`): archived and reported like every notebook."""
    for key, value in a.param or []:
        overrides.setdefault(key, parse_override(key, value))
    return _archived_run("10_audit", a, overrides, a.cmd)


def _cmd_audit(a) -> int:
    """Paths a user types are relative to where they type them; the notebook's kernel runs elsewhere."""
    overrides = {"trainer": a.trainer}
    if a.model:
        overrides["model"] = a.model if not Path(a.model).exists() else str(Path(a.model).resolve())
    if a.prompts:  # a file of the repository is recorded as the repository names it (the same in any checkout)
        from rlwb.paths import REPO_ROOT

        path = Path(a.prompts).expanduser().resolve()
        overrides["prompts_file"] = str(path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path)
    if a.engine:
        overrides["engines"] = a.engine
    if a.served_model:
        overrides["served_model"] = a.served_model
    return _run_audit(a, overrides)


def _cmd_rescore(a) -> int:
    import yaml

    src = Path(a.run_dir).expanduser().resolve()
    if not (src / "params.yaml").is_file():
        raise ParamError(f"{a.run_dir}: not an archived run (no params.yaml)")
    model = a.model or (yaml.safe_load((src / "params.yaml").read_text()) or {}).get("model", "default")
    return _run_audit(a, {"rollouts_from": str(src), "prompts_file": "", "engines": [], "trainer": a.trainer,
                          "model": model})


def _cmd_runs(a) -> int:
    from rlwb.archive import list_runs
    from rlwb.paths import outputs_dir
    from rlwb.registry import headline

    runs = list_runs(outputs_dir(a.outputs))
    if a.notebook:
        runs = [r for r in runs if r["notebook"] == a.notebook]
    if a.json:
        print(json.dumps(runs, indent=2, default=str))
        return 0
    rows = [("notebook", "run id", "status", "duration_s", "headline")]
    for r in runs:
        keys = headline(r["notebook"])[:1]
        head = ", ".join(f"{k}={number(r['metrics'].get(k))}" for k in keys)
        rows.append((r["notebook"], r["run_id"], r.get("status", "?"), number(r.get("duration_s")), head))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    if len(rows) == 1:
        print("(no runs archived yet)")
    return 0


def _cmd_times(a) -> int:
    from rlwb.archive import list_runs
    from rlwb.paths import outputs_dir
    from rlwb.reports import time_table

    rows = time_table(list_runs(outputs_dir(a.outputs)), since=a.since)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("(no finished runs" + (f" since {a.since})" if a.since else ")"))
        return 0
    cols = list(rows[0])
    table = [cols] + [[r["notebook"], r["run_id"]] + [("–" if r[c] is None else f"{r[c]:.0f}") for c in cols[2:]]
                      for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(cols))]
    print("seconds of wall time per phase, latest finished run of each notebook")
    for row in table:
        print("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return 0


def _cmd_build_model(a) -> int:
    from rlwb.core.models.store import build_embedded_model, published_verdict

    m = build_embedded_model(a.model, force=a.force, from_recipe=a.from_recipe)
    print(json.dumps(m.card, indent=2))
    verdict = published_verdict(m.card)
    print(f"weights checksum {m.card['weights_sha256_16']} ({verdict})")
    print(m.path)
    return 1 if a.from_recipe and verdict.startswith("DIFFERS") else 0


def _cmd_engines_setup(a) -> int:
    from rlwb.engines.setup import setup_preset

    for name in a.presets:
        print(setup_preset(name, force=a.force, log=lambda m: print(m, file=sys.stderr)))
    return 0


def _cmd_engines_check(a) -> int:
    from rlwb.engine_check import check_engines, exit_code

    report = check_engines(a.engines or None, model=a.model)
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        for name, r in report.items():
            held = f" held to the {r['expected']}: {r['why']}" if r.get("expected") and r.get("why") else ""
            print(f"{name:22s} {r['status']:13s} {r.get('engine') or '':3s} {r.get('dtype') or '':9s}{held}")
            if r.get("error"):  # the first lines say what failed (a validation error names the field after line 1)
                for line in [s for s in r["error"].splitlines() if s.strip()][:3]:
                    print(f"{'':22s} {line.strip()[:200]}")
    return exit_code(report)


def _cmd_figures(a) -> int:
    from rlwb.reports import regenerate_figures

    for path in regenerate_figures(a.run_dir, a.style):
        print(path)
    return 0


def _cmd_compare(a) -> int:
    from rlwb.reports import compare, compare_table, drift_summary, dump_json, provenance_differences

    ok, rows = compare(a.run_a, a.run_b, a.rtol, a.atol, a.include_timing)
    prov = provenance_differences(a.run_a, a.run_b)
    if a.json:
        print(dump_json({"ok": ok, "rows": rows, "provenance": prov}))
    else:
        print(compare_table(rows))
        print(f"\n{drift_summary(ok, rows, prov)}\n(rtol={a.rtol:g}, atol={a.atol:g})")
    return 0 if ok else 1


def _cmd_index(a) -> int:
    from rlwb.paths import outputs_dir
    from rlwb.reports import build_index

    print(build_index(outputs_dir(a.outputs)))
    return 0


def _cmd_rerun(a) -> int:

    from rlwb import runner
    from rlwb.paths import NOTEBOOKS_DIR, outputs_dir
    from rlwb.reports import (
        build_index,
        compare,
        compare_table,
        drift_summary,
        latest_ok_run,
        provenance_differences,
        record_drift,
    )

    root = outputs_dir(a.outputs)
    notebooks = [Path(n).stem for n in a.notebooks] or sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9]*.ipynb"))
    reference = None if a.compare_to == "latest" else reference_run(Path(a.compare_to), notebooks)
    status = 0
    for nb in notebooks:
        prev = reference or latest_ok_run(root, nb)
        if prev is None:
            print(f"== {nb}: no successful run to rerun; skipped", file=sys.stderr)
            continue
        print(f"== {nb}: rerunning {prev.name} with its resolved params", file=sys.stderr)
        try:
            new = runner.run(nb, [str(prev / "params.yaml")], None, root)
        except RunFailed as e:
            print(f"{nb}: rerun failed: {e.error}", file=sys.stderr)
            status = 1
            continue
        ok, rows = compare(prev, new, a.rtol, a.atol)
        print(compare_table(rows, only_interesting=True), file=sys.stderr)
        prov = provenance_differences(prev, new)
        record_drift(new, prev, ok, rows, prov)
        if prov:
            print(drift_summary(ok, rows, prov), file=sys.stderr)
        print(f"{nb}: {'no drift' if ok else 'DRIFT'} ({prev.name} -> {new.name})", file=sys.stderr)
        print(new)
        status |= 0 if ok else 1
    index = build_index(root)
    print(f"trends and every run: {index.as_uri()}#trends", file=sys.stderr)
    return status


def reference_run(run_dir: Path, notebooks: list[str]) -> Path:
    """`rerun --compare-to RUN_DIR`: a successful archived run of the one notebook being rerun."""
    from rlwb.archive import read_json

    info = read_json(run_dir / "run.json")
    if info is None:
        raise ParamError(f"--compare-to {run_dir}: not an archived run (no run.json)")
    if len(notebooks) != 1 or info.get("notebook") != notebooks[0]:
        raise ParamError(f"--compare-to {run_dir} is a run of {info.get('notebook')!r}: rerun exactly that notebook "
                         f"(got {notebooks})")
    if info.get("status") != "ok":
        raise ParamError(f"--compare-to {run_dir}: its status is {info.get('status')!r}, not ok")
    return run_dir.resolve()


def _cmd_sweep(a) -> int:
    from rlwb import sweep
    from rlwb.archive import check_writable
    from rlwb.paths import outputs_dir

    root = outputs_dir(a.outputs)
    check_writable(root)
    resume = None
    if a.resume:
        resume = sweep.latest_sweep_dir(root, Path(a.grid)) if a.resume == "latest" else Path(a.resume)
        if resume is None:
            raise ParamError(f"--resume: no earlier sweep of {a.grid} under {root / 'sweeps'}")
    try:
        sweep_dir = sweep.run_sweep(a.grid, root, resume=resume, ray_address=a.ray)
    except KeyboardInterrupt:
        last = resume or sweep.latest_sweep_dir(root, Path(a.grid))
        state = sweep.read_state(last) if last else {"cells": []}
        done = sum(c["status"] == "ok" for c in state["cells"])
        print(f"rlwb sweep: interrupted; {done} of {len(state['cells'])} cells archived in {last}. "
              f"Run the rest with: rlwb sweep {a.grid} --resume", file=sys.stderr)
        return 130
    state = sweep.read_state(sweep_dir)
    failed = [c for c in state["cells"] if c["status"] != "ok"]
    print(f"{len(state['cells']) - len(failed)} of {len(state['cells'])} cells ok; summary: "
          f"{sweep_dir / 'report.html'}", file=sys.stderr)
    print(sweep_dir)
    return 1 if failed else 0


def _cmd_sync_params(a) -> int:
    from rlwb.params.cells import sync

    changed = sync(write=not a.check)
    for path in changed:
        print(f"{'out of date' if a.check else 'wrote'}: {path}")
    if not changed:
        print("parameters cells and default.yaml files match the schemas")
    return 1 if (a.check and changed) else 0


def _cmd_bench(a) -> int:
    from rlwb.bench import throughput as bench
    from rlwb.paths import outputs_dir

    out = bench.run(outputs_dir(a.outputs), quick=a.quick)
    print((out / "bench.md").read_text())
    print(out)
    return 0


def _cmd_validate(a) -> int:

    from rlwb.core.models.store import resolve_model
    from rlwb.core.scoring import equivalence
    from rlwb.core.scoring.trainer import TrainerScorer
    from rlwb.engines import EngineWorker

    if not 0 <= a.min_pass_rate <= 1:
        raise ValueError(f"--min-pass-rate must be in [0, 1], got {a.min_pass_rate}")
    if a.cases < 1 or a.tolerance <= 0:
        raise ValueError(f"--cases must be >= 1 and --tolerance > 0, got {a.cases} and {a.tolerance}")
    path = resolve_model(a.model, progress=False)
    scorer = TrainerScorer(path, "float32")
    with EngineWorker(a.engine, path, dtype=a.dtype) as w:
        report = equivalence.validate(w, scorer, a.cases, a.seed, a.tolerance)
    if a.json:
        Path(a.json).write_text(json.dumps(report.to_dict(), indent=2))
    print(report.table())
    ok = report.pass_rate >= a.min_pass_rate
    print(f"{'PASS' if ok else 'FAIL'}: pass rate {report.pass_rate:.0%} (required {a.min_pass_rate:.0%})")
    return 0 if ok else 1


def _cmd_readme_check(a) -> int:
    from rlwb import readme_check
    from rlwb.paths import REPO_ROOT, outputs_dir

    readme = Path(a.readme) if a.readme else REPO_ROOT / "README.md"
    verdicts = readme_check.check(readme, outputs_dir(a.outputs))
    print(readme_check.report(verdicts, readme.name))
    return 1 if any(v.status == "mismatch" for v in verdicts) else 0


def run_options(r: argparse.ArgumentParser, param_help: str) -> None:
    """The options of every command that makes an archived notebook run (`run`, `audit`)."""
    r.add_argument("-f", "--file", action="append", help="params YAML (repeatable, later wins)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"), help=param_help)
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs)")
    r.add_argument("--log-output", action="store_true", help="stream the notebook's output to stderr")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlwb", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="execute a notebook with papermill and archive it")
    r.add_argument("notebook", help="path or stem, e.g. notebooks/01_logprob_mismatch.ipynb")
    run_options(r, "override one param; VALUE is YAML ('[0.6, 1.0]', '7', 'true')")
    r.set_defaults(fn=_cmd_run)

    r = sub.add_parser("audit", help="audit your own stack: your prompts, your engine (a preset or a server URL), "
                                     "your trainer (notebooks/10_audit.ipynb, archived)")
    r.add_argument("--model", help="embedded model, model directory or HF id (default: the notebook's, 'default')")
    r.add_argument("--prompts", help="JSONL or Parquet: prompt, messages or prompt_token_ids per row")
    r.add_argument("--engine", action="append", metavar="PRESET|URL",
                   help="an engine preset or an OpenAI-compatible server, http://host:port/v1 (repeatable)")
    r.add_argument("--served-model", help="the model name at the server (default: the one it serves)")
    r.add_argument("--trainer", default="hf", metavar="hf|CMD",
                   help="hf (rlwb's scorer) or a command behind the external-scorer contract (README), run from the "
                        "repository root")
    run_options(r, "any other parameter of notebooks/10_audit.ipynb (temperature, max_tokens, trainer_dtype, ...)")
    r.set_defaults(fn=_cmd_audit)

    r = sub.add_parser("rescore", help="re-score an archived run's rollouts with another trainer; a new archived "
                                       "run naming its source")
    r.add_argument("run_dir", help="an archived run with data/rollouts.parquet (notebooks 01, 06, 10)")
    r.add_argument("--trainer", default="hf", metavar="hf|CMD", help="hf (rlwb's scorer) or a scoring command")
    r.add_argument("--model", help="the model to score with (default: the source run's)")
    r.add_argument("-f", "--file", action="append", help="params YAML (repeatable, later wins)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"),
                   help="other parameters of notebooks/10_audit.ipynb (trainer_dtype, trainer_attn, worst_tokens)")
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs)")
    r.add_argument("--log-output", action="store_true", help="stream the notebook's output to stderr")
    r.set_defaults(fn=_cmd_rescore)

    r = sub.add_parser("runs", help="list archived runs")
    r.add_argument("--outputs")
    r.add_argument("--notebook", help="only this notebook stem")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=_cmd_runs)

    r = sub.add_parser("times", help="wall time per phase (engine start-up, sampling, scoring, training, ...) of "
                                     "the latest run of each notebook")
    r.add_argument("--outputs")
    r.add_argument("--since", help="only runs started at or after this UTC time (ISO, e.g. 2026-11-23T05:00)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=_cmd_times)

    r = sub.add_parser("figures", help="regenerate a run's figures from its data/ alone")
    r.add_argument("run_dir")
    r.add_argument("--style", choices=["notebook", "paper", "blog"], default="notebook",
                   help="notebook: overwrite figures/ as the notebook made them; paper/blog: figures/<style>/")
    r.set_defaults(fn=_cmd_figures)

    r = sub.add_parser("compare", help="compare the metrics of two runs (exit 1 on drift)")
    r.add_argument("run_a")
    r.add_argument("run_b")
    r.add_argument("--rtol", type=float, default=1e-6)
    r.add_argument("--atol", type=float, default=1e-9)
    r.add_argument("--include-timing", action="store_true", help="let timing metrics fail the comparison too")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=_cmd_compare)

    r = sub.add_parser("index", help="write <outputs>/index.html")
    r.add_argument("--outputs")
    r.set_defaults(fn=_cmd_index)

    r = sub.add_parser("rerun", help="rerun notebooks with their latest successful params and compare")
    r.add_argument("notebooks", nargs="*", help="stems (default: all notebooks)")
    r.add_argument("--outputs")
    r.add_argument("--compare-to", default="latest", metavar="latest|RUN_DIR",
                   help="latest (default): rerun each notebook's newest successful run and compare with it; RUN_DIR: "
                        "rerun that archived run (one notebook) and compare with it, e.g. a pinned reference")
    r.add_argument("--rtol", type=float, default=1e-6)
    r.add_argument("--atol", type=float, default=1e-9)
    r.set_defaults(fn=_cmd_rerun)

    r = sub.add_parser("bench", help="throughput and overhead ratios (outputs/bench/<time>/)")
    r.add_argument("--quick", action="store_true", help="fewer batch sizes and repeats (a few minutes)")
    r.add_argument("--outputs")
    r.set_defaults(fn=_cmd_bench)

    r = sub.add_parser("validate", help="property-based equivalence check of an engine against the fp32 trainer "
                                        "(exit 1 when the pass rate is below --min-pass-rate)")
    r.add_argument("--engine", required=True, help="engine preset (params/engines.yaml)")
    r.add_argument("--cases", type=int, default=50, help="random cases drawn by hypothesis (default 50)")
    r.add_argument("--seed", type=int, default=0, help="hypothesis seed: the same cases for every engine")
    r.add_argument("--tolerance", type=float, default=1e-3, help="max |Δlogp| per case (default 1e-3)")
    r.add_argument("--min-pass-rate", type=float, default=1.0, help="exit 1 below this pass rate (default 1)")
    r.add_argument("--model", default="default")
    r.add_argument("--dtype", default="float32", help="engine dtype")
    r.add_argument("--json", help="also write the report as JSON to this path")
    r.set_defaults(fn=_cmd_validate)

    r = sub.add_parser("build-model", help="install the shipped build of an embedded model (or build it from its "
                                           "recipe where none is shipped) into the cache and print its card")
    r.add_argument("--model", default="default", choices=EMBEDDED_NAMES,
                   help="which embedded model (default: the char-level default policy)")
    r.add_argument("--force", action="store_true", help="copy (or build) it again even if the cache has it")
    r.add_argument("--from-recipe", action="store_true",
                   help="train it from its recipe on this machine (beside the shipped build, which stays the model "
                        "every run uses) and compare its weights with the published build of this CPU vendor; exit 1 "
                        "when they differ")
    r.set_defaults(fn=_cmd_build_model)

    r = sub.add_parser("sweep", help="a grid of parameter overrides for one notebook, each cell an archived run, "
                                     "plus a summary (grid format: rlwb/sweep.py)")
    r.add_argument("grid", help="grid YAML, e.g. params/sweeps/k3_vs_temperature.yaml")
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs)")
    r.add_argument("--ray", metavar="ADDRESS", help="run the cells as Ray tasks on an existing cluster "
                                                    "(auto: the cluster this machine belongs to)")
    r.add_argument("--resume", nargs="?", const="latest", metavar="SWEEP_DIR",
                   help="run only the cells without a successful run (default: the newest sweep of this grid)")
    r.set_defaults(fn=_cmd_sweep)

    r = sub.add_parser("sync-params", help="write every notebook's parameters cell and params/<stem>/default.yaml "
                                           "from the schemas (rlwb/params/schemas.py)")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    r.set_defaults(fn=_cmd_sync_params)

    r = sub.add_parser("readme-check", help="recompute the README's quoted numbers from the archived runs it cites: "
                                            "match / mismatch / stale / missing (exit 1 on a mismatch)")
    r.add_argument("--readme", help="the Markdown file (default: the repository's README.md)")
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs)")
    r.set_defaults(fn=_cmd_readme_check)

    e = sub.add_parser("engines", help="engine workers").add_subparsers(dest="engines_cmd", required=True)
    c = e.add_parser("check", help="start each preset, sample at T=1 and T=0.7, compare with the fp32 trainer")
    c.add_argument("engines", nargs="*", help="presets (default: all in params/engines.yaml)")
    c.add_argument("--model", default="default")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_cmd_engines_check)
    u = e.add_parser("setup", help="make the environment of each preset as its `setup` says (idempotent)")
    u.add_argument("presets", nargs="+", help="presets (params/engines.yaml), e.g. vllm-v1-0.31")
    u.add_argument("--force", action="store_true", help="remake it even if its stamp is current")
    u.set_defaults(fn=_cmd_engines_setup)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ParamError, OSError, ValueError) as e:
        print(f"rlwb {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except SetupFailed as e:
        print(f"rlwb {args.cmd}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"rlwb {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
