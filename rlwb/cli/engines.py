"""`rlwb engines check`, `rlwb engines setup`, `rlwb validate`: engine presets, their environments, and their
logprobs held to the trainer's."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def add_validate(sub) -> None:
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
    r.set_defaults(fn=cmd_validate)


def add_engines(sub) -> None:
    e = sub.add_parser("engines", help="engine workers").add_subparsers(dest="engines_cmd", required=True)
    c = e.add_parser("check", help="start each preset, sample at T=1 and T=0.7, compare with the fp32 trainer")
    c.add_argument("engines", nargs="*", help="presets (default: all in params/engines.yaml)")
    c.add_argument("--model", default="default")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_engines_check)
    u = e.add_parser("setup", help="make the environment of each preset as its `setup` says (idempotent)")
    u.add_argument("presets", nargs="+", help="presets (params/engines.yaml), e.g. vllm-v1-0.31")
    u.add_argument("--force", action="store_true", help="remake it even if its stamp is current")
    u.set_defaults(fn=cmd_engines_setup)


def cmd_engines_check(a) -> int:
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


def cmd_engines_setup(a) -> int:
    from rlwb.engines.setup import setup_preset

    for name in a.presets:
        print(setup_preset(name, force=a.force, log=lambda m: print(m, file=sys.stderr)))
    return 0


def cmd_validate(a) -> int:
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
