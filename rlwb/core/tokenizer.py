"""A 64-symbol character tokenizer that loads in transformers 4.51 (vLLM 0.8.5) and 5.x (vLLM V1).

Why char-level: no hub download is possible here, every token is one character so alignment bugs are
visible by eye, and the vocabulary is small enough to return full-vocabulary logprobs at every step.
Saved as a `PreTrainedTokenizerFast` with `tokenizer_class` written explicitly, because transformers 5
otherwise writes `TokenizersBackend`, which transformers 4.51 cannot load.
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz") + list(" \n+-*=#,;:|.?()/<>!_'\"%&")
VOCAB = SPECIALS + CHARS
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
assert len(VOCAB) == 64 and len(set(VOCAB)) == 64


def build_tokenizer():
    """A fast tokenizer: one token per character, `<bos>` prepended, decode concatenates."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )


def save_tokenizer(tokenizer, path: str | Path) -> None:
    path = Path(path)
    tokenizer.save_pretrained(path)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # loadable by transformers 4.51 and 5.x
    cfg["model_max_length"] = 4096
    cfg_path.write_text(json.dumps(cfg, indent=2))


def encode_prompt(text: str) -> list[int]:
    """Token ids exactly as every engine receives them: `<bos>` + one id per character.

    rlwb sends token ids (never text) to engines, so BOS handling and tokenization cannot differ
    between engines and the trainer.
    """
    try:
        return [BOS_ID] + [VOCAB.index(c) for c in text]
    except ValueError as e:
        bad = sorted({c for c in text if c not in VOCAB})
        raise ValueError(f"prompt has characters outside the 64-symbol vocabulary: {bad}") from e


def decode(ids) -> str:
    """Text of ids, stopping at `<eos>`; other specials are dropped."""
    out = []
    for i in ids:
        if i == EOS_ID:
            break
        if i >= len(SPECIALS):
            out.append(VOCAB[i])
    return "".join(out)


class PromptCodec:
    """Text <-> token ids for the model under test: the char tokenizer for the embedded default policy,
    the model's own tokenizer (with its special tokens, e.g. BOS) for anything else."""

    def __init__(self, model_path=None):
        self.hf = None
        from pathlib import Path

        if model_path is not None and not (Path(str(model_path)) / "model.json").exists():
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(str(model_path))

    def encode(self, text: str) -> list[int]:
        return encode_prompt(text) if self.hf is None else list(self.hf(text)["input_ids"])

    def describe(self) -> str:
        """Which tokenizer this is, for provenance: "rlwb-char" or the HF tokenizer's class and path."""
        return "rlwb-char" if self.hf is None else f"{type(self.hf).__name__}({self.hf.name_or_path})"

    def decode(self, ids) -> str:
        if self.hf is None:
            return decode(ids)
        return self.hf.decode(list(ids), skip_special_tokens=True)
