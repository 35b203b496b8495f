"""`rlwb validate`: hypothesis-drawn cases through real engines, checked against the fp32 trainer."""

import json
from pathlib import Path

import pytest

from rlwb.core.scoring import equivalence
from rlwb.core.scoring.trainer import TrainerScorer
from tests.conftest import rlwb

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def fp32_scorer(default_model):
    return TrainerScorer(default_model.path, "float32")


@pytest.mark.parametrize("name", ["vllm-v1-processed", "vllm-v0"])
def test_processed_logprob_engine_passes_every_drawn_case(name, engine, fp32_scorer):
    rep = equivalence.validate(engine(name), fp32_scorer, cases=12, seed=0, progress=False)
    assert rep.pass_rate == 1.0, rep.table()
    assert rep.shrunk is None
    cases = [r.case for r in rep.results]
    # the drawn cases span the axes: batches, temperatures, truncation, several samples, long prompts
    assert any(len(c.prompt_lens) > 1 for c in cases) and any(c.temperature != 1.0 for c in cases)
    assert any(c.top_k > 0 or c.top_p < 1 for c in cases) and any(c.n > 1 for c in cases)
    assert any(max(c.prompt_lens) > 32 for c in cases)
    assert all(r.n_tokens > 0 for r in rep.results)


def test_raw_logprob_engine_fails_and_the_shrunk_case_names_the_cause(engine, fp32_scorer):
    """V1's default logprobs are raw: they ignore temperature *and* top-k/top-p. The shrunk case keeps exactly
    one such processing step (here: top_k=1 at T=1, where the processed logprob is 0 and the raw one is not)
    and shrinks everything else to one request, one sample, one token."""
    rep = equivalence.validate(engine("vllm-v1"), fp32_scorer, cases=12, seed=0, progress=False)
    assert rep.pass_rate < 1.0
    failing = [r.case for r in rep.results if not r.passed]
    assert all(c.temperature != 1.0 or c.top_p < 1 or c.top_k > 0 for c in failing)
    s = rep.shrunk
    assert s is not None and not rep.shrunk_result.passed
    processing = [s.temperature != 1.0, s.top_p < 1.0, s.top_k > 0]
    assert sum(processing) == 1, f"exactly one sampling-processing step is left: {s}"
    assert s.n == 1 and len(s.prompt_lens) == 1 and s.max_tokens == 1, f"everything else shrinks away: {s}"
    d = rep.to_dict()
    assert d["pass_rate"] == rep.pass_rate and d["shrunk_case"]["top_k"] == s.top_k


def test_cli_exit_codes_and_json(tmp_path, default_model):
    out = tmp_path / "v.json"
    r = rlwb("validate", "--engine", "hf", "--cases", "4", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PASS" in r.stdout and json.loads(out.read_text())["cases"] == 4
    bad = rlwb("validate", "--engine", "no-such-preset")
    assert bad.returncode == 2 and "no-such-preset" in bad.stderr


def test_prompts_are_built_with_the_models_own_tokenizer_even_without_bos(tmp_path):
    """A byte-level BPE tokenizer without BOS (as Qwen2.5's): prompts of exactly the drawn length, cut from
    the left, decoding to the task's text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rlwb.core.data import tasks, tokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [f"{p.prompt}{p.worked_answer};" for p in tasks.make_problems(500, seed=1)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(tmp_path)
    codec = tokenizer.PromptCodec(tmp_path)
    assert codec.encode("") == [] and codec.describe().endswith(f"({tmp_path})")
    for length in (1, 7, 60, 400):
        ids = equivalence.prompt_ids(length, 5, codec)
        assert len(ids) == length
        assert "+" in codec.decode(equivalence.prompt_ids(60, 5, codec))
    assert codec.decode(equivalence.prompt_ids(60, 5, codec)).endswith("=")  # ends with the question
