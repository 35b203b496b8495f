"""Notebook 08's study, by concern: its design (`design`), its execution on real engines (`execution`), the
analysis of its curves (`analysis`: per-run and per-row tables, verdicts and metrics; `comparisons`: the trends and
benchmark doses, the paired contrasts, the long horizon and the one Holm family). The notebook's entry is
`rlwb.experiments.mismatch_cost` (`run`, `CostResult`); its sentences are `rlwb.experiments.wording.mismatch_cost`."""
