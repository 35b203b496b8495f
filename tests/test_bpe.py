"""The BPE tokenizer of the realistic embedded model (issue #18): trained on the standard library, no BOS,
ChatML specials, a chat template both transformers generations load, round trips."""

import subprocess
from pathlib import Path

import pytest

from rlwb.core.data.tokenizer import chat_prompt_ids
from rlwb.core.models import bpe

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    texts, digest = bpe.stdlib_corpus()
    tok = bpe.train_tokenizer(texts, 8192)
    path = tmp_path_factory.mktemp("tok")
    bpe.save_tokenizer(tok, path)
    return path, texts, digest


def test_corpus_is_the_standard_library_and_hashed():
    texts, digest = bpe.stdlib_corpus()
    assert len(texts) > 500 and sum(map(len, texts)) > 5_000_000
    assert digest == bpe.stdlib_corpus()[1] and len(digest) == 64
    assert not any("site-packages" in str(f) or "/test/" in str(f) for f in bpe.stdlib_files())


def test_vocabulary_specials_and_no_bos(saved):
    from transformers import AutoTokenizer

    path, _, _ = saved
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == 8192 and tok.bos_token is None
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    ids = tok("def add(a, b):\n    return a + b  # 125")["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[0] == "def"  # nothing prepended
    assert [tok.decode([i]) for i in tok("12345")["input_ids"]] == list("12345")  # one digit per token
    assert tok.decode(ids) == "def add(a, b):\n    return a + b  # 125"
    assert any(len(tok.decode([i]).encode()) > 3 for i in ids)  # multi-byte merges, not characters


def test_chat_template_round_trips_in_both_transformers_generations(saved):
    from transformers import AutoTokenizer

    path, _, _ = saved
    tok = AutoTokenizer.from_pretrained(path)
    ids = chat_prompt_ids(tok, "What is 58+67?")
    assert tok.decode(ids) == "<|im_start|>user\nWhat is 58+67?<|im_end|>\n<|im_start|>assistant\n"
    v0 = REPO / ".venvs" / "vllm-v0" / "bin" / "python"  # transformers 4.51, what vLLM 0.8.5 loads with
    code = ("import sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "ids = t.apply_chat_template([{'role': 'user', 'content': 'What is 58+67?'}], "
            "add_generation_prompt=True, tokenize=True); print(list(ids))")
    out = subprocess.run([str(v0), "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert eval(out.stdout.strip()) == ids  # noqa: S307 (a list of ints printed by the line above)
