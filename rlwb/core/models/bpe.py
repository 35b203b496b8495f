"""A byte-level BPE tokenizer with a chat template, trained here on text every machine has (issue #18).

Why: the embedded default policy's 64-symbol char tokenizer never exercises the path a real checkpoint takes
(multi-byte BPE tokens, no BOS, special tokens, a chat template, a vocabulary padded beyond the tokenizer).
No hub is reachable, so the corpus is the Python standard library of the interpreter running the build
(source and docstrings: natural English plus code), hashed into the recipe so another interpreter's library
builds another model instead of silently reusing this one.

Shape copied from Qwen2.5: byte-level BPE, digits split one per token (arithmetic stays learnable), no BOS,
`<|endoftext|>` (pad) and the ChatML turn markers `<|im_start|>` / `<|im_end|>` (end of a turn = EOS), and a
ChatML chat template written into `tokenizer_config.json`, where transformers 4.51 (vLLM 0.8.5's environment)
and 5.x both read it.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAD, IM_START, IM_END = SPECIALS
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def stdlib_files(root: Path | None = None) -> list[Path]:
    """The standard library's own modules, sorted (tests, site-packages and IDLE excluded)."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "idlelib", "__pycache__"}
    return sorted(f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts))


def stdlib_corpus(root: Path | None = None) -> tuple[list[str], str]:
    """(texts, sha256 of all of them in order): the pretraining corpus and its identity for the recipe."""
    h, texts = hashlib.sha256(), []
    for f in stdlib_files(root):
        text = f.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        h.update(text.encode())
    return texts, h.hexdigest()


def train_tokenizer(texts: list[str], vocab_size: int = 8192):
    """A `PreTrainedTokenizerFast`: byte-level BPE of `vocab_size` tokens (specials included), deterministic for
    the same texts."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 512:
        raise ValueError(f"vocab_size must be at least 512 (256 bytes + merges), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),  # one digit per token, as Qwen2
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=IM_END, pad_token=PAD,
                                   chat_template=CHAT_TEMPLATE, model_max_length=4096)


def save_tokenizer(tokenizer, path: str | Path) -> None:
    """`save_pretrained`, then the config both transformers generations read: the class named explicitly
    (5.x would write `TokenizersBackend`, which 4.51 cannot load) and the chat template inside
    `tokenizer_config.json` (5.x writes it to `chat_template.jinja` only)."""
    path = Path(path)
    tokenizer.save_pretrained(path)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=CHAT_TEMPLATE, model_max_length=4096,
               add_bos_token=False)
    cfg_path.write_text(json.dumps(cfg, indent=2))
