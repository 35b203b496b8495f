"""The prompts engines are measured on: the verifiable task, or open-ended text where a real model is uncertain.

Why two sources: the task's completions are peaked by design (a worked sum has one right next token almost
everywhere), so the engine-trainer gap there is decided by a handful of uncertain tokens. Errors that grow
with entropy (V1's raw logprobs, a bf16 head) show at their real size only where the model hesitates: on
natural text. `open_ended` prompts are half held-out corpus prefixes (the model continues Python source and
docstrings it never trained on) and half chat questions it was never tuned for.

Every function returns token ids: engines never see text, so tokenization cannot differ between engines.
"""

from __future__ import annotations

import numpy as np

from rlwb.core.data import tasks
from rlwb.core.data.tokenizer import PromptCodec

PROMPT_SOURCES = ("task", "open_ended")

# Chat questions for the open-ended source: everyday requests a chat model gets (none is in any SFT set here).
CHAT_QUESTIONS = [
    "Explain what a Python decorator does.",
    "Write a function that reverses a list.",
    "What is the difference between a list and a tuple?",
    "How do I read a file line by line?",
    "Describe how a hash table works.",
    "Why would a program raise a KeyError?",
    "Suggest a name for a module that parses dates.",
    "Write a docstring for a function that sorts users by age.",
    "What does the with statement do?",
    "How can I measure how long a function takes?",
    "Summarize what a context manager is for.",
    "What is recursion? Give a short example.",
    "How do I merge two dictionaries?",
    "Explain the difference between a thread and a process.",
    "Write a class that represents a bank account.",
    "What is a generator and when should I use one?",
]

PREFIX_CHARS = 240  # length of a held-out corpus prefix (about 60 BPE tokens; 240 tokens for the char policy)


def task_prompts(n: int, seed: int, heterogeneous: bool = False, codec: PromptCodec | None = None) -> list[list[int]]:
    """Token ids of `n` task prompts (chat questions when the codec's chat template is on). `heterogeneous`:
    every other prompt carries a long context of solved examples (up to ~40x longer; earlier chat turns with a
    template), so one batch mixes very different lengths - the case where batch composition changes kernels
    and hence logprobs."""
    codec = codec or PromptCodec()
    probs = tasks.make_problems(n, seed=seed)
    if not heterogeneous:
        return [codec.encode_task(p) for p in probs]
    rng = np.random.default_rng(seed)
    shots = tasks.make_problems(64, seed=seed + 7919)
    return [codec.encode_task(p, shots[: 0 if i % 2 == 0 else int(rng.integers(4, 12))])
            for i, p in enumerate(probs)]


def corpus_prefixes(n: int, seed: int, chars: int = PREFIX_CHARS) -> list[str]:
    """`n` text prefixes of held-out standard-library files (never in the chat model's pretraining), each
    starting at a line start, non-blank, `chars` long."""
    from rlwb.core.models.chat import corpus_split

    held = [t for t in corpus_split()[1] if len(t) > 4 * chars]
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < n:
        text = held[int(rng.integers(len(held)))]
        start = int(rng.integers(0, len(text) - 2 * chars))
        start = text.find("\n", start) + 1
        piece = text[start: start + chars]
        if len(piece) == chars and piece.strip():
            out.append(piece)
    return out


def open_ended_prompts(n: int, seed: int, codec: PromptCodec | None = None) -> list[list[int]]:
    """`n` prompts alternating a held-out corpus prefix and a chat question (seeded)."""
    codec = codec or PromptCodec()
    n_text = (n + 1) // 2
    texts = corpus_prefixes(n_text, seed)
    rng = np.random.default_rng(seed + 1)
    questions = [CHAT_QUESTIONS[i] for i in rng.permutation(np.arange(n - n_text) % len(CHAT_QUESTIONS))]
    out = []
    for i in range(n):
        out.append(codec.encode_text(texts[i // 2]) if i % 2 == 0 else codec.encode_question(questions[i // 2]))
    return out


def make_prompts(source: str, n: int, seed: int, codec: PromptCodec | None = None,
                 heterogeneous: bool = False) -> list[list[int]]:
    """The `prompt_source` param: `task` (the verifiable task) or `open_ended` (text and questions)."""
    if source == "task":
        return task_prompts(n, seed, heterogeneous, codec)
    if source == "open_ended":
        if heterogeneous:
            raise ValueError("heterogeneous_batch applies to task prompts only (open-ended prompts are already "
                             "of mixed lengths)")
        return open_ended_prompts(n, seed, codec)
    raise ValueError(f"prompt_source must be one of {PROMPT_SOURCES}, got {source!r}")
