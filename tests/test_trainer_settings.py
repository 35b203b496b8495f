"""Trainer settings (notebook 09): every setting measured for real on CPU at small sizes against the float64
reference, the reference's own control (bitwise across batch sizes), bad settings refused before any compute, and
the random-init model with Qwen2.5-0.5B's published shapes."""

import json
from dataclasses import replace

import numpy as np
import pytest

from rlwb.core.scoring import trainer_choices as TS
from rlwb.core.scoring.trainer import apply_setting
from tests.conftest import rlwb


def test_setting_names_become_records():
    s = TS.parse_setting("bf16+fp32-head")
    assert (s.dtype, s.fp32_head, s.attn, s.batch, s.grad) == ("bfloat16", True, "sdpa", 0, False)
    s = TS.parse_setting("mb4+grad+checkpointing")
    assert (s.batch, s.grad, s.checkpointing) == (4, True, True)
    assert TS.parse_setting("fp32") == TS.TrainerSetting()  # rlwb's scorer as it is
    assert TS.parse_setting("mb4+grad").old_pass() == TS.TrainerSetting()  # the update's old logprobs: the scorer
    assert TS.parse_setting("left-pad+bf16").batch1() == TS.parse_setting("bf16+batch1")
    assert "dtype=bfloat16, fp32_head=True" in TS.parse_setting("bf16+fp32-head").changes()


@pytest.mark.parametrize("name, why", [
    ("bf17", "unknown trainer setting entry 'bf17'"),
    ("bf16+fp16", "'bf16' and 'fp16' both set dtype"),
    ("bf16+bf16", "lists an entry twice"),
    ("bf16++eager", "an empty entry"),
    ("fp32-head", "an fp32 head over float32 weights without autocast changes nothing"),
    ("bf16-autocast+bf16", "autocast runs over fp32 weights"),
    ("left-pad+packed", "packed and left padding exclude each other"),
    ("batch1+left-pad", "one sequence per forward has nothing to pack or pad"),
    ("mb0", "unknown trainer setting entry 'mb0'"),
])
def test_bad_settings_are_refused_with_the_reason(name, why):
    with pytest.raises(ValueError, match=why):
        TS.parse_setting(name)


def test_a_bad_setting_stops_the_run_before_any_compute(tmp_path):
    r = rlwb("run", "notebooks/09_trainer_settings.ipynb", "-p", "settings", "[bf16, bf16+fp16]", "--outputs",
             str(tmp_path), timeout=120)
    assert r.returncode == 2 and "parameter 'settings[1]'" in r.stderr and "both set dtype" in r.stderr
    assert not any(tmp_path.rglob("run.json"))  # refused before a run directory was made


@pytest.fixture(scope="module")
def setup(default_model):
    """The default model's fp32 weights, 12 sequences (task and open-ended prompts, completions of mixed lengths
    drawn from the vocabulary: any tokens score) and their float64 reference."""
    from rlwb import params
    from rlwb.core.data.tokenizer import PromptCodec
    from rlwb.core.prompts.generated import make_prompts
    from rlwb.core.scoring.trainer import TrainerScorer
    from rlwb.experiments.trainer_settings import Sequences, reference

    codec = PromptCodec(default_model.path)
    prompts = make_prompts("task", 6, 0, codec) + make_prompts("open_ended", 6, 0, codec)
    rng = np.random.default_rng(0)
    comps = [rng.integers(3, 64, int(rng.integers(4, 24))).tolist() for _ in prompts]
    seq = Sequences(prompts, comps, ["task"] * 6 + ["open_ended"] * 6)
    p = params.load("09_trainer_settings", overrides={"batch_size": 64})
    master = TrainerScorer(default_model.path, "float32").model
    return master, seq, reference(master, seq, p), p


def test_float64_reference_agrees_with_itself_across_batch_sizes(setup):
    """The control: float64 in one batch of 12 (right-padded), in micro-batches of 5 and one sequence at a time
    agree to float64's rounding (its batched kernels need not be bitwise the per-sequence ones), so the per-sequence
    reference is a fixed point for every setting to ~1e-12 here, a million times below fp32's floor (on the H100 at
    Qwen2.5-0.5B's shapes 2.0e-07: rare flips of transformers' fp32 norm roundings, the test below); and its
    log-softmax is taken in float64 (an fp32 log-softmax would round it to fp32's steps, ~1e-7 at these |logp|)."""
    master, seq, ref, p = setup
    applied = apply_setting(master, TS.parse_setting("fp64"))
    for batch in (12, 5):
        got = applied.score(seq.prompt_ids, seq.completion_ids, p.temperature, batch_size=batch)
        assert max(float(np.max(np.abs(a - b))) for a, b in zip(got, ref)) < F64_TOL, batch
    # not fp32-rounded: nearly every reference logprob is not an fp32 number (an fp32 log-softmax makes every one
    # exactly one; a float64 one is an fp32 number only by chance, or at logp 0)
    flat = np.concatenate(ref)
    assert np.mean(flat.astype(np.float32).astype(np.float64) != flat) > 0.9
    # and fp32, on the same sequences, is neither bitwise batch-invariant here nor within float64's tolerance of
    # the reference (what makes the control necessary, and the tolerance tight enough to tell them apart)
    fp32 = apply_setting(master, TS.TrainerSetting())
    full, alone = (fp32.score(seq.prompt_ids, seq.completion_ids, p.temperature, batch_size=b) for b in (12, 1))
    assert not all(np.array_equal(a, b) for a, b in zip(full, alone))
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(alone, ref)) > 100 * F64_TOL


def test_transformers_qwen2_norm_rounds_a_float64_model_to_fp32():
    """Why the float64 reference is not fully float64 (docs/gpu.md: the H100's `fp64` row, 2.0e-07): transformers'
    Qwen2RMSNorm normalises in fp32 whatever the model's dtype, so with a unit weight its float64 output holds only
    fp32 values. If transformers keeps the dtype one day, this fails and the reference's floor needs measuring again."""
    import torch
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    norm = Qwen2RMSNorm(64).double()
    x = torch.randn(4, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = norm(x)
    assert out.dtype == torch.float64
    assert torch.equal(out, out.float().double())  # every value an fp32 number
    exact = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    assert not torch.equal(out, exact) and float((out - exact).abs().max()) < 1e-6  # fp32's rounding, not float64's


F64_TOL = 1e-12  # float64's rounding through a small model's forward: ~1e-15 relative, a few thousand ops deep


FLOOR = 1e-4  # fp32 against float64: float rounding only


def test_the_fp32_head_changes_what_a_bf16_trainer_scores(setup):
    """`bf16+fp32-head` must compute something else than `bf16`: the head in fp32 from the master weights, so its
    logprobs differ from the all-bf16 ones (a head that did nothing would pass the float64 test above)."""
    master, seq, _ref, p = setup
    bf16, head = (apply_setting(master, TS.parse_setting(n)).score(seq.prompt_ids, seq.completion_ids, p.temperature,
                                                                     batch_size=p.batch_size)
                  for n in ("bf16", "bf16+fp32-head"))
    assert not all(np.array_equal(a, b) for a, b in zip(bf16, head))
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(bf16, head)) > 1e-4  # bf16 rounding, not fp32 noise


@pytest.mark.parametrize("name", ["fp32", "batch1", "left-pad", "packed", "eager", "mb4+grad",
                                  "mb4+grad+checkpointing", "bf16", "bf16+fp32-head", "bf16-autocast", "fp16",
                                  "fp16-autocast", "flex", "compile"])
def test_every_setting_is_measured_against_float64(setup, name):
    from rlwb.experiments.trainer_settings import measure_setting

    master, seq, ref, p = setup
    s = TS.parse_setting(name)
    m, logp = measure_setting(master, s, seq, ref, p)
    sixteen = s.dtype != "float32" or s.autocast
    if sixteen:  # 16-bit numerics leave the float floor, and stay sane
        assert FLOOR < m["abs_dlogp_max"] < 5 and m["k3_mean"] > 1e-10
    else:  # fp32 computations sit at the float floor, but are not the float64 reference itself
        assert 0 < m["abs_dlogp_max"] <= FLOOR and m["k3_mean"] < 1e-9
    assert m["k3_mean_ci_low"] <= m["k3_mean"] <= m["k3_mean_ci_high"]
    assert {"task/k3_mean", "open_ended/k3_mean"} <= set(m) and m["per_1k_tokens_ms"] > 0
    assert ("batch1_identical_frac" in m) == (s.batch != 1)  # batch 1 is its own twin: nothing to compare
    assert ("ppo_ratio_abs_log_max" in m) == s.grad
    if s.grad:
        assert 0 <= m["ppo_ratio_identical_frac"] <= 1 and m["ppo_ratio_abs_log_max"] <= FLOOR
    if s.checkpointing:  # checkpointing recomputes in backward; the forward it returns is the same as without
        plain = apply_setting(master, replace(s, checkpointing=False)).score(
            seq.prompt_ids, seq.completion_ids, p.temperature, batch_size=p.batch_size)
        assert all(np.array_equal(a, b) for a, b in zip(logp, plain))


def test_a_setting_that_cannot_run_here_raises_the_library_error(setup):
    """FlashAttention 2 without its package: transformers' own ImportError, which the notebook shows as the row."""
    from rlwb.experiments.trainer_settings import library_error

    master, *_ = setup
    with pytest.raises(ImportError) as e:
        apply_setting(master, TS.parse_setting("flash2"))
    assert library_error(e.value).startswith("ImportError: FlashAttention2")


def test_random_init_model_has_the_published_shapes_and_its_seed_decides_its_weights(tmp_path):
    from rlwb import memory_plan as mp
    from rlwb.core.models import random_init as RM
    from rlwb.core.models.pinned_build import weights_hash
    from rlwb.core.models.store import EMBEDDED_RECIPES

    recipe = EMBEDDED_RECIPES["qwen2.5-0.5b-random"]
    assert mp.ModelShape.from_config(recipe.config).params() == 494_032_768  # Qwen2.5-0.5B's published count
    small = {**RM.QWEN25_05B, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 8256}
    r = replace(recipe, name="qwen2-random-test", config_json=json.dumps(small, sort_keys=True))
    sums = []
    for i, seed in enumerate((0, 0, 1)):
        m, card = RM.build(replace(r, seed=seed), tmp_path / str(i), progress=False)
        sums.append(weights_hash(m))
    assert sums[0] == sums[1] != sums[2]
    cfg = json.loads((tmp_path / "0" / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_key_value_heads"], cfg["tie_word_embeddings"], cfg["rope_theta"]) == \
        (64, 2, True, 1e6)
    assert (tmp_path / "0" / "tokenizer.json").exists() and "random weights" in card["architecture"]


def test_engine_knobs_of_a_notebook_06_run_join_the_ranking(tmp_path):
    """The ranking reads a notebook 06 run from its archive files (what `rlwb run` writes: run.json, params.yaml,
    metrics.json, data/status.parquet); knobs that did not run stay out, and another model is said."""
    import pandas as pd
    import yaml

    from rlwb import params
    from rlwb.experiments import trainer_settings as E
    from rlwb.experiments.wording import trainer_settings as W09

    d = tmp_path / "06_engine_knobs" / "20261125-000000-abcdef12"
    (d / "data").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": d.name}))
    (d / "params.yaml").write_text(yaml.safe_dump({"model": "qwen2-chat", "baseline": "vllm-v1-fixed",
                                                   "prompt_source": "open_ended"}))
    (d / "metrics.json").write_text(json.dumps({"baseline/k3_mean": 2e-13, "kv-fp8/k3_mean": 1.2e-3,
                                                "kv-fp8/k3_mean_ci_low": 8e-4, "kv-fp8/k3_mean_ci_high": 2e-3}))
    pd.DataFrame({"section": ["knob"] * 3, "knob": ["baseline", "kv-fp8", "tp2-ray"],
                  "status": ["ok", "ok", "unsupported here"]}).to_parquet(d / "data" / "status.parquet")
    p = params.load("09_trainer_settings", overrides={"compare_run": str(d)})
    run, rows = E.engine_knobs_run(p)
    assert run["run_id"] == d.name and [r["name"] for r in rows] == ["vllm-v1-fixed", "vllm-v1-fixed@kv-fp8"]
    status = pd.DataFrame([{"section": "setting", "setting": "bf16", "status": "ok"}])
    mets = {"bf16/k3_mean": 1e-4, "bf16/k3_mean_ci_low": 5e-5, "bf16/k3_mean_ci_high": 2e-4}
    r = E.ranking(mets, status, pd.DataFrame(), rows)
    assert list(r["name"]) == ["vllm-v1-fixed@kv-fp8", "bf16", "vllm-v1-fixed"]
    text = " ".join(W09.ranking_lines(**E.ranking_verdict(r, run, p)))
    assert "another model than this run's `default`" in text and "the engine's side contributes more" in text
    none, _ = E.engine_knobs_run(params.load("09_trainer_settings", overrides={"compare_run": str(tmp_path / "x")}))
    assert "run 06_engine_knobs first" in none["note"]
