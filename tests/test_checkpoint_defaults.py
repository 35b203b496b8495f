"""A checkpoint's generation_config.json must not change the reference (issue #38).

`default-sampling-defaults` is the default policy with a hub instruct checkpoint's sampling fields in its
generation_config.json (repetition_penalty 1.3, top_k 5, top_p 0.8, temperature 0.6, do_sample, max_new_tokens 4:
`rlwb/core/models/sampling_defaults_variant.py`). Every engine and the trainer must sample and score exactly what rlwb
asks: real engines, on both checkpoints, the same prompts and seeds."""

import numpy as np
import pytest

from rlwb.core.scoring.rollouts import sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines import EngineWorker, Sampling

pytestmark = pytest.mark.engines
FLOOR = 1e-4
# T = 1 and no truncation: any checkpoint default that leaked (penalty, top-k, top-p, temperature) moves the logprobs
SAMPLING = Sampling(temperature=1.0, max_tokens=16, seed=0)


@pytest.fixture(scope="module")
def hub_like():
    from rlwb.core.models.store import build_embedded_model

    return build_embedded_model("default-sampling-defaults", progress=False)


def test_the_variant_is_the_default_policy_with_sampling_defaults(hub_like, default_model):
    import json

    gen = json.loads((hub_like.path / "generation_config.json").read_text())
    assert {k: gen[k] for k in ("repetition_penalty", "top_k", "top_p", "temperature", "do_sample")} == \
        {"repetition_penalty": 1.3, "top_k": 5, "top_p": 0.8, "temperature": 0.6, "do_sample": True}
    assert hub_like.card["weights_sha256_16"] == default_model.card["weights_sha256_16"]
    assert (hub_like.path / "model.safetensors").read_bytes() == (default_model.path / "model.safetensors").read_bytes()


def test_the_trainer_scores_the_same_on_both_checkpoints(hub_like, default_model, prompts):
    comps = [[13, 4, 20, 13, 44]] * len(prompts)  # a fixed completion after each prompt
    a = TrainerScorer(default_model.path).score(prompts, comps, temperature=0.7, raw=True)
    b = TrainerScorer(hub_like.path).score(prompts, comps, temperature=0.7, raw=True)
    for k in ("logp", "logp_raw"):
        assert all(np.array_equal(x, y) for x, y in zip(a[k], b[k])), k


@pytest.mark.parametrize("name", ["hf", "vllm-v0", "vllm-v1-fixed"])
def test_every_engine_ignores_the_checkpoints_sampling_defaults(name, hub_like, engine, prompts):
    """At the float floor against the fp32 trainer on the hub-like checkpoint, and the same tokens as the same
    preset on the clean checkpoint with the same seeds (each of these engines seeds per request). Before the fix the
    hf reference sampled with the checkpoint's repetition penalty (measured: see the commit)."""
    trainer = TrainerScorer(hub_like.path)
    with EngineWorker(name, hub_like.path) as w:
        info = w.info()
        ro = sample_and_score(w, trainer, prompts, SAMPLING)
    e, t = ro.flat()
    assert float(np.max(np.abs(e - t))) <= FLOOR
    assert sum(len(c.token_ids) for c in ro.completions) > 8 * 4  # max_new_tokens 4 did not cut completions
    clean = engine(name).generate(prompts, SAMPLING)
    assert [c.token_ids for c in ro.completions] == [c.token_ids for c in clean]
    settings = info["settings"]
    if name == "hf":  # it saw the defaults and reports them as ignored
        assert settings["checkpoint_sampling_defaults"]["repetition_penalty"] == 1.3
        assert settings["generation_config"] == "ignored (neutral)"
    else:  # vLLM read back: no default sampling parameters from the checkpoint
        assert settings["generation_config"] == "vllm" and settings["default_sampling_params"] == {}
