"""An embedded checkpoint with sampling defaults in its `generation_config.json`, as hub instruct models ship.

Why: Qwen2.5-0.5B-Instruct's `generation_config.json` sets `do_sample`, `temperature`, `top_p`, `top_k` and
`repetition_penalty`. An engine that takes those as its defaults samples from another distribution than the one
rlwb asks for and the trainer scores: a reference `generate` with a repetition penalty the trainer never applies
is no reference. rlwb's own embedded models write no sampling fields, so no test could see such a leak. This
variant is the base model's directory, weights and tokenizer unchanged, with sampling defaults chosen so that an
engine applying any of them is far from the trainer (a 1.3 repetition penalty, top-k 5, top-p 0.8, T = 0.6,
`max_new_tokens` 4). Built deterministically from the base (a copy plus one JSON file), cached by recipe hash.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

# what a hub instruct checkpoint sets (Qwen2.5-0.5B-Instruct: do_sample, temperature 0.7, top_p 0.8, top_k 20,
# repetition_penalty 1.05), made stronger so that applying any one of them shows
SAMPLING_DEFAULTS = (("do_sample", True), ("temperature", 0.6), ("top_k", 5), ("top_p", 0.8),
                     ("repetition_penalty", 1.3), ("max_new_tokens", 4))


@dataclass(frozen=True)
class VariantRecipe:
    name: str = "default-sampling-defaults"  # the `model:` value that selects it
    base: str = "default"  # the embedded model it copies
    sampling: tuple = SAMPLING_DEFAULTS  # (field, value) pairs written into generation_config.json
    base_hash: str = ""  # the base recipe's hash on this machine (filled by `with_corpus`)
    version: int = 1

    def __post_init__(self):  # from JSON (the pinned build's child) the pairs arrive as lists
        object.__setattr__(self, "sampling", tuple((str(k), v) for k, v in self.sampling))

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]

    def with_corpus(self, base_hash: str) -> VariantRecipe:
        """Bound to the base's recipe hash (`models` passes it in, as for the MoE model)."""
        return replace(self, base_hash=base_hash)


def build(recipe: VariantRecipe, base, out: Path) -> tuple[object, dict]:
    """Copy the base embedded model (`base`: its `models.EmbeddedModel`) into `out` with the sampling defaults
    added to its generation_config.json; returns (model, card fields)."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlwb.core.data.tokenizer import uses_char_tokenizer

    t0 = time.time()
    for f in base.path.iterdir():
        if f.is_file() and f.name != "model.json":
            shutil.copy(f, out / f.name)
    gen = out / "generation_config.json"
    config = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**config, **dict(recipe.sampling)}, indent=2))
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    return model, {
        "name": f"rlwb-{recipe.name}",
        "architecture": f"{base.card.get('architecture', '?')}; generation_config.json with sampling defaults",
        "base_model": recipe.base, "base_recipe_hash": base.recipe_hash,
        "base_weights_sha256_16": base.card.get("weights_sha256_16"),
        "generation_config_sampling": dict(recipe.sampling),
        "tokenizer": "rlwb-char" if uses_char_tokenizer(base.card) else "hf",
        "build_s": round(time.time() - t0, 1),
    }
