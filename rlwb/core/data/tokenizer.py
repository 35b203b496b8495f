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


CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def normalize_text(text: str) -> str:
    """Text the 64-symbol vocabulary can encode: lower-cased, tabs as spaces, other symbols dropped. Only for
    natural-text prompts (held-out corpus prefixes, chat questions) given to the char-level default policy."""
    known = set(CHARS)
    return "".join(c for c in text.lower().replace("\t", " ") if c in known)


def chat_prompt_ids(hf_tokenizer, messages: list[dict] | str) -> list[int]:
    """Token ids of a conversation (or one user turn) plus the assistant header, through the tokenizer's own
    chat template (transformers 5 returns a BatchEncoding where 4.x returned a list)."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    out = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def uses_char_tokenizer(card: dict) -> bool:
    """Does the embedded model of this model card take the 64-symbol char tokenizer (the default policy, or a
    checkpoint variant of it)?"""
    return card.get("name") == "rlwb-default-policy" or card.get("tokenizer") == "rlwb-char"


class PromptCodec:
    """Text <-> token ids for the model under test: the char tokenizer for the embedded default policy,
    the model's own tokenizer (its special tokens, e.g. BOS, and its chat template) for anything else.

    `chat_template`: "auto" builds task prompts and questions with the tokenizer's chat template when it has
    one (an instruct model answers a bare "58+67=" poorly), "on" requires one, "off" never uses it. Either
    way engines receive token ids, never text.
    """

    def __init__(self, model_path=None, chat_template: str = "auto"):
        from pathlib import Path

        if chat_template not in CHAT_TEMPLATE_MODES:
            raise ValueError(f"chat_template must be one of {CHAT_TEMPLATE_MODES}, got {chat_template!r}")
        self.hf = None
        card = Path(str(model_path)) / "model.json" if model_path is not None else None
        char_model = model_path is None or (card.exists() and uses_char_tokenizer(json.loads(card.read_text())))
        if not char_model:
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(str(model_path))
        has_template = self.hf is not None and bool(getattr(self.hf, "chat_template", None))
        if chat_template == "on" and not has_template:
            raise ValueError(f"chat_template is 'on' but the tokenizer of {model_path or 'the default policy'} "
                             f"has no chat template (use 'auto' or 'off')")
        self.chat = has_template and chat_template != "off"

    def encode(self, text: str) -> list[int]:
        """Raw text (no chat template): the tokenizer's own special tokens only (BOS where it has one)."""
        return encode_prompt(text) if self.hf is None else list(self.hf(text)["input_ids"])

    def encode_continuation(self, text: str) -> list[int]:
        """Text that continues a prompt (a completion to score): no special tokens at all."""
        if self.hf is None:
            return encode_prompt(text)[1:]  # no <bos>
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        """Natural text to continue, e.g. a corpus prefix (normalized for the char vocabulary)."""
        return self.encode(normalize_text(text) if self.hf is None else text)

    def encode_question(self, question: str, history: list[tuple[str, str]] = ()) -> list[int]:
        """A user question (after `history`'s (question, answer) turns): through the chat template when on,
        else as plain text."""
        if self.chat:
            msgs = [m for q, a in history for m in ({"role": "user", "content": q},
                                                     {"role": "assistant", "content": a})]
            return chat_prompt_ids(self.hf, msgs + [{"role": "user", "content": question}])
        text = "".join(f"{q}{a};" for q, a in history) + question
        return self.encode(normalize_text(text) if self.hf is None else text)

    def encode_task(self, problem, shots: list = ()) -> list[int]:
        """A task problem (after solved `shots`): the chat question when the template is on, else the toy
        format `A+B=` the default policy was trained on."""
        if self.chat:
            return self.encode_question(problem.question, [(s.question, s.worked_answer) for s in shots])
        return self.encode("".join(f"{s.prompt}{s.worked_answer};" for s in shots) + problem.prompt)

    def describe(self) -> str:
        """Which tokenizer this is, for provenance: "rlwb-char" or the HF tokenizer's class and path."""
        if self.hf is None:
            return "rlwb-char"
        return f"{type(self.hf).__name__}({self.hf.name_or_path}){', chat template' if self.chat else ''}"

    def decode(self, ids) -> str:
        if self.hf is None:
            return decode(ids)
        return self.hf.decode(list(ids), skip_special_tokens=True)
