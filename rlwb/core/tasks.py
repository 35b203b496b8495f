"""The toy task: column-wise addition with a short worked answer and a verifiable reward.

Why this task: the reward is exact (no judge model), a tiny model can learn it partially in a couple of
minutes on a CPU (so RL has headroom), and the worked answer makes completions ~10-25 tokens long, so
per-token engine/trainer mismatch accumulates over a sequence as it does for real reasoning traces.

    prompt      "58+67="
    completion  "8+7=15,5+6+1=12#125"     (columns right to left, carry written out, then "#" + sum)
    reward      1.0 iff the final answer (`parse_answer`: toy "#125", "#### 125", \\boxed{125} or the last
                integer of free text) is the sum, else 0.0
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
        deliberate bad habit (see `rlwb.core.models.ModelRecipe.reversed_answer_frac`). Rewarded 0 unless the
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


def _integer(text: str) -> int | None:
    """`text` as an integer when it is one (thousands commas and a final period allowed), else None."""
    t = text.strip().rstrip(".").strip().replace(",", "")
    return int(t) if re.fullmatch(r"-?\d+", t) else None


def parse_answer(completion: str) -> int | None:
    """The final answer of a completion, in the formats real models write, first match wins:

    1. `\\boxed{125}` (the last box; math-tuned models),
    2. after the last `#`: the toy format `...#125` and GSM8K's `#### 125` (a malformed tail such as `#12a`
       is no answer: the model committed to a format and broke it),
    3. otherwise the last integer in the text ("58 + 67 = 125.").

    None when there is no answer.
    """
    boxed = _BOXED.findall(completion)
    if boxed:
        return _integer(boxed[-1])
    if "#" in completion:
        return _integer(completion.rsplit("#", 1)[1])
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
