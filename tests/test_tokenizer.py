import json
import subprocess

import pytest

from rlwb.core.data import tokenizer

TEXT = "58+67=8+7=15,5+6+1=12#125"


def test_encode_decode_round_trip():
    ids = tokenizer.encode_prompt(TEXT)
    assert ids[0] == tokenizer.BOS_ID and len(ids) == len(TEXT) + 1
    assert tokenizer.decode(ids[1:] + [tokenizer.EOS_ID, 5]) == TEXT


def test_unknown_characters_are_named():
    with pytest.raises(ValueError, match=r"\['A'\]"):
        tokenizer.encode_prompt("1+A=")


def test_saved_tokenizer_matches_rlwb_encoding(default_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model.path)
    assert tok("12+3=")["input_ids"] == tokenizer.encode_prompt("12+3=")
    assert tok.decode(tokenizer.encode_prompt(TEXT), skip_special_tokens=True) == TEXT
    assert json.loads((default_model.path / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "PreTrainedTokenizerFast"


@pytest.mark.engines
def test_saved_tokenizer_loads_in_transformers_4_51(default_model):
    """vLLM 0.8.5's environment has transformers 4.51, which cannot load 5.x's TokenizersBackend."""
    from rlwb.engines import resolve_preset

    py = resolve_preset("vllm-v0").python
    code = ("import sys, transformers; from transformers import AutoTokenizer; "
            "t = AutoTokenizer.from_pretrained(sys.argv[1]); print(transformers.__version__, t('12+3=')['input_ids'])")
    out = subprocess.run([str(py), "-c", code, str(default_model.path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    version, ids = out.stdout.strip().split(" ", 1)
    assert version.startswith("4.51")
    assert json.loads(ids) == tokenizer.encode_prompt("12+3=")
