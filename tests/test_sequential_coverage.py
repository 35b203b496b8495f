"""The sequential rule's own coverage simulation (`sequential_coverage`): the rule's decision on a simulated first
pass, and the BMDL's coverage when the rule picks the doses the final fit pools."""

from __future__ import annotations

import numpy as np
import pytest

from rlwb.core.measure import bmd_coverage as cov
from rlwb.experiments.mismatch_study import sequential_coverage as sc


def test_the_rule_extends_the_doses_that_bracket_the_bmd_and_leaves_a_row_without_a_cost_alone():
    """A steep Hill truth: the first pass's BMD lies between two doses, and the rule extends at least those two
    (each to more than the first pass's 8, at most the cap); a flat truth with a small spread: no dose's interval
    holds -BMR and no BMD is in range, so nothing is extended."""
    rng = np.random.default_rng(3)
    c, y = cov.simulate(cov.TRUTHS["hill"][0], cov.DESIGN_08, 8, cov.SD_08, rng)
    counts = sc.extension(cov.DESIGN_08, c, y, num_seeds=8, max_seeds=30)
    from rlwb.core.measure import benchmark_dose as bd

    bmd = bd.fit_bmd(cov.DESIGN_08, c, y, n_boot=200, profile=False).bmd
    d = np.asarray(cov.DESIGN_08)
    below, above = np.flatnonzero(d <= bmd).max(), np.flatnonzero(d >= bmd).min()
    assert counts[below] > 8 and counts[above] > 8 and max(counts) <= 30, (bmd, counts)
    flat = cov.simulate(lambda x: 0.3 + 0 * np.asarray(x), cov.DESIGN_08, 8, 0.02, rng)
    assert sc.extension(cov.DESIGN_08, *flat, num_seeds=8, max_seeds=30) == (8, 8, 8, 8)


def test_the_bmdl_covers_the_true_bmd_when_the_rule_picks_the_doses():
    """24 studies of the Hill truth, the rule deciding each one's second pass (a first pass of 8, at most 30), 120
    resamples: the rule extends a dose in most studies, and the final fit's BMDL holds the true BMD in all but a
    clear loss (5 or more misses in ~22 bounded has probability 0.004 at 95% coverage). The measured coverage, 200
    studies a truth: docs/benchmark_dose.md."""
    r = sc.simulate_sequential_coverage("hill", studies=24, n_boot=120, seed=4)
    assert r.extended >= 0.8 and r.mean_runs > r.first_pass_runs
    assert r.coverage.bounded >= 19
    assert r.coverage.hits >= r.coverage.bounded - 4, r
    with pytest.raises(ValueError, match="num_seeds"):
        sc.simulate_sequential_coverage("hill", studies=1, num_seeds=40, max_seeds=30)
