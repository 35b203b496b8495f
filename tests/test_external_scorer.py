"""Your trainer's logprobs (rlwb/core/scoring/external.py): the contract with a real second scorer
(scripts/score_bf16_eager.py), every way a command can break it, and rlwb's scorer with a chosen attention kernel."""

import sys
import textwrap

import numpy as np
import pytest

from rlwb.core.data import tasks, tokenizer
from rlwb.core.scoring.external import ExternalScorer
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.errors import ScorerError
from rlwb.paths import REPO_ROOT

SCRIPT = f"{sys.executable} {REPO_ROOT / 'scripts' / 'score_bf16_eager.py'}"


@pytest.fixture(scope="module")
def sequences():
    """Eight task prompts and their worked answers (+ EOS): tokens the default policy writes."""
    probs = tasks.make_problems(8, seed=3)
    return ([tokenizer.encode_prompt(p.prompt) for p in probs],
            [tokenizer.encode_prompt(p.worked_answer)[1:] + [tokenizer.EOS_ID] for p in probs])


def _gap(a, b) -> float:
    return float(np.max(np.abs(np.concatenate(a) - np.concatenate(b))))


def test_the_bf16_eager_script_is_a_second_scorer_with_its_own_gap(default_model, sequences):
    prompts, comps = sequences
    fp32 = TrainerScorer(default_model.path).score(prompts, comps, temperature=0.7, top_k=5)["logp"]
    ext = ExternalScorer(SCRIPT, default_model.path)
    bf16 = ext.score(prompts, comps, temperature=0.7, top_k=5)["logp"]
    assert [len(x) for x in bf16] == [len(c) for c in comps]
    assert 1e-4 < _gap(bf16, fp32) < 0.5  # bf16 numerics: a real gap, not a broken scorer
    ours = TrainerScorer(default_model.path, "bfloat16", attn_implementation="eager").score(
        prompts, comps, temperature=0.7, top_k=5)["logp"]
    assert _gap(bf16, ours) < _gap(bf16, fp32)  # the same dtype and kernel in rlwb's scorer sit closer
    # the script in fp32 with SDPA reproduces rlwb's scorer: the contract's sampling distribution is the same one
    same = ExternalScorer(f"{SCRIPT} --dtype float32 --attn sdpa", default_model.path)
    assert _gap(same.score(prompts, comps, temperature=0.7, top_k=5)["logp"], fp32) < 1e-5
    assert ext.describe()["kind"] == "command" and ext.describe()["calls"] == 1


def _command(tmp_path, body: str) -> str:
    """A scorer command that writes what `body` (Python, given the parsed args `a` and the input rows `rows`)
    writes: a real process breaking the contract one way."""
    path = tmp_path / "scorer.py"
    path.write_text(textwrap.dedent("""
        import argparse, sys
        import pyarrow as pa, pyarrow.parquet as pq
        ap = argparse.ArgumentParser()
        for k in ("--model", "--input", "--output"):
            ap.add_argument(k)
        a = ap.parse_args()
        rows = pq.read_table(a.input).to_pylist()
        def write(lists, name="logprobs"):
            pq.write_table(pa.table({name: pa.array(lists, pa.list_(pa.float64()))}), a.output)
    """) + textwrap.dedent(body))
    return f"{sys.executable} {path}"


@pytest.mark.parametrize("body, message", [
    ("sys.exit('CUDA out of memory')", "exited with status 1: CUDA out of memory"),
    ("pass", "exited 0 but wrote no output.parquet"),
    ("open(a.output, 'w').write('nope')", "wrote output.parquet, which is not a Parquet file"),
    ("write([[0.0] * len(r['completion_token_ids']) for r in rows], name='lp')", "wrote no 'logprobs' column "
                                                                                "(columns: lp)"),
    ("write([[0.0] * len(r['completion_token_ids']) for r in rows][1:])", "wrote 1 rows for 2 completions"),
    ("write([[0.0] * (len(r['completion_token_ids']) + 1) for r in rows])", "row 0: 4 logprobs for 3 completion "
                                                                           "tokens"),
    ("write([[-1.0, float('nan'), -1.0], [-1.0, -1.0]])", "row 0, token 1: logprob is nan"),
    ("write([[-1.0, -1.0, -1.0], [-1.0, 0.3]])", "row 1, token 1: logprob 0.3 > 0 is not a log-probability"),
    ("write([[-1.0, -1.0, -1.0], None])", "row 1: logprobs is null"),
])
def test_a_command_that_breaks_the_contract_fails_with_one_line(tmp_path, body, message):
    cmd = _command(tmp_path, body)
    with pytest.raises(ScorerError) as e:
        ExternalScorer(cmd, "unused-model").score([[1, 5], [1, 6]], [[7, 8, 9], [10, 11]])
    assert message in str(e.value) and str(e.value).startswith(f"trainer command {cmd!r}") and "\n" not in str(e.value)


def test_a_command_that_cannot_start():
    with pytest.raises(ScorerError, match="could not start: No such file or directory: no-such-scorer"):
        ExternalScorer("no-such-scorer --x", "m").score([[1]], [[2]])


def test_rlwbs_scorer_takes_the_attention_kernel(default_model, sequences):
    prompts, comps = sequences
    sdpa = TrainerScorer(default_model.path)
    eager = TrainerScorer(default_model.path, attn_implementation="eager")
    assert (sdpa.describe()["attn_implementation"], eager.describe()["attn_implementation"]) == ("sdpa", "eager")
    assert _gap(eager.score(prompts, comps)["logp"], sdpa.score(prompts, comps)["logp"]) < 1e-5  # fp32 both
