"""Memory-pressure and long-context checks (notebook 05) on real engines, and their argument checks."""

import numpy as np
import pytest

from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.prompts.generated import task_prompts
from rlwb.engines.worker import Sampling
from rlwb.experiments import equivalence_and_stress as stress
from rlwb.params.schemas.equivalence_and_stress import StressParams

FLOOR = 1e-4  # fp32 engine vs fp32 trainer: measured ~2e-5 at worst on this model


def test_pressure_kwargs_round_to_blocks_and_leave_a_block_free():
    kw = stress.pressure_kwargs(1024, 128, 4096)
    # vLLM V1 refuses a cache that cannot hold max_model_len plus one block (8 x 128 serve 896 tokens)
    assert kw == {"num_gpu_blocks_override": 8, "max_model_len": 896, "disable_log_stats": False}
    assert stress.pressure_kwargs(1000, 16, 4096)["num_gpu_blocks_override"] == 63  # rounded up
    assert stress.pressure_kwargs(1, 16, 4096)["num_gpu_blocks_override"] == 2
    assert stress.pressure_kwargs(10**6, 16, 4096)["max_model_len"] == 4096
    with pytest.raises(ValueError, match="kv_tokens"):
        stress.pressure_kwargs(0, 16, 4096)


def test_long_context_lengths_must_fit_the_context():
    p = StressParams(longctx_lengths=[16, 4090], longctx_max_tokens=16)
    with pytest.raises(ValueError, match=r"longctx_lengths \[4090\].*4096"):
        stress.check_lengths(p, 4096)
    stress.check_lengths(StressParams(), 4096)  # the defaults reach 4064 + 16 = 4080 positions


@pytest.mark.engines
@pytest.mark.parametrize("name", ["vllm-v0", "vllm-v1-fixed"])
def test_memory_pressure_preempts_and_logprobs_stay_at_the_float_floor(engine, scorer, default_model, name):
    """A 1024-token KV cache for 24 requests of up to ~360 tokens: the engine must preempt (counted from
    V0's scheduler / V1's Prometheus counter), and every logprob must still match the trainer."""
    prompts = task_prompts(24, 0, heterogeneous=True, codec=PromptCodec(default_model.path))
    s = Sampling(temperature=1.0, max_tokens=32, seed=0, ignore_eos=True)
    pr = stress.memory_pressure(engine(name), prompts, s, scorer, kv_tokens=1024, max_context=4096)
    m = pr.metrics
    assert m["pressure_preemptions"] >= 1, m
    assert m["pressure_abs_dlogp_max"] <= FLOOR and m["free_abs_dlogp_max"] <= FLOOR, m
    assert m["pressure_abs_dlogp_mean_ci_low"] <= m["pressure_abs_dlogp_mean"] <= m["pressure_abs_dlogp_mean_ci_high"]
    assert m["pressure_kv_tokens"] >= 1024 and 0 <= m["pressure_identical_frac"] <= 1
    assert set(pr.rows["case"]) == {"free", "pressure"}
    assert len(pr.rows) == 2 * 24 * 32  # ignore_eos: every request yields max_tokens positions
    if name == "vllm-v0":
        assert m["free_preemptions"] == 0  # V0 always counts: a full-size cache never preempts here


@pytest.mark.engines
def test_memory_pressure_refuses_a_cache_smaller_than_one_request(engine, scorer, default_model):
    prompts = task_prompts(4, 0, heterogeneous=True, codec=PromptCodec(default_model.path))
    with pytest.raises(ValueError, match="raise pressure_kv_tokens"):
        stress.memory_pressure(engine("vllm-v0"), prompts, Sampling(max_tokens=32), scorer, kv_tokens=32,
                               max_context=4096)


@pytest.mark.engines
def test_hf_engine_reports_no_preemption_counter(engine):
    assert engine("hf").stats() == {"preemptions": None}


@pytest.mark.engines
@pytest.mark.parametrize("name", ["hf", "vllm-v0", "vllm-v1-fixed"])
def test_long_context_reaches_the_end_of_the_context_at_the_float_floor(engine, scorer, default_model, name):
    s = Sampling(temperature=1.0, max_tokens=8, seed=0, ignore_eos=True)
    lc = stress.long_context(engine(name), scorer, [16, 4080], 1, s, PromptCodec(default_model.path))
    r = lc.rows
    assert sorted(r.groupby("prompt_len")["position"].min()) == [16, 4080]  # absolute positions
    assert r["position"].max() == 4087 == lc.metrics["longctx_max_position"]
    # the full distributions were compared (64-token vocabulary) and sit at the float floor everywhere
    assert r["dist_abs_dlogp_max"].notna().all()
    assert 0 < lc.metrics["longctx_dist_abs_dlogp_max"] <= FLOOR
    assert lc.metrics["longctx_abs_dlogp_max"] <= lc.metrics["longctx_dist_abs_dlogp_max"]  # sampled ⊂ vocabulary
    assert lc.metrics["longctx_max_far"] <= FLOOR


@pytest.mark.engines
def test_long_context_scores_raw_engines_in_their_own_semantics(engine, scorer, default_model):
    """vllm-v1 reports raw logprobs: at T = 0.7 the stress check compares them with the trainer's raw
    ones (the T gap is notebook 01's subject), and skips full distributions (they are processed)."""
    s = Sampling(temperature=0.7, max_tokens=8, seed=0, ignore_eos=True)
    lc = stress.long_context(engine("vllm-v1"), scorer, [64], 2, s, PromptCodec(default_model.path))
    assert lc.metrics["longctx_abs_dlogp_max"] <= FLOOR
    assert np.isnan(lc.metrics["longctx_dist_abs_dlogp_max"])
