"""Prompts from a file: an RL team's own training prompts, read with pyarrow and checked before any compute.

Why a file and not rlwb's generated prompts: whether an engine is on-policy with a trainer depends on where the
policy samples (its entropy there, the lengths, the chat template), so the audit that matters runs on the
prompts the team trains on. Why checked up front: a bad row found after an engine has started (or after an hour
of sampling) wastes the run; every problem here names the file, the row (1-based, blank JSONL lines not counted)
and the field, before anything starts.

A file is JSON Lines (`.jsonl`, `.json`) or Parquet (`.parquet`); each row has exactly one of

    prompt            text, tokenized with the model's tokenizer as it is (its special tokens, e.g. BOS; no chat
                      template): what a completion-style trainer feeds its policy
    messages          a chat, `[{"role": "user", "content": "..."}, ...]`, through the tokenizer's own chat template
                      with the assistant header added (`rlwb.core.data.tokenizer.chat_prompt_ids`)
    prompt_token_ids  the token ids themselves, sent as they are (what the engines receive in every case)

and optionally `id` (a string or number naming the row in reports). Other columns are ignored.

    {"prompt": "58+67="}
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 58+67?"}]}
    {"prompt_token_ids": [1, 12, 15, 44, 13, 14, 49], "id": "tokenized-by-my-trainer"}
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlwb.errors import PromptFileError

FIELDS = ("prompt", "messages", "prompt_token_ids")
ROLES = ("system", "user", "assistant", "tool")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class PromptRow:
    """One row of a prompts file, checked for shape (not yet tokenized)."""

    row: int  # 1-based
    field: str  # which of FIELDS it holds
    value: object  # str | list[dict] | list[int]
    id: str


@dataclass(frozen=True)
class PromptSet:
    """The prompts of a file as token ids, with where each came from (the archive keeps `path` and `sha256`)."""

    path: str
    sha256: str
    token_ids: list[list[int]]
    fields: list[str]
    ids: list[str]

    def __len__(self) -> int:
        return len(self.token_ids)


def _fail(path, row: int | None, field: str | None, problem: str) -> PromptFileError:
    where = "".join([f": row {row}" if row is not None else "", f": field {field!r}" if field else ""])
    return PromptFileError(f"prompts file {path}{where}: {problem}")


def read_table(path: str | Path):
    """The file as a pyarrow Table (JSON Lines through `pyarrow.json`, Parquet through `pyarrow.parquet`). A
    file that does not parse fails naming the row pyarrow stopped at (1-based)."""
    import pyarrow as pa

    p = Path(path).expanduser()
    kind = SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise _fail(path, None, None, f"unknown format {p.suffix!r}: use {', '.join(SUFFIXES)}")
    if not p.is_file():
        raise _fail(path, None, None, "no such file")
    if kind == "jsonl" and not p.read_bytes().strip():
        raise _fail(path, None, None, "has no rows")
    try:
        if kind == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(p)
        import pyarrow.json as pj

        # one block for the whole file: pyarrow numbers rows within a block, and its errors must name the file's row
        opts = pj.ReadOptions(block_size=max(p.stat().st_size + 1, 1 << 16))
        return pj.read_json(p, read_options=opts)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
        msg = str(e).replace("JSON parse error: ", "")
        m = re.search(r"^(.*) in row (\d+)$", msg)
        if m:  # pyarrow counts rows from 0
            field = re.match(r"Column\(/([^/)]+)", m.group(1))
            raise _fail(path, int(m.group(2)) + 1, field.group(1) if field else None,
                        f"not readable: {m.group(1)}") from None
        raise _fail(path, None, None, f"not readable as {kind}: {msg}") from None


def _check_row(path, row: int, rec: dict) -> PromptRow:
    present = [f for f in FIELDS if rec.get(f) is not None]
    if len(present) != 1:
        what = "none" if not present else " and ".join(present)
        raise _fail(path, row, None, f"needs exactly one of {', '.join(FIELDS)}; has {what}")
    field, value = present[0], rec[present[0]]
    if field == "prompt":
        if not isinstance(value, str) or not value:
            raise _fail(path, row, field, f"must be non-empty text, got {value!r}")
    elif field == "messages":
        if not isinstance(value, list) or not value:
            raise _fail(path, row, field, f"must be a non-empty list of {{role, content}}, got {value!r}")
        for i, m in enumerate(value):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                raise _fail(path, row, f"messages[{i}]", f"must be {{role: one of {', '.join(ROLES)}, content: "
                                                          f"text}}, got {m!r}")
    else:
        # a column pyarrow read as floats (one row held a float) keeps integral values: 5.0 is token 5
        ids = [int(t) if isinstance(t, float) and t.is_integer() else t for t in value] \
            if isinstance(value, list) else value
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0), None) \
            if isinstance(ids, list) and ids else ids
        if bad is not None:
            raise _fail(path, row, field, f"must be a non-empty list of token ids (ints >= 0); found {bad!r}")
        value = ids
    rid = rec.get("id")
    if rid is not None and not isinstance(rid, (str, int)):
        raise _fail(path, row, "id", f"must be text or an integer, got {rid!r}")
    return PromptRow(row, field, value, str(row) if rid is None else str(rid))


def check_rows(path: str | Path) -> list[PromptRow]:
    """Every row of the file, checked for shape: exactly one prompt field, of the right type, non-empty. Needs
    no model, so parameter validation runs it before a kernel starts."""
    table = read_table(path)
    if table.num_rows == 0:
        raise _fail(path, None, None, "has no rows")
    if not set(FIELDS) & set(table.column_names):
        raise _fail(path, None, None, f"has none of the columns {', '.join(FIELDS)} (columns: "
                                      f"{', '.join(table.column_names)})")
    cols = [c for c in (*FIELDS, "id") if c in table.column_names]
    return [_check_row(path, i + 1, rec) for i, rec in enumerate(table.select(cols).to_pylist())]


def model_limits(model_path) -> tuple[int, int]:
    """(vocabulary size, context length in tokens) from a model directory's config.json."""
    cfg = json.loads((Path(str(model_path)) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    return int(cfg["vocab_size"]), int(cfg.get("max_position_embeddings") or 1 << 30)


def encode_row(r: PromptRow, codec) -> list[int]:
    """A checked row as token ids, through `codec` (`rlwb.core.data.tokenizer.PromptCodec` of the model under test)."""
    from rlwb.core.data.tokenizer import chat_prompt_ids

    if r.field == "prompt_token_ids":
        return list(r.value)
    if r.field == "prompt":
        return codec.encode(r.value)
    if codec.hf is None or not getattr(codec.hf, "chat_template", None):
        raise ValueError("the model's tokenizer has no chat template: write `prompt` or `prompt_token_ids` rows")
    return chat_prompt_ids(codec.hf, r.value)


def load_prompts(path: str | Path, codec, *, vocab_size: int, context: int, max_tokens: int) -> PromptSet:
    """Every prompt of the file as token ids for the model behind `codec`, or a `PromptFileError` naming the
    first bad row: a shape problem, text the tokenizer cannot encode, chat rows without a chat template, a token
    id outside the vocabulary, or a prompt that leaves no room for `max_tokens` in the context."""
    rows = check_rows(path)
    out = []
    for r in rows:
        try:
            ids = encode_row(r, codec)
        except ValueError as e:
            raise _fail(path, r.row, r.field, str(e)) from None
        if not ids:
            raise _fail(path, r.row, r.field, "encodes to no tokens")
        top = max(ids)
        if top >= vocab_size:
            raise _fail(path, r.row, r.field, f"token id {top} is outside the model's vocabulary of {vocab_size}")
        if len(ids) + max_tokens > context:
            raise _fail(path, r.row, r.field, f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the "
                                              f"model's context of {context} tokens")
        out.append(ids)
    digest = hashlib.sha256(Path(path).expanduser().read_bytes()).hexdigest()
    return PromptSet(str(path), digest, out, [r.field for r in rows], [r.id for r in rows])
