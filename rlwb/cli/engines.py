"""`rlwb engines check`, `engines setup`, `validate`, `build-model`: engines and embedded models."""

from __future__ import annotations

import json
import sys
from pathlib import Path


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


def cmd_build_model(a) -> int:
    from rlwb.core.models.published_builds import published_verdict
    from rlwb.core.models.store import build_embedded_model

    m = build_embedded_model(a.model, force=a.force, from_recipe=a.from_recipe)
    print(json.dumps(m.card, indent=2))
    verdict = published_verdict(m.card)
    print(f"weights checksum {m.card['weights_sha256_16']} ({verdict})")
    print(m.path)
    return 1 if a.from_recipe and verdict.startswith("DIFFERS") else 0
