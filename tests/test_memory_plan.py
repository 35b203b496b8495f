"""The GPU memory plan's arithmetic for real model shapes on real GPU sizes (runs on CPU: pure arithmetic)."""

from pathlib import Path

import pytest

from rlwb import memory_plan as mp
from rlwb.registry import NOTEBOOKS as RECORDS

REPO = Path(__file__).resolve().parent.parent

GiB = mp.GiB
# Qwen2.5 configs as published (config.json of each checkpoint)
QWEN = {
    "0.5B": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True),
    "1.5B": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True),
    "7B": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, max_position_embeddings=32768, tie_word_embeddings=False),
}


@pytest.mark.parametrize("name, published", [("0.5B", 494_032_768), ("1.5B", 1_543_714_304), ("7B", 7_615_616_512)])
def test_parameter_count_matches_the_published_models(name, published):
    assert mp.ModelShape.from_config(QWEN[name]).params() == pytest.approx(published, rel=0.002)


def test_kv_cache_bytes_per_token():
    # 0.5B: 24 layers x 2 (K, V) x 2 KV heads x 64 dims x 2 bytes
    assert mp.ModelShape.from_config(QWEN["0.5B"]).kv_bytes_per_token("bfloat16") == 24 * 2 * 2 * 64 * 2


# Which notebook's gpu.yaml fits which GPU, from the plan's arithmetic (module docstring), whose trainer
# estimates were checked against torch's measured peaks on an H100 (scripts/gpu_memory_check.py, 2026-11-22,
# measured vs planned GiB: GRPO micro-batch 4 x 768 tokens, 0.5B 24.1 vs 27.0, 1.5B 52.6 vs 53.1; micro-batch
# 8: 36.0 vs 43.8, 73.2 vs 74.5; fp32 scoring of 64 x 768 tokens 8.6 vs 13.8, 14.5 vs 20.5; one 16,448-token
# context 35.4 vs 38.1, 35.6 vs 39.0). Notebook 05's fp32 scorer takes one 16k-token context at a time: its
# attention scores alone are ~28 GiB, so only an 80 GiB GPU holds it beside two engines.
NOTEBOOKS = ["01_logprob_mismatch", "02_kl_vs_temperature", "03_toy_grpo", "04_determinism_and_staleness",
             "05_equivalence_and_stress", "07_which_correction", "09_trainer_settings"]
FITS = {
    ("0.5B", 24): {"01_logprob_mismatch", "02_kl_vs_temperature"},
    ("0.5B", 40): set(NOTEBOOKS) - {"05_equivalence_and_stress"},
    ("0.5B", 80): set(NOTEBOOKS),
    ("1.5B", 24): set(),  # 6 GiB of fp32 scorer weights + 64 x 512-token batches beside a 32k-context engine
    ("1.5B", 40): {"01_logprob_mismatch", "02_kl_vs_temperature"},
    ("1.5B", 80): set(NOTEBOOKS),
    ("7B", 24): set(),
    ("7B", 40): set(),  # 28 GiB of fp32 scorer weights + 14 GiB of bf16 engine weights
    ("7B", 80): {"01_logprob_mismatch", "02_kl_vs_temperature"},  # 7B GRPO: 142 GiB of fp32 AdamW state alone
}


@pytest.mark.parametrize("model, gb", sorted(FITS))
def test_plans_for_qwen_shapes_on_24_40_80_gb(model, gb):
    """Each notebook's gpu.yaml, as `rlwb run` would plan it, for Qwen2.5 shapes on 24, 40 and 80 GiB GPUs."""
    from rlwb import params

    shape = mp.ModelShape.from_config(QWEN[model])
    for nb in NOTEBOOKS:
        p = params.load(nb, [REPO / "params" / nb / "gpu.yaml"])
        seqs, seq_len = mp.forward_size(p, shape.max_position_embeddings)
        runs = getattr(p, "concurrent_runs", 1)
        if nb in FITS[(model, gb)]:
            plan = mp.plan(nb, RECORDS[nb].needs, shape, gb * GiB, p.dtype, seqs=seqs, seq_len=seq_len, runs=runs)
            # the pieces add up within the GPU, and each engine can hold what it must
            assert plan.trainer_gib + plan.engines_at_once * plan.engine_gib <= 0.95 * gb + 0.03  # (0.01 GiB rounding)
            assert plan.engine_gib >= plan.engine_min_gib and plan.kv_cache_gib > 0
            assert 0 < plan.gpu_memory_utilization < 0.9  # never vLLM's default 0.9 beside a trainer
            if nb.startswith("05"):
                assert plan.engines_at_once == 2 and plan.gpu_memory_utilization < 0.48
        else:
            with pytest.raises(mp.MemoryPlanError, match=rf"{nb} needs ~[\d.]+ GiB .* of this {gb} GiB GPU"):
                mp.plan(nb, RECORDS[nb].needs, shape, gb * GiB, p.dtype, seqs=seqs, seq_len=seq_len, runs=runs)


def test_forward_sizes_follow_the_params():
    from rlwb import params

    grpo = params.load("03_toy_grpo", [REPO / "params" / "03_toy_grpo" / "gpu.yaml"])
    assert mp.forward_size(grpo, 32768) == (grpo.micro_batch, grpo.max_tokens + mp.PROMPT_ALLOWANCE)
    stale = params.load("04_determinism_and_staleness", [REPO / "params" / "04_determinism_and_staleness" / "gpu.yaml"])
    assert mp.forward_size(stale, 32768)[1] == 2048 + 128 + mp.PROMPT_ALLOWANCE
    stress = params.load("05_equivalence_and_stress")  # CPU default: validator cases up to the whole context
    assert mp.forward_size(stress, 4096) == (1, 4096)


GRPO_NEEDS = RECORDS["03_toy_grpo"].needs


def test_grpo_plan_counts_adamw_state_and_activations():
    """notebook 03's gpu.yaml: 32 prompts x 8 completions x (512 + 256 prompt) tokens per step."""
    shape = mp.ModelShape.from_config(QWEN["0.5B"])
    n = shape.params()
    small = mp.plan("03_toy_grpo", GRPO_NEEDS, shape, 40 * GiB, "bfloat16", seqs=4, seq_len=768)  # micro_batch 4
    medium = mp.plan("03_toy_grpo", GRPO_NEEDS, shape, 80 * GiB, "bfloat16", seqs=8, seq_len=768)
    assert small.trainer_gib * GiB >= 20 * n  # weights + grads + 2 Adam moments + initial copy, fp32
    assert medium.trainer_gib > small.trainer_gib + 10  # twice the micro-batch's activations and logits
    with pytest.raises(mp.MemoryPlanError, match="use a smaller micro_batch"):  # the whole step in one pass
        mp.plan("03_toy_grpo", GRPO_NEEDS, shape, 80 * GiB, "bfloat16", seqs=256, seq_len=768)
    # two runs at once (concurrent_runs=2): a second trainer copy in the same process and a second engine
    two = mp.plan("03_toy_grpo", GRPO_NEEDS, shape, 80 * GiB, "bfloat16", seqs=4, seq_len=768, runs=2)
    assert two.engines_at_once == 2 * small.engines_at_once
    assert two.trainer_gib == pytest.approx(2 * small.trainer_gib - mp.PROCESS_OVERHEAD / GiB, abs=0.02)
    with pytest.raises(mp.MemoryPlanError, match="concurrent_runs=1"):  # fits alone on 40 GiB, not twice
        mp.plan("03_toy_grpo", GRPO_NEEDS, shape, 40 * GiB, "bfloat16", seqs=4, seq_len=768, runs=2)


def test_grpo_plan_covers_the_old_logprob_pass_of_a_micro_batched_step():
    """Before a micro-batched update GRPO scores the whole step's batch with no grad (`trainer.batch_logprobs`, in
    the scorer's slices of up to SCORE_BATCH sequences). The plan holds the larger of that pass and the update's."""
    from rlwb.core.scoring.trainer import SCORE_BATCH

    shape = mp.ModelShape.from_config(QWEN["0.5B"])
    n, seq_len = shape.params(), 768
    state = 20 * n  # AdamW's weights, grads, moments and the initial copy, fp32
    old_pass = mp.scoring_transient(shape, SCORE_BATCH, seq_len)
    one = mp.trainer_bytes(shape, "train", 1, seq_len)  # micro_batch 1: the old-logprob pass is the larger
    assert one == int(mp.MARGIN * (state + old_pass)) + mp.PROCESS_OVERHEAD
    four = mp.trainer_bytes(shape, "train", 4, seq_len)  # 03's gpu.yaml: the update's activations are the larger
    assert four > one and four - mp.PROCESS_OVERHEAD > mp.MARGIN * (state + old_pass)
    # what the cut saves: 03's whole step (32 x 8 sequences) in one no-grad forward, its attention uncut
    a = shape.num_attention_heads * seq_len**2 * 8
    whole = 256 * seq_len * (3 * shape.intermediate_size + 4 * shape.hidden_size) * 4 + 256 * a
    assert whole > 2.5 * old_pass and old_pass < 12 * GiB


def test_trainer_settings_plan_holds_four_model_copies():
    """Notebook 09 keeps the fp32 master, its float64 copy (two fp32 copies' worth) and one setting's copy; its
    float64 control runs the scorer's batches at twice the bytes."""
    shape = mp.ModelShape.from_config(QWEN["0.5B"])
    n = shape.params()
    settings = mp.trainer_bytes(shape, "settings", 64, 384)
    score = mp.trainer_bytes(shape, "score", 64, 384)
    assert settings - score == pytest.approx(mp.MARGIN * (12 * n + mp.scoring_transient(shape, 64, 384)), rel=1e-6)


def test_engine_kwargs_apply_the_plan_on_cuda_only(monkeypatch):
    from rlwb.engines.presets import GPU_SHARE_ENV, engine_kwargs

    monkeypatch.setenv(GPU_SHARE_ENV, "0.31")
    assert engine_kwargs({"dtype": "bfloat16"}, cuda=True)["gpu_memory_utilization"] == 0.31
    assert "gpu_memory_utilization" not in engine_kwargs({}, cuda=False)
    # a preset that sets its own share keeps it
    assert engine_kwargs({"gpu_memory_utilization": 0.5}, cuda=True)["gpu_memory_utilization"] == 0.5


def test_cpu_runs_record_no_gpu_plan():
    from rlwb import params

    nb = "01_logprob_mismatch"
    assert mp.plan_for_run(nb, RECORDS[nb].needs, params.load(nb))["device"] == "cpu"
