"""`rlwb readme-check` against real archived runs: the session's smoke runs of notebook 00 (tests/conftest.py
`notebook00_runs`: the first with seed 0, the newest with seed 5 and fewer eval prompts), and a README fragment
quoting their numbers rightly and wrongly, citing a wrong model build and a run this machine does not have."""

import json
from pathlib import Path

import pytest

from rlwb import readme_check
from tests.conftest import rlwb


def _run_id(run_dir: Path) -> str:
    return "-".join(run_dir.name.split("-")[:2])  # <UTC time>-<params hash>: the time stamp is the id


@pytest.mark.slow
def test_readme_check_recomputes_quoted_numbers_from_the_runs_cited(tmp_path, notebook00_runs):
    outputs, (first, _, second) = notebook00_runs
    m1, m2 = (json.loads((d / "metrics.json").read_text()) for d in (first, second))
    build = json.loads((first / "run.json").read_text())["model"]["weights_sha256_16"]
    tok1, tok2 = m1["policy/mean_completion_tokens"], m2["policy/mean_completion_tokens"]
    assert f"{tok1:.2f}" != f"{tok2:.2f}", "the two runs must differ where the README goes stale"
    params, acc2 = m1["policy/params"], m2["policy/greedy_accuracy"]
    readme = tmp_path / "README.md"
    readme.write_text(f"""# numbers
<!-- rlwb:run 00_default_policy/{_run_id(first)} build {build} -->
| model | {params:,}<!--=policy/params--> parameters | {tok1:.2f}<!--=policy/mean_completion_tokens--> tokens |
and once more, misquoted: **{tok1 + 1:.2f}**<!--=policy/mean_completion_tokens--> tokens.
<!-- rlwb:run 00_default_policy/{_run_id(second)} -->
The newer run's greedy accuracy, as a percentage: {100 * acc2:.1f}%<!--=policy/greedy_accuracy-->.
<!-- rlwb:run 00_default_policy/{_run_id(first)} build 0123456789abcdef -->
The first run again, said to come from another build: {params:,}<!--=policy/params-->.
<!-- rlwb:run 00_default_policy/20000101-000000 -->
A run this machine does not have: 1.0<!--=policy/params-->.
<!-- rlwb:run none -->
A number quoted without a metric is not checked: 12. Nor is code, so the README can show the format:
`1.0<!--=policy/params-->`, and in a block:
```
<!-- rlwb:run 00_default_policy/20000101-000000 -->
1.0<!--=policy/params-->
```
""")
    verdicts = readme_check.check(readme, outputs)
    assert [(v.quote.line, v.status) for v in verdicts] == [
        (3, "match"), (3, "stale"), (4, "mismatch"), (6, "match"), (8, "mismatch"), (10, "missing")]
    assert "the run says" in verdicts[2].detail and "0123456789abcdef" in verdicts[4].detail
    assert second.name in verdicts[1].detail  # stale: the newest run is named

    r = rlwb("readme-check", "--readme", str(readme), "--outputs", str(outputs))
    assert r.returncode == 1, r.stderr  # a mismatch against a present run
    assert "2 match, 2 mismatch, 1 stale, 1 missing of 6 quoted numbers" in r.stdout
    assert "not archived here (regenerate to check): 00_default_policy/20000101-000000" in r.stdout
    readme.write_text("\n".join(ln for ln in readme.read_text().splitlines() if "misquoted" not in ln
                                and "another build" not in ln))
    assert rlwb("readme-check", "--readme", str(readme), "--outputs", str(outputs)).returncode == 0  # stale, missing
    readme.write_text("A metric with no run declared: 1.0<!--=policy/params-->\n")
    r = rlwb("readme-check", "--readme", str(readme), "--outputs", str(outputs))
    assert r.returncode == 2 and "line 1" in r.stderr and "declares the run" in r.stderr
