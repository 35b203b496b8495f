"""rlwb.experiments.wording on hand-made numbers: each verdict sentence says what its numbers say, and changes when
they cross what decides it (a criterion, a floor, a failed rule); sections appear only when there is something to
say. No engine, no run: the experiments' own smoke runs (tests/test_notebooks.py) check the sentences in context."""

from rlwb.experiments.wording import engine_knobs as W06
from rlwb.experiments.wording import equivalence_and_stress as W05
from rlwb.experiments.wording import logprob_mismatch as W01
from rlwb.experiments.wording import toy_grpo as W03

NAN = float("nan")


def _grpo_metrics(label: str, first: float, last: float, **extra) -> dict:
    return {f"{label}/reward_first": first, f"{label}/reward_last": last, f"{label}/clip_frac_mean": 0.125,
            f"{label}/mismatch_k3_mean": 2.5e-4, f"{label}/step_s_mean": 1.234, **extra}


def _grpo_setup(metrics: dict, **over) -> dict:
    gains = {k.rsplit("/", 1)[0]: metrics[k.replace("reward_first", "reward_last")] - metrics[k]
             for k in metrics if k.endswith("/reward_first")}
    return {"steps": 10, "prompts_per_step": 4, "group_size": 8, "temperature": 1.0, "lr": 1e-4,
            "old_logprobs": "engine", "num_seeds": 3, "timing_note": "Runs went one at a time.",
            "skipped_k3_max": {}, "others": [], "labels": list(gains), "gains": gains,
            "learning_reference": "fixed+none", "learning_min_gain": 0.15, "paired_reference": "fixed+none",
            "gaps": {}, "drift": None, **over}


def test_learning_check_turns_on_the_criterion():
    assert "`fixed+none` learns on this budget: reward +0.150" in W03.learning_check_line("fixed+none", 0.15, 0.01,
                                                                                           0.29, 0.15)
    below = W03.learning_check_line("fixed+none", 0.149, 0.01, 0.29, 0.15)
    assert "does NOT learn" in below and "(criterion: ≥ +0.15)" in below
    assert "[95% CI over seeds +0.010, +0.290]" in below
    assert "CI" not in W03.learning_check_line("fixed+none", 0.3, NAN, NAN, 0.15)
    assert "CI" not in W03.learning_check_line("fixed+none", 0.3, None, None, 0.15)


def test_run_line_states_the_numbers_and_the_interval_only_where_there_is_one():
    m = _grpo_metrics("v1+none", 0.25, 0.5, **{"v1+none/reward_last_ci_low": 0.4, "v1+none/reward_last_ci_high": 0.6})
    line = W03.run_line(m, "v1+none")
    assert line == ("- `v1+none`: reward 0.250 → 0.500 [95% CI 0.400, 0.600] (+0.250); clip fraction 12.5%; "
                    "engine-trainer k3 2.5e-04; 1.23 s/step.")
    m["v1+none/reward_last_ci_low"] = NAN
    assert "CI" not in W03.run_line(m, "v1+none")


def test_skipped_engines_are_named_with_their_k3_or_nothing_is_said():
    assert W03.skipped_lines({"fixed": 1e-9}, []) == [] and W03.skipped_lines({}, ["verl.geo_rs"]) == []
    (line,) = W03.skipped_lines({"fixed": 3e-9}, ["verl.geo_rs", "trl.opsm"])
    assert "Not run on `fixed` (largest per-step k3" in line and "`verl.geo_rs`, `trl.opsm`" in line


def test_drift_monitor_and_no_gain_lines():
    line = W03.drift_monitor_line("engine-trainer k3", "above", 1e-5, 2, 2, {"v1+none": (0.5, 3.0)}, ["fixed+none"])
    assert "tripped on `v1+none` (50% of seeds, at step 3 on average); quiet on `fixed+none`." in line
    assert "tripped on none; quiet on none." in W03.drift_monitor_line("k3", "above", 1e-5, 2, 2, {}, [])
    assert W03.no_gain_line(0.05, 10) == ""
    assert W03.no_gain_line(0.049, 10) == ("\nNo configuration improved its reward by 0.05 or more within 10 steps "
                                           "(best: +0.049).")


def test_grpo_conclusion_says_only_what_it_has_numbers_for():
    m = {**_grpo_metrics("fixed+none", 0.2, 0.5), **_grpo_metrics("v1+none", 0.2, 0.21)}
    gaps = {"v1+none": (-0.1, -0.3, 0.1)}
    text = W03.conclusion(m, _grpo_setup(m, gaps=gaps))
    assert "**Setup.** 10 steps × 4 prompts × 8 completions" in text and "Runs went one at a time." in text
    assert "`fixed+none` learns" in text and "`v1+none` -0.100 [-0.300, +0.100]" in text
    assert "Drift monitor" not in text and "No configuration improved" not in text
    assert "Paired gaps" not in W03.conclusion(m, _grpo_setup(m, gaps=gaps, num_seeds=1))  # one seed: no interval
    without_ref = {k: v for k, v in m.items() if not k.startswith("fixed+none/")}
    assert "Learning check" not in W03.conclusion(without_ref, _grpo_setup(without_ref))
    flat = {**_grpo_metrics("fixed+none", 0.2, 0.21)}
    assert "does NOT learn" in (t := W03.conclusion(flat, _grpo_setup(flat))) and "best: +0.010" in t


def _knob_metrics(k: str, k3: float, dlogp: float) -> dict:
    return {f"{k}/k3_mean": k3, f"{k}/k3_mean_ci_low": k3 / 2, f"{k}/k3_mean_ci_high": k3 * 2,
            f"{k}/abs_dlogp_max": dlogp, f"{k}/same_tokens_frac": 0.75, f"{k}/throughput_ratio": 1.5}


def _knob_setup(**over) -> dict:
    return {"run": {"baseline": "v1-fixed", "model": "m", "prompts": 8, "prompt_source": "open_ended",
                    "temperature": 1.0, "max_tokens": 16, "trainer_dtype": "float32",
                    "baseline_abs_dlogp_max": 2e-6, "baseline_tok_s": 123.4},
            "float_floor": 1e-4, "floor": {}, "failed": {}, "not_run": {}, "unverified": {}, "versions": [],
            "moe_model": "moe", "moe": [], **over}


def test_a_knob_passes_or_fails_the_health_rules_by_name():
    rule = W06.failed_rule("ess_tis", 0.2, ">=", 0.3, "verl")
    assert rule == "ess_tis 0.2 (needs >= 0.3, verl)"
    m = {**_knob_metrics("bf16", 1e-3, 0.5), **_knob_metrics("fp8", 1e-2, 2.0)}
    fails_line, passes_line = W06.moved_lines(m, {"fp8": [rule], "bf16": []})[1:]
    assert fails_line.startswith("- `fp8`:") and fails_line.endswith("fails ess_tis 0.2 (needs >= 0.3, verl).")
    assert passes_line.startswith("- `bf16`: k3 = 1.00e-03 [5.00e-04, 2.00e-03]")
    assert passes_line.endswith("passes the published health rules.")


def test_knob_conclusion_sections_follow_what_ran():
    bare = W06.conclusion({}, _knob_setup())
    assert bare.startswith("**Setup.** Baseline `v1-fixed` on `m`, 8 open-ended prompts") and "123 tok/s" in bare
    assert not any(s in bare for s in ("Free of mismatch", "move the engine", "Versions", "MoE", "Not verified"))
    assert bare.endswith("except those marked not verified.")
    m = {**_knob_metrics("prefix-caching", 0.0, 0.0), **_knob_metrics("bf16", 1e-3, 0.5),
         "v0/abs_dlogp_max": 0.25, "v0/throughput_ratio": 0.5}
    text = W06.conclusion(m, _knob_setup(
        floor={"prefix-caching": 1.5}, failed={"bf16": []},
        not_run={"unsupported here": {"tp2-ray": "needs 2 GPUs"}}, unverified={"bf16": "x=1"},
        versions=[{"knob": "v0", "status": "ok", "vllm_version": "0.8.5", "error": None},
                  {"knob": "v2", "status": "failed to start", "vllm_version": None, "error": "no env"}]))
    assert "**Free of mismatch** (max |Δlogp| ≤ 1e-4, as the baseline): `prefix-caching` (1.50× throughput)." in text
    assert "**Unsupported here** (the engine's own words): `tp2-ray`: needs 2 GPUs." in text
    assert "**Not verified**" in text and "`bf16`: x=1." in text
    assert ("**Versions**: `v0` (vLLM 0.8.5): max |Δlogp| 2.5e-01, 0.50× the baseline's throughput; "
            "`v2`: failed to start (no env).") in text
    moe = W06.conclusion({"moe/baseline/topk_set_agree": 0.975, "moe/baseline/any_layer_differs_frac": 0.125,
                          "moe/baseline/k3_mean": 3e-4}, _knob_setup(moe=["moe/baseline"]))
    assert ("**MoE router** (`moe`, top-k set agreement engine vs trainer, mean over layers): `baseline` 97.50% "
            "(12.5% of tokens routed differently in some layer; k3 3.0e-04).") in moe


def test_reward_verdict_turns_at_the_5_percent_level():
    m = {"a/reward_mean": 0.5, "b/reward_mean": 0.6, "a_vs_b/reward_mean_diff": -0.1, "a_vs_b/reward_pvalue": 0.049}
    differ = "\n".join(W01.reward_lines(m, ["a", "b"], 64))
    assert "**Reward equivalence** (64 rollouts per engine" in differ and "`a` 0.500" in differ
    assert "Pairs whose rewards differ (permutation p < 0.05): `a_vs_b` Δ = -0.100 , p = 0.049." in differ
    same = "\n".join(W01.reward_lines({**m, "a_vs_b/reward_pvalue": 0.05}, ["a", "b"], 64))
    assert "No pair's rewards differ at the 5% level (smallest p = 0.05, `a_vs_b`)" in same
    assert W01.reward_lines(m, ["c"], 64) == []


def test_mismatch_conclusion_sorts_engines_by_the_float_floor_and_explains_raw_logprobs():
    def eng(e, dlogp):
        return {f"{e}/abs_dlogp_max": dlogp, f"{e}/abs_dlogp_mean": dlogp / 10, f"{e}/k3_mean": dlogp ** 2,
                f"{e}/clip_frac": 0.0, f"{e}/n_tokens": 128}

    p = {"prompts": 8, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "dtype": "float32", "trainer_dtype": "float32",
         "heterogeneous_batch": False, "prompt_source": "task", "engines": ["vllm-v1-fixed", "vllm-v1"],
         "reward_samples": 0}
    m = {**eng("vllm-v1-fixed", 5e-5), **eng("vllm-v1", 0.3)}
    text = W01.conclusion(m, p)
    assert "At the float floor (max |Δlogp| ≤ 1e-4): `vllm-v1-fixed`." in text and "Above it: `vllm-v1`." in text
    assert "reports raw (T=1) logprobs by default, so at T=0.7" in text
    assert "raw (T=1)" not in W01.conclusion(m, {**p, "temperature": 1.0})
    assert "Above it" not in W01.conclusion({**eng("vllm-v1-fixed", 5e-5)}, p)


def test_stress_conclusion_says_when_there_is_no_paged_cache_or_no_preemption_count():
    m = {"hf/validate_pass_rate": 0.5, "hf/validate_cases": 6, "hf/validate_pass_rate_ci_low": 0.19,
         "hf/validate_pass_rate_ci_high": 0.81, "hf/validate_worst_abs_dlogp": 0.2, "hf/longctx_max_position": 4096,
         "hf/longctx_abs_dlogp_max": 1e-3, "hf/longctx_dist_abs_dlogp_max": NAN, "hf/longctx_max_near": 1e-4,
         "hf/longctx_max_far": 1e-3, "hf/longctx_abs_dlogp_mean": 1e-4, "hf/longctx_abs_dlogp_mean_ci_low": 5e-5,
         "hf/longctx_abs_dlogp_mean_ci_high": 2e-4}
    text = W05.conclusion(m, ["hf", "not-run"], 0.01)
    assert text.startswith("- `hf`: validator 50% of 6 cases within 0.01 (95% CI 19%-81%)")
    assert "No paged KV cache, so no memory-pressure check." in text and "not-run" not in text
    assert "over the whole vocabulary n/a" in text
    pressed = {**m, "hf/pressure_abs_dlogp_max": 1e-3, "hf/pressure_preemptions": NAN, "hf/pressure_kv_tokens": 512,
               "hf/pressure_abs_dlogp_mean": 1e-4, "hf/pressure_abs_dlogp_mean_ci_low": 1e-4,
               "hf/pressure_abs_dlogp_mean_ci_high": 2e-4, "hf/free_abs_dlogp_max": 1e-3,
               "hf/pressure_identical_frac": 1.0}
    assert "(512-token KV cache, preemptions not exposed)" in W05.conclusion(pressed, ["hf"], 0.01)
    assert "3 preemptions" in W05.conclusion({**pressed, "hf/pressure_preemptions": 3.0}, ["hf"], 0.01)


def test_default_policy_names_its_model_and_adds_held_out_text_only_when_measured():
    from rlwb.experiments.wording import default_policy as W00

    m = {"policy/params": 1234567, "policy/greedy_accuracy": 0.4, "policy/mean_completion_tokens": 21.25,
         "policy/reversed_answer_frac": 0.1}
    text = W00.conclusion(m, "default", 200)
    assert text.startswith("**Conclusion.** The default policy has 1,234,567 parameters and solves 40.0% of 200")
    assert "held-out standard-library" not in text
    other = W00.conclusion({**m, "policy/held_out_entropy": 2.5, "policy/held_out_cross_entropy": 2.75}, "chat", 200)
    assert "The `chat` model has" in other and "entropy is 2.50 nats (cross-entropy 2.75)" in other


def test_determinism_line_per_engine_that_ran():
    from rlwb.experiments.wording import determinism_and_staleness as W04

    m = {"v1/batch_invariant_frac": 0.5, "v1/prefix_caching": 1.0, "v1/batch_max_abs_dlogp": 0.01,
         "v1/rerun_identical_frac": 1.0, "v1/stale_cache_abs_dlogp_max": 0.2, "v1/after_reset_abs_dlogp_max": 1e-9}
    (line,) = W04.conclusion(m, ["v1", "v0"], 8).splitlines()
    assert line.startswith("- `v1` (prefix caching on): 50% of greedy requests bitwise identical alone vs in a batch "
                           "of 8 (max |Δlogp| 1.0e-02); 100% of seeded reruns identical")
