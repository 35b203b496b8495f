"""`rlwb run`, `rlwb audit`, `rlwb rescore`: the commands that make one archived notebook run."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlwb.errors import ParamError, RunFailed
from rlwb.params import parse_override


def add_run(sub) -> None:
    r = sub.add_parser("run", help="execute a notebook with papermill and archive it")
    r.add_argument("notebook", help="path or stem, e.g. notebooks/01_logprob_mismatch.ipynb")
    run_options(r, "override one param; VALUE is YAML ('[0.6, 1.0]', '7', 'true')")
    r.add_argument("--resume-from", metavar="RUN_DIR",
                   help="notebooks 03, 07, 08: reuse the finished jobs of this archived run of the same computation "
                        "(the same params, commit with a clean tree, Python, packages, CPU model and instruction set, "
                        "GPU, model build and engine versions; refused otherwise, naming each difference, before "
                        "compute); a run option, not a param (not in params.yaml nor its hash)")
    r.add_argument("--reanalyze", metavar="RUN_DIR",
                   help="notebook 08: a new run that trains nothing and redoes the analysis of this finished run "
                        "from its data, with today's code (its params, which -f/-p may not change; the record names "
                        "both commits): a fixed analysis as a run of record of the same data")
    r.set_defaults(fn=cmd_run)


def add_audit(sub) -> None:
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
    r.set_defaults(fn=cmd_audit)


def add_rescore(sub) -> None:
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
    r.set_defaults(fn=cmd_rescore)


def run_options(r: argparse.ArgumentParser, param_help: str) -> None:
    """The options of every command that makes an archived notebook run (`run`, `audit`)."""
    r.add_argument("-f", "--file", action="append", help="params YAML (repeatable, later wins)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"), help=param_help)
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs)")
    r.add_argument("--log-output", action="store_true", help="stream the notebook's output to stderr")


def _archived_run(notebook: str, a, overrides: dict, cmd: str) -> int:
    """One archived run (`rlwb run`, `audit`, `rescore`): the run directory is the last line of stdout, a failed
    run's too (it is archived as failed), with its error on stderr and exit 1."""
    from rlwb import runner

    try:
        run_dir = runner.run(notebook, a.file or [], overrides, a.outputs, log_output=a.log_output,
                             resume_from=getattr(a, "resume_from", None), reanalyze=getattr(a, "reanalyze", None))
    except RunFailed as e:
        print(f"rlwb {cmd}: {e.error}", file=sys.stderr)
        print(e.run_dir)
        return 1
    print(run_dir)
    return 0


def cmd_run(a) -> int:
    return _archived_run(a.notebook, a, {key: parse_override(key, value) for key, value in a.param or []}, "run")


def _run_audit(a, overrides: dict) -> int:
    """`rlwb run notebooks/10_audit.ipynb` with the audit's overrides on top of `-f`/`-p` (a flag such as --model
    wins over `-p model`): archived and reported like every notebook."""
    for key, value in a.param or []:
        overrides.setdefault(key, parse_override(key, value))
    return _archived_run("10_audit", a, overrides, a.cmd)


def cmd_audit(a) -> int:
    """Paths a user types are relative to where they type them; the notebook's kernel runs elsewhere."""
    overrides = {"trainer": a.trainer}
    if a.model:
        overrides["model"] = a.model if not Path(a.model).exists() else str(Path(a.model).resolve())
    if a.prompts:  # a file of the repository is recorded as the repository names it (the same in any checkout)
        from rlwb.paths import shown

        overrides["prompts_file"] = shown(Path(a.prompts).expanduser().resolve())
    if a.engine:
        overrides["engines"] = a.engine
    if a.served_model:
        overrides["served_model"] = a.served_model
    return _run_audit(a, overrides)


def cmd_rescore(a) -> int:
    import yaml

    src = Path(a.run_dir).expanduser().resolve()
    if not (src / "params.yaml").is_file():
        raise ParamError(f"{a.run_dir}: not an archived run (no params.yaml)")
    model = a.model or (yaml.safe_load((src / "params.yaml").read_text()) or {}).get("model", "default")
    return _run_audit(a, {"rollouts_from": str(src), "prompts_file": "", "engines": [], "trainer": a.trainer,
                          "model": model})
