"""`rlwb` command line: run | audit | rescore | runs | figures | compare | index | rerun | publish | sweep | bench |
validate | build-model | engines check | engines setup | sync-params | readme-check | times (the first line is
`rlwb --help`'s description; each command's parser and handler live in the module that `COMMANDS` names it from).

Exit codes: 0 success, 1 a run failed / a check did not pass, 2 bad input (params, paths, presets).
`rlwb run` prints the run directory as the last line of stdout, so scripts can `dir=$(rlwb run ... | tail -1)`.
"""

from __future__ import annotations

import argparse
import sys

from rlwb.cli import bench, drift, engines, figures, listing, maintenance, models, publish, run, sweep
from rlwb.errors import ParamError, SetupFailed

# each command's parser beside its handler, in its module; this order is `rlwb --help`'s
COMMANDS = (run.add_run, run.add_audit, run.add_rescore, listing.add_runs, listing.add_times, figures.add_figures,
            drift.add_compare, listing.add_index, drift.add_rerun, publish.add_publish, bench.add_bench,
            engines.add_validate, models.add_build_model, sweep.add_sweep, maintenance.add_sync_params,
            maintenance.add_readme_check, engines.add_engines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlwb", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for add in COMMANDS:
        add(sub)
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
