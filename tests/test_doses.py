"""Notebook 08's doses (`rlwb.core.rl.mismatch_doses`): the ratio dose hits its intended k3, is paired (the same noise
for every arm of a seed and step, token by token) and stays symmetric where the policy is confident; the weight dose is
a fixed perturbation per seed of the stated relative size; the stale dose lags whole or fractional updates; the
one-sided dose reports the logprobs of mis-scaled logits, exactly, a one-signed error. The kinds are a registry
(`DOSE_KINDS`) the study reads everywhere: a new kind registered here flows into the params, the study's grammar and
the loop's hooks, and a misspelt one is refused with the name it resembles. No engine needed (a tiny random model at
most)."""

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from rlwb.core.rl import mismatch_doses
from rlwb.errors import ParamError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("k3", [1e-4, 1e-2, 1e-1])
def test_gaussian_logprob_noise_has_the_intended_mean_k3(k3):
    sigma = mismatch_doses.logprob_noise_sigma(k3)
    assert math.exp(sigma**2 / 2) - 1 == pytest.approx(k3, rel=1e-12)
    delta = torch.randn(2_000_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * sigma
    r = torch.exp(-delta)  # trainer / engine-reported ratio when the report is off by +delta
    assert float((r - 1 - torch.log(r)).mean()) == pytest.approx(k3, rel=0.02)


def test_logprob_noise_is_paired_and_only_on_real_tokens():
    logp = -torch.rand(6, 9, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 3
    mask = torch.ones(6, 9, dtype=torch.bool)
    mask[:, 6:] = False
    a = mismatch_doses.noisy_logprobs(logp, mask, 1e-2, seed=3, step=4)
    assert torch.equal(a, mismatch_doses.noisy_logprobs(logp, mask, 1e-2, seed=3, step=4))  # every arm sees the same
    assert not torch.equal(a, mismatch_doses.noisy_logprobs(logp, mask, 1e-2, seed=3, step=5))  # fresh per step
    assert not torch.equal(a, mismatch_doses.noisy_logprobs(logp, mask, 1e-2, seed=4, step=4))  # and per seed
    assert torch.equal(a[:, 6:], logp[:, 6:]) and not torch.equal(a[:, :6], logp[:, :6])
    assert mismatch_doses.noisy_logprobs(logp, mask, 0.0, 3, 4) is logp
    # a token's draw depends on its (sequence, position) alone: an arm whose batch is wider (longer completions)
    # sees the same noise on the tokens both have
    wide = torch.cat([logp, -torch.ones(6, 5, dtype=torch.float64)], dim=1)
    b = mismatch_doses.noisy_logprobs(wide, torch.ones_like(wide, dtype=torch.bool), 1e-2, seed=3, step=4)
    assert torch.equal(b[:, :6], a[:, :6])
    with pytest.raises(ValueError, match=">= 0"):
        mismatch_doses.logprob_noise_sigma(-1e-3)


@pytest.mark.parametrize("k3", [1e-2, 1e-1, 1.0])
def test_logprob_noise_stays_symmetric_on_confident_tokens(k3):
    """At p ~ 1 (a trained policy's usual token) the dose must still be noise, not a bias: mean log r ~ 0 and the
    intended k3 reached. (A cap at logprob 0 made r >= 1 there: mean log r +0.06..+0.47, k3 45% short at 1e-2.)"""
    confident = torch.full((256, 64), -1e-4, dtype=torch.float64)
    mask = torch.ones_like(confident, dtype=torch.bool)
    log_r = (confident - mismatch_doses.noisy_logprobs(confident, mask, k3, seed=0, step=0)).flatten()
    sigma = mismatch_doses.logprob_noise_sigma(k3)
    assert abs(float(log_r.mean())) < 4 * sigma / math.sqrt(log_r.numel())
    assert float((log_r.exp() - 1 - log_r).mean()) == pytest.approx(k3, rel=0.15)
    assert float((log_r > 0).double().mean()) == pytest.approx(0.5, abs=0.02)


def test_weight_noise_is_fixed_per_seed_and_relative_to_each_tensor():
    g = torch.Generator().manual_seed(2)
    state = {"w": torch.randn(200, 300, generator=g) * 5.0, "b": torch.randn(300, generator=g) * 0.01,
             "step": torch.tensor(7)}
    n1, n2 = mismatch_doses.weight_noise(state, 0.03, seed=1), mismatch_doses.weight_noise(state, 0.03, seed=1)
    assert set(n1) == {"w", "b"} and all(torch.equal(n1[k], n2[k]) for k in n1)
    assert not torch.equal(n1["w"], mismatch_doses.weight_noise(state, 0.03, seed=2)["w"])
    for k in ("w", "b"):  # noise rms / tensor rms = the dose
        ratio = float(n1[k].pow(2).mean().sqrt() / state[k].pow(2).mean().sqrt())
        assert ratio == pytest.approx(0.03, rel=0.1)
    p = mismatch_doses.perturbed(state, n1)
    assert torch.equal(p["step"], state["step"]) and torch.allclose(p["w"] - state["w"], n1["w"], atol=1e-5)
    assert mismatch_doses.perturbed(state, None) is state and np.isfinite(float(p["b"].sum()))


def test_lagged_weights_hand_the_engine_the_weights_of_lag_updates_ago():
    """Step t's engine samples with the trainer's weights of step max(0, t - lag): the initial weights until `lag`
    updates have happened, and the pushed tensors are copies (the trainer's in-place updates do not reach them)."""
    w = {"w": torch.zeros(3)}
    lagged = mismatch_doses.LaggedWeights(w, lag=2)
    seen = []
    for _ in range(5):  # the update at step t gives the weights of step t + 1; the engine then gets step t + 1 - 2's
        w["w"] += 1.0  # in place, as an optimizer step
        seen.append(float(lagged.push(w)["w"][0]))
    assert seen == [0.0, 0.0, 1.0, 2.0, 3.0]
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="> 0"):
            mismatch_doses.LaggedWeights(w, lag=bad)


def test_an_integral_lag_hands_over_one_update_s_weights_untouched():
    """An integral lag, given as an int or a float (params read `2.0` as 2; the loop's dose is a float), is bitwise
    the weights of that many updates ago, whatever their dtype (a bf16 tensor too): what the engine sampled with
    before fractional lags existed."""
    g = torch.Generator().manual_seed(4)
    w = {"w": torch.randn(5, generator=g), "h": torch.randn(3, generator=g).to(torch.bfloat16), "n": torch.tensor(0)}
    for lag in (1, 2, 2.0, 3.0):
        lagged, history = mismatch_doses.LaggedWeights(w, lag=lag), [w]
        for t in range(1, 6):
            history.append({k: v + torch.randn(v.shape, generator=g).to(v.dtype) if v.is_floating_point() else v + 1
                            for k, v in history[-1].items()})
            out = lagged.push(history[-1])
            assert all(torch.equal(out[k], history[max(0, t - int(lag))][k]) for k in w), (lag, t)


@pytest.mark.parametrize("lag", [0.5, 1.25, 2.75])
def test_a_fractional_lag_interpolates_between_the_two_updates_around_it(lag):
    """Lag s = floor + f: after t updates the engine samples with (1 - f) theta_{t - floor(s)} + f theta_{t - ceil(s)},
    each clamped to the initial weights theta_0, checked against weights whose every update is known (theta_t = t
    everywhere, so the interpolation is hand-computed); tensors that are not floating are the nearer update's."""
    near, f = math.floor(lag), lag - math.floor(lag)
    w = {"w": torch.zeros(4), "b": torch.zeros(2, dtype=torch.float64), "n": torch.tensor(0)}
    lagged = mismatch_doses.LaggedWeights(w, lag=lag)
    for t in range(1, 7):
        for v in w.values():
            v += 1  # in place, as an optimizer step: theta_t = t
        out = lagged.push(w)
        want = (1 - f) * max(0, t - near) + f * max(0, t - math.ceil(lag))
        assert torch.allclose(out["w"], torch.full((4,), want), atol=1e-6), (t, out["w"], want)
        assert torch.allclose(out["b"], torch.full((2,), want, dtype=torch.float64), atol=1e-12)
        assert out["w"].dtype == torch.float32 and out["b"].dtype == torch.float64
        assert int(out["n"]) == max(0, t - near)
    dose = mismatch_doses.start("stale", lag, 0, {"w": torch.zeros(4)})
    assert float(dose.synced({"w": torch.ones(4)})["w"][0]) == pytest.approx(1 - f if near == 0 else 0.0)


def test_first_full_step_is_where_a_dose_is_whole():
    """The analysis reads a dose's intended k3 from `first_full_step` on: a lag of s updates is whole from step
    ceil(s) (before it the engine holds the initial weights, fewer than s updates behind); a kind that acts from
    the start is whole from step 0."""
    stale = mismatch_doses.dose_kind("stale")
    assert [stale.first_full_step(s) for s in (0.25, 0.5, 1, 1.5, 2, 4)] == [1, 1, 1, 2, 2, 4]
    for k in mismatch_doses.dose_kinds():
        if not k.lag:
            assert k.first_full_step(0.3) == 0 and k.first_full_step(2) == 0, k.name
    # what it says, measured on a trainer whose update t gives theta_t = t: how far behind the engine's weights are
    # at each step, whole from first_full_step on
    for lag in (0.5, 1.5, 2):
        dose, theta, engine_w, behind = mismatch_doses.start("stale", lag, 0, {"w": torch.zeros(1)}), {
            "w": torch.zeros(1)}, 0.0, []
        for t in range(5):
            behind.append(t - engine_w)  # step t samples with the engine's weights, the trainer holds theta_t
            theta["w"] += 1
            engine_w = float(dose.synced(theta)["w"][0])
        full = stale.first_full_step(lag)
        assert all(b < lag for b in behind[:full]) and behind[full:] == [lag] * (5 - full), (lag, behind)


def test_the_registry_holds_the_four_kinds_in_report_order():
    kinds = mismatch_doses.dose_kinds()
    assert [(k.name, k.param, k.unit) for k in kinds] == [
        ("ratio", "ratio_k3", float), ("weights", "weight_noise", float), ("stale", "stale_steps", int | float),
        ("onesided", "onesided_scale_error", float)]
    assert mismatch_doses.kinds_for(raw=True) == ["ratio", "onesided"]  # a raw engine's panel is still ratio's
    assert mismatch_doses.kinds_for(raw=False) == ["weights", "stale"]
    with pytest.raises(ParamError, match=r"unknown dose kind 'ratoi'; did you mean 'ratio'\?"):
        mismatch_doses.dose_kind("ratoi")
    with pytest.raises(ValueError, match="registered already"):
        mismatch_doses.register_dose_kind("ratio", **{f: getattr(kinds[0], f) for f in ("order", "title", "panel_title",
                                                                                       "param", "doses", "doc")})(
            mismatch_doses.Dose)
    with pytest.raises(ValueError, match="not be one of the study's other rows"):
        mismatch_doses.DoseKind("clean", mismatch_doses.Dose, 9, "t", "t", "clean_doses", (), "d")
    assert isinstance(mismatch_doses.start("", 0.0, 0, {}), mismatch_doses.Dose)  # no kind: a clean run


@pytest.fixture
def toykind():
    """A kind of dose as a new one is added: one registration (a `Dose` and its fields), removed after the test.
    The notebooks' schemas are imported first: one first imported while the toy kind is registered would keep a
    field for it for the rest of the session (and every later 08 params object would hash with it)."""
    import rlwb.registry  # noqa: F401

    @mismatch_doses.register_dose_kind(
        "toykind", order=99, title="toy mismatch (reported logprobs shifted)", panel_title="toy mismatch\n(shifted)",
        param="toykind_shift", doses=(0.1, 0.2), gt=0, doc="toy doses: a constant shift of the reported logprobs",
        samples_right=True, dose_words="shift {:g}")
    class Shift(mismatch_doses.Dose):
        def __init__(self, dose, seed, initial):
            self.shift, self.reports = dose, True

        def reported(self, logp, mask, step, trainer_logp):
            return logp + self.shift * mask

    yield mismatch_doses.DOSE_KINDS["toykind"]
    del mismatch_doses.DOSE_KINDS["toykind"]


def test_a_new_kind_of_dose_flows_through_params_grammar_and_loop(toykind):
    """Registered, a kind has a params field (its doses, doc and bound: the schema adds it, as it does for the
    kinds registered before it was built), its rows `toykind@<dose>` are accepted wherever a row is named, the
    study's grammar trains them with their clean twins, the run's GRPO config names the kind and the loop's hook is
    the kind's; a misspelt kind is refused with the name it resembles."""
    from rlwb.core.rl.grpo_config import GRPOConfig
    from rlwb.experiments.mismatch_study import analysis, design
    from rlwb.params import cells
    from rlwb.params.schemas.mismatch_cost import MismatchCostParams, with_dose_lists
    from rlwb.plots.mismatch_cost import kind_titles

    @dataclass
    @with_dose_lists
    class ToyParams(MismatchCostParams):  # the schema as built with the toy kind registered
        pass

    assert "toykind_shift: list = [0.1, 0.2]  # toy doses: a constant shift" in cells.parameters_cell(ToyParams)
    p = ToyParams(arms=["none@engine", "none@trainer"], ratio_k3=[], weight_noise=[0.03], stale_steps=[],
                  engine_points=[], placebo_arms=[], num_seeds=2, row_arms=["toykind@0.2 none@trainer"],
                  steps=5, long_steps=20, long_doses=["toykind@0.1"], long_arms=["none@engine"])
    rows = p.grammar.doses
    assert [(r.kind, r.dose, r.label) for r in rows] == [
        ("weights", 0.03, "weights@0.03"), ("toykind", 0.1, "toykind@0.1"), ("toykind", 0.2, "toykind@0.2")]
    runs = design.training_runs(p)
    toy = {(j.label, j.arm, j.seed, j.steps) for j in runs if j.kind == "toykind"}
    assert toy == {("toykind@0.1", a, s, 0) for a in p.arm_labels for s in p.seeds} | {
        ("toykind@0.2", "none@trainer", s, 0) for s in p.seeds} | {("toykind@0.1+long", "none@engine", s, 20)
                                                                    for s in p.seeds}
    twins = {j.twin for j in runs if j.kind == "clean"}
    assert all(j.twin in twins for j in runs if j.kind == "toykind")
    job = next(j for j in runs if j.label == "toykind@0.2")
    cfg = design.config(p, job)
    assert (cfg.dose_kind, cfg.dose) == ("toykind", 0.2)
    dose = mismatch_doses.start(cfg.dose_kind, cfg.dose, cfg.seed, {})
    logp, mask = -torch.ones(2, 3), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert dose.reports and torch.equal(dose.reported(logp, mask, 0, no_forward), logp + 0.2 * mask)
    assert dose.synced(w := {"w": torch.zeros(1)}) is w  # hooks it does not override leave the engine alone
    # read everywhere: the figure's panels, the kinds a raw-logprob engine is placed against, a row's intended k3
    assert list(kind_titles())[-1] == "toykind" and mismatch_doses.kinds_for(raw=True) == [
        "ratio", "onesided", "toykind"]
    assert analysis.panel_of("engine", raw=True) == "ratio" and analysis.control_of("toykind", "none@trainer", 0.7,
                                                                                     False) == ""
    # a raw-logprob engine's error is one-sided: its points join that kind's panel where the study has its rows
    assert analysis.panel_of("engine", raw=True, present={"ratio", "onesided"}) == "onesided"
    assert analysis.panel_of("engine", raw=False, present={"onesided", "weights"}) == "weights"
    # the base schema (built before the toy kind) accepts its rows where a sweep's cell has none of its doses
    assert MismatchCostParams(row_arms=["toykind@0.5 none@engine"]).arms_of("toykind@0.5", []) == ["none@engine"]
    with pytest.raises(ParamError, match=r"'toykid@0.1' is neither a dose row .*: unknown dose kind 'toykid'; did "
                                         r"you mean 'toykind'\?"):
        MismatchCostParams(row_arms=["toykid@0.1 none@engine"])
    with pytest.raises(ParamError, match=r"unknown dose kind 'toykid'; did you mean 'toykind'\?"):
        GRPOConfig(dose_kind="toykid", dose=0.1)
    with pytest.raises(ParamError, match="'long_doses' names rows no dose list has"):
        ToyParams(long_steps=100, long_doses=["toykind@0.3"])


def no_forward(scale):
    raise AssertionError(f"a dose asked for the trainer's logprobs at logit scale {scale}")


def tiny_policy(seed: int = 0):
    """A random two-layer Llama small enough to score in milliseconds, with peaked logits (a trained policy's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model.eval()


def test_the_one_sided_dose_reports_the_logprobs_of_scaled_logits():
    """Through the loop's own rescorer (`grpo.rescorer`), a dose d reports log_softmax((1 - d) z / T) at each
    completion token, z the model's logits, computed here independently from a plain forward in float64: exact to
    float precision, on real tokens only, with the engine's own error against the trainer kept (an engine off by
    eps reports the scaled logprob + eps). The trainer's own logprobs cost no further forward; the other kinds
    never ask for one (`no_forward`)."""
    from rlwb.core.rl import grpo
    from rlwb.core.scoring.trainer import completion_logprobs, make_batch

    model, T = tiny_policy(), 0.7
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 48, (n,), generator=g).tolist() for n in (3, 5, 4, 2)]
    comps = [torch.randint(1, 48, (n,), generator=g).tolist() for n in (6, 2, 4, 5)]
    batch, lengths, width = make_batch(prompts, comps), [len(c) for c in comps], max(len(c) for c in comps)
    mask = torch.tensor([[j < n for j in range(width)] for n in lengths])
    with torch.no_grad():
        own = grpo._per_seq(completion_logprobs(model, batch, T)["logp"], lengths, width)
        logits = model(batch.input_ids, attention_mask=batch.attention_mask).logits.double()
    eps = 1e-3 * torch.arange(width, dtype=own.dtype) * mask  # the engine's own (float-floor) error
    engine = own + eps
    for d in (0.03, 0.3, 0.5):
        want = torch.zeros(len(comps), width, dtype=torch.float64)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            pos = torch.arange(len(p) - 1, len(p) + len(c) - 1)  # the logits that predict each completion token
            want[i, :len(c)] = (logits[i, pos] * (1 - d) / T).log_softmax(-1).gather(-1, torch.tensor(c)[:, None])[:, 0]
        dose = mismatch_doses.start("onesided", d, 0, {})
        got = dose.reported(engine, mask, 0, grpo.rescorer(model, batch, T, own))
        assert dose.reports and torch.allclose((got - eps).double(), want, atol=2e-5, rtol=0), d
        assert not torch.allclose(got, engine, atol=1e-3)  # the dose moved what was reported
        assert torch.equal(got[~mask], engine[~mask])
    calls = []
    handle = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        assert grpo.rescorer(model, batch, T, own)(1.0) is own and not calls  # the old logprobs: no forward
        for kind, dose in (("", 0.0), ("ratio", 0.1), ("weights", 0.03), ("stale", 2)):
            mismatch_doses.start(kind, dose, 0, {"w": torch.zeros(1)}).reported(engine, mask, 0, no_forward)
    finally:
        handle.remove()


def sampled_logprobs(n_tokens: int, vocab: int, T: float, seed: int):
    """Tokens sampled from softmax(z / T), z a peaked policy's logits: `trainer_logp(a)`, their logprobs
    log_softmax(a z / T) ([64, n_tokens / 64], float64: what the loop's rescorer returns, for many tokens), and
    whether each is its position's most likely token."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n_tokens, vocab, generator=g, dtype=torch.float64) * 4.0
    tok = torch.multinomial((z / T).softmax(-1), 1, generator=g)

    def trainer_logp(a):
        return (a * z / T).log_softmax(-1).gather(-1, tok)[:, 0].reshape(64, -1)

    return trainer_logp, (tok[:, 0] == z.argmax(-1)).reshape(64, -1)


def test_the_one_sided_error_is_one_signed_and_grows_with_the_dose():
    """Sampled right, reported at logits x (1 - d): the reported distribution is flatter, so on every token that is
    its position's most likely one log r = log pi_trainer - log pi_reported > 0 (a systematic error: the ratio
    dose's noise at the same measured k3 is positive on about half of them), and over all sampled tokens log r
    averages KL(pi_trainer || pi_reported) > 0, many standard errors from 0 at the larger doses, where symmetric
    noise averages 0 (within 4 standard errors); the k3 grows with the dose (0.3: V1's raw logprobs at T 0.7)."""
    T = 0.7
    trainer_logp, top = sampled_logprobs(64 * 1024, 40, T, seed=1)
    own, mask = trainer_logp(1.0), torch.ones(64, 1024, dtype=torch.bool)
    assert 0.3 < float(top.double().mean()) < 0.95  # the likely tokens are most, not all, of the sample
    k3s = []
    for d in (0.03, 0.1, 0.3):
        log_r = own - mismatch_doses.start("onesided", d, 0, {}).reported(own, mask, 0, trainer_logp)
        assert bool((log_r[top] > 0).all()), d
        mean, se = float(log_r.mean()), float(log_r.std()) / math.sqrt(log_r.numel())
        assert mean > (5 * se if d >= 0.1 else 0), (d, mean, se)
        k3s.append(float((log_r.exp() - 1 - log_r).mean()))
        noise = own - mismatch_doses.noisy_logprobs(own, mask, k3s[-1], seed=0, step=0)
        assert abs(float(noise.mean())) < 4 * float(noise.std()) / math.sqrt(noise.numel())  # symmetric: mean 0
        assert 0.45 < float((noise[top] > 0).double().mean()) < 0.55
    assert 0 < k3s[0] < k3s[1] < k3s[2], k3s


@pytest.mark.parametrize("over, pattern", [
    ({"onesided_scale_error": [0.3, 1.0]}, r"'onesided_scale_error\[1\]' must be < 1, got 1.0"),
    ({"onesided_scale_error": [1.5]}, r"'onesided_scale_error\[0\]' must be < 1"),
    ({"onesided_scale_error": [0]}, r"'onesided_scale_error\[0\]' must be > 0, got 0.0"),
    ({"onesided_scale_error": [-0.1]}, r"'onesided_scale_error\[0\]' must be > 0"),
    ({"stale_steps": [2, -1]}, r"'stale_steps\[1\]' must be > 0, got -1"),
    ({"stale_steps": [0]}, r"'stale_steps\[0\]' must be > 0, got 0"),
    ({"stale_steps": [-0.5]}, r"'stale_steps\[0\]' must be > 0, got -0.5"),
    ({"stale_steps": ["2"]}, r"'stale_steps\[0\]' must be a number, got '2' \(str\)"),
    ({"stale_steps": [True]}, r"'stale_steps\[0\]' must be a number, got True \(bool\)"),
    ({"stale_steps": [np.float32(0.5)]}, r"'stale_steps\[0\]' must be a number, got .*\(float32\)"),
    ({"stale_steps": [2, 2.0]}, r"'stale_steps' lists an entry twice: \[2, 2\]"),
    ({"stale_steps": [0.5, 0.50000001]}, r"'stale_steps' has doses that print alike"),
])
def test_bad_doses_are_refused_naming_the_parameter(over, pattern):
    from rlwb import params

    with pytest.raises(ParamError, match=pattern) as e:
        params.load("08_mismatch_cost", overrides=over)
    assert "\n" not in str(e.value)


def test_stale_doses_are_counts_that_may_be_fractional():
    """A whole lag stays an int (`2.0` is read as 2: the same params, label and hash as before lags could be
    fractional), a fraction is a float with its own label; each row's dose reaches the loop."""
    from rlwb import params
    from rlwb.experiments.mismatch_study import design

    p = params.load("08_mismatch_cost", overrides={"stale_steps": [2.0, 0.25, 1.5]})
    assert p.stale_steps == [2, 0.25, 1.5] and type(p.stale_steps[0]) is int
    assert p.hash() == params.load("08_mismatch_cost", overrides={"stale_steps": [2, 0.25, 1.5]}).hash()
    stale = [r for r in p.grammar.doses if r.kind == "stale"]
    assert [(r.label, r.dose) for r in stale] == [("stale@2", 2.0), ("stale@0.25", 0.25), ("stale@1.5", 1.5)]
    job = next(j for j in design.training_runs(p) if j.label == "stale@0.25")
    assert (design.config(p, job).dose_kind, design.config(p, job).dose) == ("stale", 0.25)


def test_an_opt_in_kind_leaves_the_params_hash_of_studies_that_do_not_use_it():
    """A kind with no doses by default (`onesided`; a toy one here) adds a parameter every params object has, but
    hash-neutral while it lists none (`Params.HASH_NEUTRAL`): a study without it hashes as before the kind was
    registered (the runs of record reload to the hash they were archived with), one that lists a dose hashes
    otherwise. The kinds with default doses are hashed even when empty, as they always were."""
    import json
    from dataclasses import dataclass

    import yaml

    import rlwb.registry  # noqa: F401 (the schemas built before the toy kind is registered)
    from rlwb import params
    from rlwb.params.schemas.mismatch_cost import MismatchCostParams, with_dose_lists

    neutral = MismatchCostParams.HASH_NEUTRAL
    assert neutral["onesided_scale_error"] == [] and not {"ratio_k3", "weight_noise", "stale_steps"} & set(neutral)
    p = params.load("08_mismatch_cost", overrides={"weight_noise": []})
    assert p.onesided_scale_error == [] and p.hash() != params.load(
        "08_mismatch_cost", overrides={"weight_noise": [], "onesided_scale_error": [0.3]}).hash()
    assert p.hash() != params.load("08_mismatch_cost").hash()  # an empty list of a kind with default doses counts

    mismatch_doses.register_dose_kind("optin", order=98, title="t", panel_title="t", param="optin_doses", doses=(),
                                      gt=0, doc="opt-in toy doses")(mismatch_doses.Dose)
    try:
        @dataclass
        @with_dose_lists
        class WithOptIn(MismatchCostParams):  # the schema as built with one more opt-in kind registered
            pass
    finally:
        del mismatch_doses.DOSE_KINDS["optin"]
    base = MismatchCostParams(ratio_k3=[0.1], stale_steps=[])
    assert WithOptIn(ratio_k3=[0.1], stale_steps=[]).hash() == base.hash()
    assert WithOptIn(ratio_k3=[0.1], stale_steps=[], optin_doses=[0.5]).hash() != base.hash()

    checked = 0
    for d in sorted((REPO / "docs" / "runs" / "08_mismatch_cost").iterdir()):
        rec = json.loads((d / "run.json").read_text())
        if set(yaml.safe_load((d / "params.yaml").read_text())) & set(MismatchCostParams.RETIRED):
            continue  # archived with a param since retired, hashed with it
        assert params.load("08_mismatch_cost", [d / "params.yaml"]).hash() == rec["params_hash"], d.name
        checked += 1
    assert checked >= 2
