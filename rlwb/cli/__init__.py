"""`rlwb` command line: run | audit | rescore | runs | figures | compare | index | rerun | publish | sweep | bench |
validate | build-model | engines check | sync-params | readme-check.

Exit codes: 0 success, 1 a run failed / a check did not pass, 2 bad input (params, paths, presets).
`rlwb run` prints the run directory as the last line of stdout, so scripts can `dir=$(rlwb run ... | tail -1)`.
"""

from __future__ import annotations

import argparse
import sys

from rlwb.cli import archived, drift, engines, listing, maintenance, publish, sweep
from rlwb.cli.archived import run_options
from rlwb.core.models.store import EMBEDDED_NAMES
from rlwb.errors import ParamError, SetupFailed
from rlwb.paths import REPO_ROOT


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlwb", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="execute a notebook with papermill and archive it")
    r.add_argument("notebook", help="path or stem, e.g. notebooks/01_logprob_mismatch.ipynb")
    run_options(r, "override one param; VALUE is YAML ('[0.6, 1.0]', '7', 'true')")
    r.add_argument("--resume-from", metavar="RUN_DIR",
                   help="notebook 08: reuse the finished jobs of this archived run of the same computation (refused "
                        "otherwise, before compute); a run option, not a param (not in params.yaml nor its hash)")
    r.set_defaults(fn=archived.cmd_run)

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
    r.set_defaults(fn=archived.cmd_audit)

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
    r.set_defaults(fn=archived.cmd_rescore)

    r = sub.add_parser("runs", help="list archived runs")
    r.add_argument("--outputs")
    r.add_argument("--notebook", help="only this notebook stem")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=listing.cmd_runs)

    r = sub.add_parser("times", help="wall time per phase (engine start-up, sampling, scoring, training, ...) of "
                                     "the latest run of each notebook")
    r.add_argument("--outputs")
    r.add_argument("--since", help="only runs started at or after this UTC time (ISO, e.g. 2026-11-23T05:00)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=listing.cmd_times)

    r = sub.add_parser("figures", help="regenerate a run's figures from its data/ alone")
    r.add_argument("run_dir")
    r.add_argument("--style", choices=["notebook", "paper", "blog"], default="notebook",
                   help="notebook: overwrite figures/ as the notebook made them; paper/blog: figures/<style>/")
    r.set_defaults(fn=drift.cmd_figures)

    r = sub.add_parser("compare", help="compare the metrics of two runs (exit 1 on drift)")
    r.add_argument("run_a")
    r.add_argument("run_b")
    r.add_argument("--rtol", type=float, default=1e-6)
    r.add_argument("--atol", type=float, default=1e-9)
    r.add_argument("--include-timing", action="store_true", help="let timing metrics fail the comparison too")
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=drift.cmd_compare)

    r = sub.add_parser("index", help="write <outputs>/index.html")
    r.add_argument("--outputs")
    r.set_defaults(fn=drift.cmd_index)

    r = sub.add_parser("rerun", help="rerun notebooks with their latest successful params and compare")
    r.add_argument("notebooks", nargs="*", help="stems (default: all notebooks)")
    r.add_argument("--outputs")
    r.add_argument("--compare-to", default="latest", metavar="latest|RUN_DIR",
                   help="latest (default): rerun each notebook's newest successful run and compare with it; RUN_DIR: "
                        "rerun that archived run (one notebook) and compare with it, e.g. a pinned reference")
    r.add_argument("--rtol", type=float, default=1e-6)
    r.add_argument("--atol", type=float, default=1e-9)
    r.set_defaults(fn=drift.cmd_rerun)

    r = sub.add_parser("publish", help="copy an archived run into the repository's runs of record (docs/runs/); "
                                       "refuses a failed run, a dirty tree, a model build without a published "
                                       "checksum, a run over 5 MB")
    r.add_argument("run_dir", help="an archived run, e.g. outputs/00_default_policy/20261125-221500-ab12cd34 or "
                                   "outputs/bench/20261126-090000")
    r.add_argument("--to", help="the runs-of-record folder (default: docs/runs)")
    r.set_defaults(fn=publish.cmd_publish)

    r = sub.add_parser("bench", help="throughput and overhead ratios, archived with a run's provenance "
                                     "(outputs/bench/<UTC start>/: publishable with `rlwb publish`)")
    r.add_argument("--quick", action="store_true", help="fewer batch sizes and repeats (a few minutes)")
    r.add_argument("--outputs")
    r.set_defaults(fn=maintenance.cmd_bench)

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
    r.set_defaults(fn=engines.cmd_validate)

    r = sub.add_parser("build-model", help="install the shipped build of an embedded model (or build it from its "
                                           "recipe where none is shipped) into the cache and print its card")
    r.add_argument("--model", default="default", choices=EMBEDDED_NAMES,
                   help="which embedded model (default: the char-level default policy)")
    r.add_argument("--force", action="store_true", help="copy (or build) it again even if the cache has it")
    r.add_argument("--from-recipe", action="store_true",
                   help="train it from its recipe on this machine (beside the shipped build, which stays the model "
                        "every run uses) and compare its weights with the published build of this CPU vendor; exit 1 "
                        "when they differ")
    r.set_defaults(fn=engines.cmd_build_model)

    r = sub.add_parser("sweep", help="a grid of parameter overrides for one notebook, each cell an archived run, "
                                     "plus a summary (grid format: rlwb/sweep.py)")
    r.add_argument("grid", help="grid YAML, e.g. params/sweeps/k3_vs_temperature.yaml")
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs)")
    r.add_argument("--ray", metavar="ADDRESS", help="run the cells as Ray tasks on an existing cluster "
                                                    "(auto: the cluster this machine belongs to)")
    r.add_argument("--resume", nargs="?", const="latest", metavar="SWEEP_DIR",
                   help="run only the cells without a successful run (default: the newest sweep of this grid)")
    r.set_defaults(fn=sweep.cmd_sweep)

    r = sub.add_parser("sync-params", help="write every notebook's parameters cell and params/<stem>/default.yaml "
                                           "from the schemas (rlwb/params/schemas/)")
    r.add_argument("--check", action="store_true", help="write nothing; exit 1 when a file is out of date")
    r.set_defaults(fn=maintenance.cmd_sync_params)

    r = sub.add_parser("readme-check", help="recompute README.md's and docs/'s quoted numbers from the runs they cite: "
                                            "match / mismatch / stale / missing (exit 1 on a mismatch)")
    r.add_argument("--readme", help="one Markdown file (default: the repository's README.md and every docs/**/*.md)")
    r.add_argument("--outputs", help="archive root (default: $RLWB_OUTPUTS or ./outputs; then docs/runs)")
    r.add_argument("--clean-clone", nargs="?", const=str(REPO_ROOT), metavar="REPO",
                   help="check a fresh git clone of REPO (default: this repository's committed HEAD) against its runs "
                        "of record alone; exit 1 unless every number matches")
    r.set_defaults(fn=maintenance.cmd_readme_check)

    e = sub.add_parser("engines", help="engine workers").add_subparsers(dest="engines_cmd", required=True)
    c = e.add_parser("check", help="start each preset, sample at T=1 and T=0.7, compare with the fp32 trainer")
    c.add_argument("engines", nargs="*", help="presets (default: all in params/engines.yaml)")
    c.add_argument("--model", default="default")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=engines.cmd_engines_check)
    u = e.add_parser("setup", help="make the environment of each preset as its `setup` says (idempotent)")
    u.add_argument("presets", nargs="+", help="presets (params/engines.yaml), e.g. vllm-v1-0.31")
    u.add_argument("--force", action="store_true", help="remake it even if its stamp is current")
    u.set_defaults(fn=engines.cmd_engines_setup)
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
