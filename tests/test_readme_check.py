"""`rlwb readme-check` against real archived runs: the session's smoke runs of notebook 00 (tests/conftest.py
`notebook00_runs`: the first with seed 0, the newest with seed 5 and fewer eval prompts), and a README fragment
quoting their numbers rightly and wrongly, citing a wrong model build and a run this machine does not have."""

import json
import re
import subprocess
from pathlib import Path

import pytest

from rlwb import readme_check
from rlwb.paths import REPO_ROOT
from tests.conftest import copy_archive, rlwb


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
    # runs of record: a newer one with other params answers another question (no stale); one of the same params
    # hash that says otherwise supersedes the cited one (stale)
    published = tmp_path / "published"
    _, copies = copy_archive(outputs, published)
    for d in copies.values():
        info = json.loads((d / "run.json").read_text())
        (d / "run.json").write_text(json.dumps({**info, "published": {"from": "x", "left_out": []}}))
    assert readme_check.check(readme, published)[1].status == "match"
    newer = copies[second.name]
    info = json.loads((newer / "run.json").read_text())
    (newer / "run.json").write_text(json.dumps({**info, "params_hash": json.loads(
        (copies[first.name] / "run.json").read_text())["params_hash"]}))
    assert readme_check.check(readme, published)[1].status == "stale"
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


def test_the_default_check_reads_the_readme_then_every_docs_page(tmp_path):
    """Without `--readme`, README.md first, then every docs/**/*.md sorted; each page read on its own (a run
    declared in one does not hold in the next) and each verdict naming its file. Against an empty archive every
    quote is `missing`, which is not a failure (exit 0)."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text("<!-- rlwb:run 00_default_policy/20000101-000000 -->\n"
                                        "front page: 1.0<!--=policy/params-->\n")
    (tmp_path / "docs" / "setup.md").write_text("no numbers here\n")
    (tmp_path / "docs" / "results" / "00_default_policy.md").write_text(
        "# 00\n<!-- rlwb:run 00_default_policy/20000102-000000 build 0123456789abcdef -->\n"
        "| 804,000<!--=policy/params--> | 56.5%<!--=policy/greedy_accuracy--> |\n<!-- rlwb:run none -->\n")
    (tmp_path / "docs" / "notes.txt").write_text("1.0<!--=policy/params-->\n")  # not Markdown: not read
    assert readme_check.documents(tmp_path) == [tmp_path / "README.md", tmp_path / "docs" / "results" /
                                                "00_default_policy.md", tmp_path / "docs" / "setup.md"]
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    verdicts = readme_check.check_all(tmp_path, outputs)
    assert [(v.quote.file, v.quote.line, v.quote.key, v.status) for v in verdicts] == [
        ("README.md", 2, "policy/params", "missing"),
        ("docs/results/00_default_policy.md", 3, "policy/params", "missing"),
        ("docs/results/00_default_policy.md", 3, "policy/greedy_accuracy", "missing")]
    assert verdicts[2].quote.value == pytest.approx(0.565) and verdicts[1].quote.build == "0123456789abcdef"
    text = readme_check.report(verdicts)
    assert text.splitlines()[0].startswith("README.md:2  missing   00_default_policy/20000101-000000")
    assert text.splitlines()[2].startswith("docs/results/00_default_policy.md:3  missing")
    assert "0 match, 0 mismatch, 0 stale, 3 missing of 3 quoted numbers" in text
    # one file, as `--readme` reads it: named as before, by its file name
    one = readme_check.check(tmp_path / "README.md", outputs)
    assert readme_check.report(one).splitlines()[0].startswith("README.md:2  missing")
    # a page that quotes a metric without declaring its run is bad input naming the page and the line
    (tmp_path / "docs" / "setup.md").write_text("no run declared here: 2.0<!--=policy/params-->\n")
    with pytest.raises(ValueError, match=r"docs/setup\.md line 1: .*declares the run"):
        readme_check.check_all(tmp_path, outputs)


def test_the_repository_pages_check_against_an_empty_archive(tmp_path):
    """`rlwb readme-check` on this repository with nothing archived: every page read, nothing malformed, every
    quote `missing` (exit 0), the pages under docs/ named in the report."""
    r = rlwb("readme-check", "--outputs", str(tmp_path), timeout=120)
    assert r.returncode == 0, r.stderr
    # what matches comes from the runs of record (docs/runs), searched after the archive
    counts = re.search(r"^(\d+) match, 0 mismatch, (\d+) stale, (\d+) missing of (\d+) quoted numbers$", r.stdout, re.M)
    assert counts and sum(map(int, counts.groups()[:3])) == int(counts[4])
    assert re.search(r"^docs/results/\d\d_[a-z_]+\.md:\d+  (match|missing)", r.stdout, re.M)


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=rlwb-test", "-c", "user.email=test@rlwb", *args], cwd=repo, check=True,
                   capture_output=True)


def test_a_clean_clone_fails_on_a_drifted_number_and_on_a_run_not_shipped(tmp_path):
    """`rlwb readme-check --clean-clone REPO` on a made-up repository: a page quoting a number of a run shipped in
    its docs/runs passes; the same page committed with the number drifted, or citing a run that is not shipped,
    fails (exit 1) - what the suite asserts of this repository (below). Only what is committed counts: an edit left
    in the working tree is not in the clone."""
    repo = tmp_path / "repo"
    run = repo / "docs" / "runs" / "00_default_policy" / "20261125-221012-ab76d338"
    (run).mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "ok", "notebook": "00_default_policy"}))
    (run / "metrics.json").write_text(json.dumps({"policy/params": 803968, "policy/greedy_accuracy": 0.52}))
    page = repo / "docs" / "results" / "00_default_policy.md"
    page.parent.mkdir(parents=True)
    (repo / "README.md").write_text("# front page\n")
    good = ("<!-- rlwb:run 00_default_policy/20261125-221012 -->\n"
            "| 803,968<!--=policy/params--> | 52.0%<!--=policy/greedy_accuracy--> |\n")
    page.write_text(good)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a run of record and the page citing it")
    assert [v.status for v in readme_check.check_clean_clone(repo)] == ["match", "match"]
    page.write_text(good.replace("52.0%", "53.0%"))  # not committed: the clone does not see it
    assert [v.status for v in readme_check.check_clean_clone(repo)] == ["match", "match"]

    _git(repo, "commit", "-qam", "a number drifts from its run")
    r = rlwb("readme-check", "--clean-clone", str(repo), timeout=120)
    assert r.returncode == 1 and "1 match, 1 mismatch, 0 stale, 0 missing of 2" in r.stdout, r.stdout + r.stderr
    assert "the run says 0.52" in r.stdout

    page.write_text(good.replace("20261125-221012", "20261125-235959"))
    _git(repo, "commit", "-qam", "a citation of a run not shipped")
    verdicts = readme_check.check_clean_clone(repo)
    assert [v.status for v in verdicts] == ["missing", "missing"]
    assert verdicts[0].detail == "00_default_policy/20261125-235959 is not archived under <clone>/docs/runs"


def test_every_quoted_number_checks_on_a_clean_clone_of_this_repository():
    """README.md and every docs/**/*.md of a fresh clone of this repository (its committed HEAD), against the runs
    of record it ships: 0 mismatch and 0 missing."""
    verdicts = readme_check.check_clean_clone(REPO_ROOT)
    bad = [v for v in verdicts if v.status in ("mismatch", "missing")]
    assert verdicts and not bad, readme_check.report(bad)


@pytest.mark.engines
def test_a_clean_clone_checks_numbers_quoted_from_a_bench_run_of_record(bench_run, tmp_path):
    """A page quoting an `rlwb bench` run (tests/conftest.py `bench_run`: a real, small one) that `rlwb publish` put in
    a repository's docs/runs/bench/: on a clean clone the run is found among the runs of record, a number quoted
    rightly (with the build it ran on) matches, and a drifted one does not."""
    import shutil

    from rlwb import publish

    run_dir, measured = bench_run
    copy = tmp_path / "outputs" / "bench" / run_dir.name
    shutil.copytree(run_dir, copy)
    info = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**info, "git_dirty": False}))  # as if made from a committed tree
    repo = tmp_path / "repo"
    publish.publish(copy, repo / "docs" / "runs")
    (repo / "README.md").write_text("# front page\n")
    bs1, bs2 = measured["tput/hf/bs1"], measured["tput/hf/bs2"]
    (repo / "docs" / "performance.md").write_text(
        f"<!-- rlwb:run bench/{run_dir.name} build {info['model']['weights_sha256_16']} -->\n"
        f"`hf` at batch 1: {bs1:,.1f}<!--=tput/hf/bs1--> tokens/s; at batch 2, misquoted: "
        f"{bs2 * 1.1 + 1:,.1f}<!--=tput/hf/bs2--> tokens/s.\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a bench run of record and the page citing it")
    verdicts = readme_check.check_clean_clone(repo)
    assert [(v.quote.key, v.status) for v in verdicts] == [("tput/hf/bs1", "match"), ("tput/hf/bs2", "mismatch")]
    assert verdicts[1].detail == f"the run says {bs2:.6g}"


def test_a_metric_key_with_spaces_is_read_whole():
    """Notebook 08's contrast keys hold spaces (`contrast/one-sided vs symmetric/...`): the annotation names the
    whole key; a key cut at its first space would be a metric no run has (a mismatch)."""
    from rlwb.readme_check import parse

    text = ("<!-- rlwb:run 08_mismatch_cost/20261126-062300 -->\n"
            "worse by −0.060<!--=contrast/one-sided vs symmetric/vllm-v1/none@engine/diff-->"
            " and 4<!--=family/tests-->\n")
    quotes = parse(text)
    assert [(q.key, q.value) for q in quotes] == [("contrast/one-sided vs symmetric/vllm-v1/none@engine/diff", -0.060),
                                                 ("family/tests", 4.0)]
