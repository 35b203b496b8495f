"""Dry runs of every `params/<notebook>/gpu.yaml` on this CPU before anyone spends GPU hours on it (issue #18).

The same file, with the model swapped for the realistic embedded model on its smoke budget (a Qwen2 with a BPE
tokenizer, a chat template, no BOS and a tied head, as Qwen2.5-0.5B-Instruct has) and only sizes shrunk: the
dtype, trainer dtype, micro-batching, prefix/validator settings and everything else the GPU run would use stay
as written, so the GPU configuration's code path (chat prompts, free-form reward, tokenizer, tied head) runs
end to end. The engines are cut to one per notebook (the GPU run uses them all; their loading is covered by
test_chat_model).

In process, the notebook's own steps: the file is loaded and validated by `rlwb.params` (as `rlwb run -f gpu.yaml -f
shrink.yaml` loads it), the memory plan is made (`rlwb.notebook.start`'s step), the model resolved as the notebook
resolves it (`rlwb.notebook.use_model`), the experiment run as the notebook runs it, its result archived
(`Run.save_result`: metrics checked flat, every frame to Parquet, the answer), its conclusion and summary worded,
every figure drawn from the archived data (`rlwb figures`' path, PNG only: the PDF and SVG writers are every
smoke run's), and 10's provenance recorded. What papermill adds
(a kernel, the parameters cell, the HTML report) is every notebook's smoke run's (tests/test_notebooks.py); a
kernel start and a report render per GPU file bought nothing those do not check.

Where the shrunk GPU file runs nothing its notebook's smoke run does not (`SMOKE_HOLDS`: same model, dtype and every
other setting, lists within the smoke run's, sizes no larger; asserted here key by key), the run itself is that smoke
run's (test_notebooks' `test_notebook_smoke`, with its checks, archive and figures in every style): here the file is
loaded, its settings checked as written, the containment asserted and the memory plan made, and no engine starts."""

from __future__ import annotations

import inspect
import json

import pytest
import yaml

from tests.conftest import REPO, ink

SHRINK = {
    "01_logprob_mismatch": {"engines": ["vllm-v1-fixed"], "prompts": 4, "max_tokens": 16, "reward_samples": 8},
    "02_kl_vs_temperature": {"engines": ["vllm-v1-processed"], "prompts": 4, "max_tokens": 12,
                             "temperatures": [0.7, 1.0], "top_p_values": [1.0]},
    "03_toy_grpo": {"engines": ["vllm-v1-fixed"], "corrections": ["none"], "num_seeds": 1, "steps": 2,
                    "prompts_per_step": 2, "group_size": 4, "max_tokens": 24},
    "04_determinism_and_staleness": {"engines": ["vllm-v1-fixed"], "prompts": 4, "batch_sizes": [1, 8],
                                     "prefix_tokens": 600, "max_tokens": 8},
    "05_equivalence_and_stress": {"engines": ["vllm-v1-fixed"], "validate_cases": 2, "pressure_prompts": 4,
                                  "max_tokens": 16, "longctx_lengths": [128, 1024], "longctx_prompts": 1,
                                  "longctx_max_tokens": 8, "validate_max_context": 1024},
    "06_engine_knobs": {"knobs": ["bf16"], "versions": [], "prompts": 4, "max_tokens": 16, "moe_prompts": 2,
                        "moe_model": "qwen2-moe-chat-smoke", "throughput_repeats": 1},
    "07_which_correction": {"engines": ["vllm-v1-fixed", "vllm-v1-bf16"], "race_on_baseline": False,
                            "corrections": ["none", "verl.geo_rs", "trl.opsm"], "num_seeds": 1, "steps": 2,
                            "prompts_per_step": 2, "group_size": 2, "max_tokens": 16},
    # the placebo is the clean run on another seed stream (its path: the smoke run's); 2 seeds: the least 08 takes
    "08_mismatch_cost": {"arms": ["none@engine"], "ratio_k3": [0.01], "weight_noise": [], "stale_steps": [],
                         "engine_points": [], "point_arms": ["none@engine"], "placebo_arms": [], "num_seeds": 2,
                         "steps": 2, "prompts_per_step": 2, "group_size": 2, "max_tokens": 16, "policy_samples": 1},
    # compile and flex attention compile for ~20 s a shape on CPU (tests/test_trainer_settings.py measures them)
    "09_trainer_settings": {"prompts": 2, "max_tokens": 8, "settings": ["bf16+mb4+grad", "flash3"],
                            "grid_engines": ["vllm-v1-fixed@bf16-head-native"]},
    "10_audit": {"max_tokens": 16},
}


def check_toy_grpo(frames: dict, m: dict, phases: dict) -> None:
    """gpu.yaml's micro_batch 4 on 8 sequences a step: every update really ran in 2 forward/backward passes, after
    the separate pass that scores the old logprobs (a micro-batched update cannot share it); its bf16 engine
    against the fp32 trainer shows a mismatch every step (a bf16 engine at the float floor would be a wrong
    dtype somewhere)."""
    curves = frames["curves"]
    assert len(curves) == 2 and (curves["update_passes"] == 2).all()
    assert phases["scoring"] > 0
    assert (curves["mismatch_k3"] > 1e-7).all() and m["vllm-v1-fixed+none/mismatch_k3_mean"] > 1e-7


def check_which_correction(frames: dict, m: dict, phases: dict) -> None:
    """The race's two levels on the chat model: the fp32 baseline at the float floor, the bf16 level measurably off
    it, and Geo-RS's 0.1% band rejecting bf16's sequences there (so the level's corrections did something)."""
    assert m["vllm-v1-fixed+none/mismatch_k3_mean"] < 1e-8 < 1e-7 < m["vllm-v1-bf16+none/mismatch_k3_mean"]
    assert m["vllm-v1-bf16+verl.geo_rs/masked_frac_mean"] > 0
    assert m["vllm-v1-fixed+none/masked_frac_mean"] == 0


def check_trainer_settings(frames: dict, m: dict, phases: dict) -> None:
    """The sampler's and the grid engine's chat prompts were scored by each setting; a kernel the machine lacks is a
    row with the library's error; float64 in batches agrees with the float64 reference to its rounding."""
    status = frames["status"].set_index("setting")
    assert status.loc["bf16+mb4+grad", "status"] == "ok" and status.loc["flash3", "status"] == "unsupported here"
    assert m["fp64/abs_dlogp_max"] < 1e-12 and "grid/vllm-v1-fixed@bf16-head-native/fp32/k3_mean" in m


# notebook 06: its smoke run is on the same chat model (and its MoE build) at the same fp32 dtype, with every knob and
# version the shrunk GPU file keeps (`bf16`, none) and more prompts
SMOKE_HOLDS = {"06_engine_knobs"}


def beyond_smoke(stem: str, ran: dict) -> list[str]:
    """The settings of the shrunk GPU file (`ran`) that `params/<stem>/smoke.yaml` does not cover: equal, a list
    within the smoke run's list, or a size `SHRINK` sets no larger than the smoke run's."""
    from rlwb import params

    smoke = params.load(stem, [REPO / "params" / stem / "smoke.yaml"]).to_dict()
    out = []
    for k, v in ran.items():
        s = smoke.get(k)
        if v == s or (isinstance(v, list) and isinstance(s, list) and all(x in s for x in v)):
            continue
        if k in SHRINK[stem] and type(v) in (int, float) and type(s) in (int, float) and v <= s:
            continue
        out.append(f"{k}: {v!r} (smoke: {s!r})")
    return out


CHECKS = {"03_toy_grpo": check_toy_grpo, "07_which_correction": check_which_correction,
          "09_trainer_settings": check_trainer_settings}


@pytest.mark.slow
@pytest.mark.engines
@pytest.mark.parametrize("stem", list(SHRINK))
def test_gpu_config_dry_run_on_the_chat_model(stem, chat_smoke_model, outputs, tmp_path):
    import rlwb.notebook
    from rlwb import archive, params, timing
    from rlwb.memory_plan import plan_for_run
    from rlwb.registry import notebook
    from rlwb.reports.figures import regenerate_figures

    gpu = REPO / "params" / stem / "gpu.yaml"
    written = yaml.safe_load(gpu.read_text())
    shrink = tmp_path / "shrink.yaml"
    shrink.write_text(yaml.safe_dump({**SHRINK[stem], "model": "qwen2-chat-smoke"}))
    p = params.load(stem, [gpu, shrink])
    ran = p.to_dict()
    kept = {k: v for k, v in written.items() if k not in SHRINK[stem] and k != "model"}
    assert {k: ran[k] for k in kept} == kept  # the GPU file's own settings run as written
    assert ran.get("chat_template", "auto") == "auto"  # 10_audit has none: its chat rows always take the template
    record = notebook(stem)
    assert plan_for_run(stem, record.needs, p)["device"] == "cpu"
    if stem in SMOKE_HOLDS:  # the run is the smoke run's (tests/test_notebooks.py::test_notebook_smoke)
        assert not beyond_smoke(stem, ran), f"{stem}'s smoke run no longer covers its shrunk GPU file: " \
                                            f"{beyond_smoke(stem, ran)}; take it out of SMOKE_HOLDS"
        return
    run = archive.Run(outputs / stem / "dry-run", p)  # `outputs`: RLWB_OUTPUTS is a fresh archive (09 reads it)
    model_path = rlwb.notebook.use_model(run, p.model)
    info = json.loads((run.dir / "run.json").read_text())
    assert model_path == chat_smoke_model.path and info["model"]["card"]["name"] == "rlwb-qwen2-chat-smoke"
    before = timing.totals()
    experiment = record.experiment().run
    # the experiments that stream their curves to disk take data_dir, as their notebooks pass it (03, 07, 08)
    kwargs = {"data_dir": run.dir / "data"} if "data_dir" in inspect.signature(experiment).parameters else {}
    result = experiment(p, model_path, on_start=run.record_engine, progress=False, **kwargs)
    phases = {k: v - before[k] for k, v in timing.totals().items()}
    if stem == "10_audit":
        run.record_provenance(source=result.source, trainer=result.trainer)
    metrics, frames = run.save_result(result), result.frames()
    info = json.loads((run.dir / "run.json").read_text())
    assert info["engines"], "no engine reported its start"
    assert info["answer"] and result.conclusion() and len(result.summary()) > 0
    assert {f"{name}.parquet" for name in frames} <= {f.name for f in (run.dir / "data").iterdir()}
    drawn = regenerate_figures(run.dir, formats=("png",))  # the drawing; the vector copies: every smoke run's
    assert drawn and all(ink(f) > 0.001 for f in drawn if f.suffix == ".png")  # drawn, not blank
    if stem in CHECKS:
        CHECKS[stem](frames, metrics, phases)
    if stem == "01_logprob_mismatch":  # chat prompts reached the engines; the free-form reward scored them
        ro = frames["rollouts"]
        assert ro["prompt_len"].min() >= 15  # "<|im_start|>user\nWhat is a+b?<|im_end|>\n<|im_start|>assistant\n"
        assert "vllm-v1-fixed/reward_mean" in metrics
