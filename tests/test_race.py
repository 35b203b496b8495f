"""Notebook 07's ranking and verdicts on hand-made curves (the real race runs in test_notebooks' smoke test)."""

import numpy as np
import pandas as pd
import pytest

from rlwb import params as P
from rlwb.core.rl.correction_catalog import HEALTH
from rlwb.errors import ParamError
from rlwb.experiments import which_correction as W


def curves(final: dict, steps: int = 10) -> pd.DataFrame:
    """`final[(engine, correction)]` = per-seed reward held flat over the steps."""
    rows = []
    for (e, c), per_seed in final.items():
        for seed, r in enumerate(per_seed):
            for s in range(steps):
                rows.append({"step": s, "engine": e, "correction": c, "seed": seed, "reward_mean": r,
                             "mismatch_k3": 1e-3, "t_step": 0.5, "t_correction": 1e-4,
                             **{h: (0.5 if c == "x.mask" else 1.0) if h == "ess" else 0.0 for h in HEALTH}})
    return pd.DataFrame(rows)


def test_verdicts_are_tests_with_a_margin_holm_and_a_detectable_effect():
    """A gap shown inside the margin "recovers", one shown below 0 "falls short", a noisy one is "inconclusive"
    with the smallest gap it could have detected; `none` on a level that only changes the reported logprobs is
    the baseline by construction in the decoupled mode (not a test); no row is tested against a winner."""
    p = P.load("07_which_correction", overrides={"engines": ["vllm-v1-fixed", "vllm-v1-bf16", "vllm-v1-raw"],
                                                  "corrections": ["none", "tis", "icepop"], "num_seeds": 4,
                                                  "margin": 0.05})
    base = np.array([0.80, 0.82, 0.78, 0.80])
    c = curves({("vllm-v1-fixed", "none"): base,
                ("vllm-v1-bf16", "none"): base + [0.01, -0.01, 0.005, -0.005],  # tightly around the baseline
                ("vllm-v1-bf16", "tis"): base - 0.2 + [0.01, -0.01, 0.0, 0.005],  # clearly short of it
                ("vllm-v1-bf16", "icepop"): base + [0.1, -0.1, 0.08, -0.06],  # too noisy to say
                ("vllm-v1-raw", "none"): base,
                ("vllm-v1-raw", "tis"): base + [0.01, 0.0, 0.01, 0.0],
                ("vllm-v1-raw", "icepop"): base - 0.2 + [0.02, -0.01, 0.0, 0.0]})
    m = W.race_metrics(c, p)
    assert m["vllm-v1-fixed+none/gap"] == 0
    r = W.ranking(m, c, p)
    v = r.set_index(["level", "correction"])["verdict"].to_dict()
    assert v == {("vllm-v1-fixed", "none"): "baseline", ("vllm-v1-bf16", "none"): "recovers",
                 ("vllm-v1-bf16", "tis"): "falls short", ("vllm-v1-bf16", "icepop"): "inconclusive",
                 ("vllm-v1-raw", "none"): "= baseline (by construction)", ("vllm-v1-raw", "tis"): "recovers",
                 ("vllm-v1-raw", "icepop"): "falls short"}
    assert "vs_best" not in r.columns
    tested = r[r["p_diff_holm"].notna()]
    # one Holm family over both tests of the 5 rows: the smallest of the 10 p-values is multiplied by 10
    assert len(tested) == 5
    raw = np.r_[tested["p_diff"].to_numpy(), tested["p_equiv"].to_numpy()]
    adj = np.r_[tested["p_diff_holm"].to_numpy(), tested["p_equiv_holm"].to_numpy()]
    assert adj[np.argmin(raw)] == pytest.approx(min(1.0, 10 * raw.min()))
    assert (tested["equiv_sd_max"] > 0).all()
    noisy = r[(r["level"] == "vllm-v1-bf16") & (r["correction"] == "icepop")].iloc[0]
    assert noisy["mde"] > abs(noisy["gap"]) and noisy["mde"] > p.margin
    text = W.conclusion(m, r, p)
    assert "inconclusive: `icepop`" in text and "MDE" in text
    assert "one family over the race's 5 tested rows (10 p-values)" in text
    assert "bitwise as the baseline by construction" in text and "Measured otherwise" not in text
    # a level that should equal the baseline by construction but did not: said loudly
    c2 = c.copy()
    c2.loc[(c2["engine"] == "vllm-v1-raw") & (c2["correction"] == "none"), "reward_mean"] += 0.01
    m2 = W.race_metrics(c2, p)
    assert "Measured otherwise" in W.conclusion(m2, W.ranking(m2, c2, p), p)
    # a margin too tight for the spread turns "recovers" into "inconclusive": the verdict depends on it
    tight = P.load("07_which_correction", overrides={**{k: getattr(p, k) for k in ("engines", "corrections",
                                                                                      "num_seeds")}, "margin": 0.01})
    v2 = W.ranking(m, c, tight).set_index(["level", "correction"])["verdict"]
    assert v2[("vllm-v1-bf16", "none")] == "inconclusive"


def test_holm_matches_its_definition():
    from rlwb.core.measure.stats import holm

    adj = holm([0.01, 0.04, 0.03, 0.005, float("nan")])
    assert np.allclose(adj[:4], [0.03, 0.06, 0.06, 0.02]) and np.isnan(adj[4])


def test_one_seed_gives_no_verdict():
    p = P.load("07_which_correction", overrides={"engines": ["vllm-v1-fixed", "vllm-v1-bf16"],
                                                  "corrections": ["none", "tis"], "num_seeds": 1})
    c = curves({("vllm-v1-fixed", "none"): [0.8], ("vllm-v1-bf16", "none"): [0.7], ("vllm-v1-bf16", "tis"): [0.6]})
    m = W.race_metrics(c, p)
    r = W.ranking(m, c, p)
    assert set(r.loc[r["level"] == "vllm-v1-bf16", "verdict"]) == {"n/a"} and np.isnan(m["vllm-v1-bf16+tis/gap_ci_low"])
    assert "every verdict is n/a" in W.conclusion(m, r, p)


def test_params_need_none_and_no_duplicates():
    with pytest.raises(ParamError, match="must include 'none'"):
        P.load("07_which_correction", overrides={"corrections": ["tis"]})
    with pytest.raises(ParamError, match="lists an entry twice"):
        P.load("07_which_correction", overrides={"engines": ["vllm-v1-fixed", "vllm-v1-fixed"]})
    with pytest.raises(ParamError, match="not allowed"):
        P.load("07_which_correction", overrides={"corrections": ["none", "verl.nope"]})
