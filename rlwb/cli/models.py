"""`rlwb build-model`: an embedded model installed into the cache (or built from its recipe) and its card."""

from __future__ import annotations

import json

from rlwb.core.models.store import EMBEDDED_NAMES


def add_build_model(sub) -> None:
    r = sub.add_parser("build-model", help="install the shipped build of an embedded model (or build it from its "
                                           "recipe where none is shipped) into the cache and print its card")
    r.add_argument("--model", default="default", choices=EMBEDDED_NAMES,
                   help="which embedded model (default: the char-level default policy)")
    r.add_argument("--force", action="store_true", help="copy (or build) it again even if the cache has it")
    r.add_argument("--from-recipe", action="store_true",
                   help="train it from its recipe on this machine (beside the shipped build, which stays the model "
                        "every run uses) and compare its weights with the published build of this CPU vendor; exit 1 "
                        "when they differ")
    r.set_defaults(fn=cmd_build_model)


def cmd_build_model(a) -> int:
    from rlwb.core.models.published_builds import published_verdict
    from rlwb.core.models.store import build_embedded_model

    m = build_embedded_model(a.model, force=a.force, from_recipe=a.from_recipe)
    print(json.dumps(m.card, indent=2))
    verdict = published_verdict(m.card)
    print(f"weights checksum {m.card['weights_sha256_16']} ({verdict})")
    print(m.path)
    return 1 if a.from_recipe and verdict.startswith("DIFFERS") else 0
