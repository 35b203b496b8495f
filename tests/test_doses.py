"""Notebook 08's doses (`rlwb.core.rl.mismatch_doses`): the ratio dose hits its intended k3, is paired (the same noise
for every arm of a seed and step, token by token) and stays symmetric where the policy is confident; the weight dose is
a fixed perturbation per seed of the stated relative size. The kinds are a registry (`DOSE_KINDS`) the study reads
everywhere: a new kind registered here flows into the params, the study's grammar and the loop's hooks, and a
misspelt one is refused with the name it resembles. Pure functions: no engine needed."""

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from rlwb.core.rl import mismatch_doses
from rlwb.errors import ParamError


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
    with pytest.raises(ValueError, match=">= 1"):
        mismatch_doses.LaggedWeights(w, lag=0)


def test_the_registry_holds_the_three_kinds_in_report_order():
    kinds = mismatch_doses.dose_kinds()
    assert [(k.name, k.param, k.unit) for k in kinds] == [
        ("ratio", "ratio_k3", float), ("weights", "weight_noise", float), ("stale", "stale_steps", int)]
    assert mismatch_doses.kinds_for(raw=True) == ["ratio"]
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
    """A kind of dose as a new one is added: one registration (a `Dose` and its fields), removed after the test."""
    @mismatch_doses.register_dose_kind(
        "toykind", order=99, title="toy mismatch (reported logprobs shifted)", panel_title="toy mismatch\n(shifted)",
        param="toykind_shift", doses=(0.1, 0.2), gt=0, doc="toy doses: a constant shift of the reported logprobs",
        samples_right=True, dose_words="shift {:g}")
    class Shift(mismatch_doses.Dose):
        def __init__(self, dose, seed, initial):
            self.shift, self.reports = dose, True

        def reported(self, logp, mask, step):
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
    assert dose.reports and torch.equal(dose.reported(logp, mask, step=0), logp + 0.2 * mask)
    assert dose.synced(w := {"w": torch.zeros(1)}) is w  # hooks it does not override leave the engine alone
    # read everywhere: the figure's panels, the kinds a raw-logprob engine is placed against, a row's intended k3
    assert list(kind_titles())[-1] == "toykind" and mismatch_doses.kinds_for(raw=True) == ["ratio", "toykind"]
    assert analysis.panel_of("engine", raw=True) == "ratio" and analysis.control_of("toykind", "none@trainer", 0.7,
                                                                                     False) == ""
    # the base schema (built before the toy kind) accepts its rows where a sweep's cell has none of its doses
    assert MismatchCostParams(row_arms=["toykind@0.5 none@engine"]).arms_of("toykind@0.5", []) == ["none@engine"]
    with pytest.raises(ParamError, match=r"'toykid@0.1' is neither a dose row .*: unknown dose kind 'toykid'; did "
                                         r"you mean 'toykind'\?"):
        MismatchCostParams(row_arms=["toykid@0.1 none@engine"])
    with pytest.raises(ParamError, match=r"unknown dose kind 'toykid'; did you mean 'toykind'\?"):
        GRPOConfig(dose_kind="toykid", dose=0.1)
    with pytest.raises(ParamError, match="'long_doses' names rows no dose list has"):
        ToyParams(long_steps=100, long_doses=["toykind@0.3"])
