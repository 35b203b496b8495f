"""Self-contained rollouts (rlwb/core/scoring/rollouts.py): the archived per-token table carries each completion's
prompt token ids and sampling settings, and `rollouts_from_frame` gives back what re-scoring needs."""

import numpy as np
import pandas as pd
import pytest

from rlwb.core.scoring.rollouts import Rollouts, rollouts_from_frame
from rlwb.engines.worker import Completion, Sampling


def _rollouts(engine: str, sampling: Sampling, seed: int) -> Rollouts:
    rng = np.random.default_rng(seed)
    comps, trainer = [], []
    for i in range(3):
        for j in range(sampling.n):
            L = int(rng.integers(1, 6))
            lp = -rng.exponential(1, L).astype(np.float32)
            comps.append(Completion(i, j, [1, 10 + i, 20 + i + j][: 2 + i % 2], list(rng.integers(4, 60, L)), lp, "",
                                    "stop"))
            trainer.append(lp.astype(np.float64) + rng.normal(0, 1e-3, L))
    return Rollouts(engine, sampling, comps, trainer)


def test_the_table_carries_prompts_and_sampling_settings():
    s = Sampling(temperature=0.7, top_p=0.9, top_k=5, max_tokens=8, seed=11, n=2)
    df = _rollouts("vllm-v1-fixed", s, 0).to_frame()
    for col in ("prompt_token_ids", "temperature", "top_p", "top_k", "max_tokens", "seed", "n", "ignore_eos"):
        assert col in df.columns, col
    first = df[df["request_id"] == 2].iloc[0]
    assert list(first["prompt_token_ids"]) == [1, 12] and first["seed"] == 11 + 2  # request i: seed + i
    assert (df["temperature"] == 0.7).all() and (df["top_k"] == 5).all()


def test_rollouts_come_back_from_the_table_per_engine_and_setting(tmp_path):
    a = _rollouts("vllm-v1-fixed", Sampling(temperature=0.7, max_tokens=8, seed=3, n=2), 1)
    b = _rollouts("vllm-v1-fixed", Sampling(temperature=1.0, max_tokens=8, seed=3), 2)
    c = _rollouts("hf", Sampling(temperature=0.7, max_tokens=8, seed=None), 3)
    table = pd.concat([a.to_frame(knob="base"), b.to_frame(knob="base"), c.to_frame(knob="base")], ignore_index=True)
    table.to_parquet(tmp_path / "rollouts.parquet", index=False)  # through the archive's format
    back = rollouts_from_frame(pd.read_parquet(tmp_path / "rollouts.parquet"))
    assert list(back) == ["vllm-v1-fixed/knob=base", "vllm-v1-fixed/knob=base/T=1,top_p=1,top_k=0", "hf/knob=base"]
    for original, got in zip((a, b, c), back.values()):
        assert got.sampling == original.sampling
        assert [(x.request_id, x.sample_index, x.prompt_token_ids, x.token_ids) for x in got.completions] == \
            [(x.request_id, x.sample_index, x.prompt_token_ids, [int(t) for t in x.token_ids])
             for x in original.completions]
        assert all(np.array_equal(x.logprobs, y.logprobs) for x, y in zip(got.completions, original.completions))
        assert all(np.array_equal(x, y) for x, y in zip(got.logp_trainer, original.logp_trainer))


def test_a_table_archived_before_rollouts_were_self_contained_is_refused_clearly():
    old = _rollouts("hf", Sampling(), 0).to_frame().drop(columns=["prompt_token_ids", "temperature", "seed"])
    with pytest.raises(ValueError, match="lacks prompt_token_ids, temperature, seed: it was archived before rollouts "
                                         "carried their prompts and sampling settings"):
        rollouts_from_frame(old)
