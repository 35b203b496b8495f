"""Prompts from a file (rlwb/core/prompts/from_file.py): the three row shapes in JSONL and Parquet, and every bad row
named by file, row and field before any compute."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlwb.core.data import tokenizer
from rlwb.core.data.tokenizer import PromptCodec
from rlwb.core.prompts import from_file
from rlwb.errors import PromptFileError
from tests.conftest import rlwb


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _load(path, codec=None, context=4096):
    return from_file.load_prompts(path, codec or PromptCodec(), vocab_size=64, context=context, max_tokens=16)


def test_three_row_shapes_in_jsonl_and_parquet(tmp_path):
    ids = tokenizer.encode_prompt("58+67=")
    rows = [{"prompt": "58+67=", "id": "a"}, {"prompt_token_ids": ids}, {"prompt": "3+4=", "other": [1, 2]}]
    ps = _load(_jsonl(tmp_path / "p.jsonl", rows[:1] + [""] + rows[1:]))  # a blank line is not a row
    assert ps.token_ids == [ids, ids, tokenizer.encode_prompt("3+4=")]
    assert ps.fields == ["prompt", "prompt_token_ids", "prompt"] and ps.ids == ["a", "2", "3"]
    pq.write_table(pa.Table.from_pylist([{"prompt": "58+67=", "prompt_token_ids": None},
                                         {"prompt": None, "prompt_token_ids": ids}]), tmp_path / "p.parquet")
    assert _load(tmp_path / "p.parquet").token_ids == [ids, ids]
    assert len(ps.sha256) == 64


def test_chat_rows_go_through_the_models_chat_template(tmp_path, chat_smoke_model):
    codec = PromptCodec(chat_smoke_model.path)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 58+67?"}]
    ps = from_file.load_prompts(_jsonl(tmp_path / "c.jsonl", [{"messages": msgs}]), codec, vocab_size=8256,
                                   context=4096, max_tokens=16)
    assert ps.token_ids == [tokenizer.chat_prompt_ids(codec.hf, msgs)]
    assert codec.hf.decode(ps.token_ids[0]).rstrip().endswith("assistant")  # the generation header is there


@pytest.mark.parametrize("rows, where", [
    ([{"prompt": "1+1="}, {"prompt": "2+2=", "prompt_token_ids": [1, 5]}], "row 2: needs exactly one of"),
    ([{"prompt": "1+1="}, {"id": "x"}], "row 2: needs exactly one of prompt, messages, prompt_token_ids; has none"),
    ([{"prompt": "1+1="}, {"prompt": 3}], "row 2: field 'prompt': not readable"),  # pyarrow's own parse error
    ([{"prompt": ""}], "row 1: field 'prompt': must be non-empty text"),
    ([{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [1, 2.5]}], "row 2: field 'prompt_token_ids': must be a "
                                                                     "non-empty list of token ids"),
    ([{"prompt_token_ids": [1, -3]}], "row 1: field 'prompt_token_ids'"),
    ([{"prompt_token_ids": []}], "row 1: field 'prompt_token_ids'"),
    ([{"messages": [{"role": "wizard", "content": "hi"}]}], "row 1: field 'messages[0]': must be {role: one of"),
    ([{"prompt": "1+1="}, '{"prompt": "2+2="'], "row 2: not readable"),  # a broken JSON line
    ([{"prompt": "1+1=", "id": 1.5}], "row 1: field 'id': must be text or an integer"),
])
def test_a_bad_row_is_named_by_file_row_and_field(tmp_path, rows, where):
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(PromptFileError) as e:
        from_file.check_rows(path)
    assert str(e.value).startswith(f"prompts file {path}: ") and where in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("row, context, where", [
    ({"prompt": "58+67=€"}, 4096, "row 1: field 'prompt': prompt has characters outside the 64-symbol vocabulary"),
    ({"prompt_token_ids": [1, 64]}, 4096, "row 1: field 'prompt_token_ids': token id 64 is outside the model's "
                                          "vocabulary of 64"),
    ({"prompt": "58+67="}, 22, "row 1: field 'prompt': 7 prompt tokens + max_tokens 16 exceed the model's context "
                               "of 22 tokens"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 4096, "row 1: field 'messages': the model's tokenizer has no "
                                                              "chat template"),
])
def test_rows_the_model_cannot_take_are_named_before_any_engine_starts(tmp_path, row, context, where):
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "1+1="}, row])
    with pytest.raises(PromptFileError, match="row 2: " + where.removeprefix("row 1: ").replace("(", r"\(")
                       .replace(")", r"\)").replace("+", r"\+")):
        _load(path, context=context)


@pytest.mark.parametrize("name, content, where", [
    ("p.txt", "x", "unknown format '.txt'"), ("missing.jsonl", None, "no such file"),
    ("empty.jsonl", "", "has no rows"), ("p.parquet", "not parquet", "not readable as parquet"),
])
def test_files_that_are_not_prompt_files(tmp_path, name, content, where):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(PromptFileError, match=where):
        from_file.check_rows(path)


def test_rlwb_audit_refuses_a_bad_file_before_a_kernel_starts(tmp_path):
    """Exit 2, one line naming file, row and field, and nothing archived."""
    path = _jsonl(tmp_path / "bad.jsonl", [{"prompt": "1+1="}, {"prompt": "2+2=", "messages": []}])
    r = rlwb("audit", "--prompts", str(path), "--engine", "vllm-v1-processed", "--outputs", str(tmp_path / "out"),
             timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"prompts file {path}: row 2: needs exactly one of" in lines[0], r.stderr
    assert not (tmp_path / "out" / "10_audit").exists()
