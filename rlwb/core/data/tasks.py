"""The toy task: column-wise addition with a short worked answer and a verifiable reward.

Why this task: the reward is exact (no judge model), a tiny model can learn it partially in a couple of
minutes on a CPU (so RL has headroom), and the worked answer makes completions ~10-25 tokens long, so
per-token engine/trainer mismatch accumulates over a sequence as it does for real reasoning traces.

    prompt      "58+67="
    completion  "8+7=15,5+6+1=12#125"     (columns right to left, carry written out, then "#" + sum)
    reward      1.0 iff the final answer (`parse_answer`: \\boxed{125}, "#### 125", the toy's trailing "#125", "the
                answer is 125" or the last integer of free text) is the sum, else 0.0
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    a: int
    b: int

    @property
    def prompt(self) -> str:
        return f"{self.a}+{self.b}="

    @property
    def question(self) -> str:
        """The task as a chat question, for models with a chat template (the user turn's content)."""
        return f"What is {self.a}+{self.b}?"

    @property
    def answer(self) -> int:
        return self.a + self.b

    @property
    def worked_answer(self) -> str:
        """The SFT target: one `x+y(+1)=s` step per column, right to left, then `#sum`."""
        da, db = str(self.a)[::-1], str(self.b)[::-1]
        steps, carry = [], 0
        for i in range(max(len(da), len(db))):
            x = int(da[i]) if i < len(da) else 0
            y = int(db[i]) if i < len(db) else 0
            s = x + y + carry
            steps.append(f"{x}+{y}" + ("+1" if carry else "") + f"={s}")
            carry = s // 10
        return ",".join(steps) + f"#{self.answer}"

    @property
    def reversed_answer(self) -> str:
        """The worked answer with the final sum's digits reversed ("...#521" for 125): the SFT corpus's
        deliberate bad habit (see `rlwb.core.models.llama.ModelRecipe.reversed_answer_frac`). Rewarded 0 unless the
        sum is a palindrome, so RL can find the fix from the reward alone."""
        return self.worked_answer.rsplit("#", 1)[0] + f"#{str(self.answer)[::-1]}"


def make_problems(n: int, seed: int, max_digits: int = 3) -> list[Problem]:
    """`n` problems drawn from a seeded RNG: operands with 1..max_digits digits (uniform in digit count)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if max_digits < 1:
        raise ValueError(f"max_digits must be >= 1, got {max_digits}")
    rng = random.Random(seed)

    def operand() -> int:
        d = rng.randint(1, max_digits)
        return rng.randint(0 if d == 1 else 10 ** (d - 1), 10**d - 1)

    return [Problem(operand(), operand()) for _ in range(n)]


_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_INTEGER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+")
# GSM8K's final line: `#### 125` (spaces optional), the last one wins
_GSM8K = re.compile(r"####[ \t]*(\S*)")
# the toy's answer: a lone `#` (no `#` beside it) whose tail runs to the end of the text without whitespace:
# `...=12#125`, `#521`, a malformed `#12a`, an empty `...=7#`. A markdown heading (`### Solution`, `# Answer\n`)
# or a reference inside prose (`Issue #3: 58+67 = 125`) is no answer marker: the `#` is doubled or its tail has
# whitespace in it.
_TOY = re.compile(r"(?<!#)#(?!#)([^\s#]*)\s*$")
# an answer announced in prose: "the answer is 125", "Final answer: **125**", "answer = $125$"
_ANNOUNCED = re.compile(r"answer\s*(?:is|:|=)\s*[*$\\(\[{\s]*(-?\d{1,3}(?:,\d{3})+(?!\d)|-?\d+)", re.I)


def _integer(text: str) -> int | None:
    """`text` as an integer when it is one (thousands commas and a final period allowed), else None."""
    t = text.strip().rstrip(".").strip().replace(",", "")
    return int(t) if re.fullmatch(r"-?\d+", t) else None


def parse_answer(completion: str) -> int | None:
    """The final answer of a completion, in the formats real models write, first match wins:

    1. `\\boxed{125}` (the last box; math-tuned models),
    2. GSM8K's `#### 125` (the last one),
    3. the toy format's trailing `#125` (`8+7=15,5+6+1=12#125`): a lone `#` at the end of the text; a malformed
       tail such as `#12a` is no answer (the model committed to the format and broke it),
    4. an answer announced in prose: `The answer is 125.`, `Final answer: **125**`,
    5. otherwise the last integer in the text (`58 + 67 = 125.`, `**125**`, `$125$`).

    A `#` counts only where it marks an answer: markdown headings (`### Solution`) and references in prose
    (`Issue #3: ...`) fall through to the rules after it, so an instruct model is not scored 0 for formatting.
    On the embedded models' own format this reads exactly what the earlier rule (the text after the last `#`)
    read, except where that tail held whitespace (measured: `tests/test_tasks.py`).

    None when there is no answer.
    """
    boxed = _BOXED.findall(completion)
    if boxed:
        return _integer(boxed[-1])
    gsm8k = _GSM8K.findall(completion)
    if gsm8k:
        return _integer(gsm8k[-1])
    toy = _TOY.search(completion)
    if toy:
        return _integer(toy.group(1))
    announced = _ANNOUNCED.findall(completion)
    if announced:
        return _integer(announced[-1])
    found = _INTEGER.findall(completion)
    return _integer(found[-1]) if found else None


def is_reversed(problem: Problem, completion: str) -> bool:
    """The completion shows the SFT habit: its answer is the sum reversed (palindromic sums excluded)."""
    digits = str(problem.answer)
    return digits != digits[::-1] and parse_answer(completion) == int(digits[::-1])


def reward(problem: Problem, completion: str) -> float:
    """Verifiable reward: 1.0 when the completion's final answer equals the sum, else 0.0. Pure."""
    return 1.0 if parse_answer(completion) == problem.answer else 0.0


def parse_prompt(prompt: str) -> Problem:
    """Inverse of `Problem.prompt`, for rewarding completions of prompts stored as text."""
    try:
        a, b = prompt.rstrip("=").split("+")
        return Problem(int(a), int(b))
    except ValueError as e:
        raise ValueError(f"not a task prompt (expected 'A+B='): {prompt!r}") from e
