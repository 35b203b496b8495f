"""Property-based equivalence validator: random cases through a real engine, checked against the trainer.

Why property-based: engines went wrong on specific corners — T != 1 with raw logprobs, truncated
sampling without renormalisation, long or mixed-length batches — that a fixed test list misses. The
hypothesis library draws cases over every such axis (prompt length from 1 token to near the context,
homogeneous and very heterogeneous batches, temperature, top-p, top-k, max_tokens, n) and, for an engine
that fails, shrinks a failing case to a minimal one, which usually names the cause by itself (on
`vllm-v1`: one 1-token prompt, one generated token, T = 1 but top_k = 1 — raw logprobs ignore truncation
as well as temperature). https://hypothesis.readthedocs.io

A case passes when the largest |logp_engine - logp_trainer| over its tokens is within `tolerance`, the
trainer scoring every token under the sampling distribution the engine sampled from (temperature, then
top-k, then top-p, renormalised: `rlwb.core.scoring.trainer.process_logits`).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

import numpy as np

from rlwb.core.data import tasks, tokenizer
from rlwb.core.measure import metrics as M
from rlwb.core.scoring.rollouts import sample_and_score
from rlwb.core.scoring.trainer import TrainerScorer
from rlwb.engines.worker import EngineWorker, Sampling

TOLERANCE = 1e-3  # max |Δlogp| per case; fp32 processed-logprob engines sit near 1e-5 on this model
SHRINK_BUDGET = 120  # engine calls the shrinker may spend on one failing case


@dataclass(frozen=True)
class Case:
    prompt_lens: tuple[int, ...]  # one request per entry: the batch's composition
    temperature: float
    top_p: float
    top_k: int  # 0 = off
    max_tokens: int
    n: int  # samples per request
    seed: int

    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_tokens=self.max_tokens,
                        seed=self.seed, n=self.n)


@dataclass
class CaseResult:
    case: Case
    abs_dlogp_max: float
    k3_mean: float
    n_tokens: int
    passed: bool


@dataclass
class Report:
    engine: str
    tolerance: float
    results: list[CaseResult]
    shrunk: Case | None = None  # a minimal failing case, when any case failed
    shrunk_result: CaseResult | None = None
    settings: dict = field(default_factory=dict)

    @property
    def pass_rate(self) -> float:
        return float(np.mean([r.passed for r in self.results])) if self.results else float("nan")

    def worst(self, k: int = 3) -> list[CaseResult]:
        return sorted(self.results, key=lambda r: -r.abs_dlogp_max)[:k]

    def to_dict(self) -> dict:
        k3 = np.array([r.k3_mean for r in self.results])
        return {"engine": self.engine, "tolerance": self.tolerance, "cases": len(self.results),
                "pass_rate": self.pass_rate,
                "worst_abs_dlogp": max((r.abs_dlogp_max for r in self.results), default=None),
                "k3_quantiles": {q: float(np.quantile(k3, q)) for q in (0.0, 0.5, 0.9, 1.0)} if k3.size else {},
                "worst_cases": [case_row(r) for r in self.worst()],
                "shrunk_case": case_row(self.shrunk_result) if self.shrunk_result else None,
                "settings": self.settings}

    def table(self) -> str:
        lines = [f"{self.engine}: {sum(r.passed for r in self.results)}/{len(self.results)} cases within "
                 f"max |Δlogp| <= {self.tolerance:g} (pass rate {self.pass_rate:.0%})",
                 f"{'batch':>6} {'max len':>7} {'T':>5} {'top_p':>5} {'top_k':>5} {'max_tok':>7} {'n':>2} "
                 f"{'max|Δlogp|':>11} {'k3':>9}  ok"]
        for r in self.worst(5):
            c = r.case
            lines.append(f"{len(c.prompt_lens):>6} {max(c.prompt_lens):>7} {c.temperature:>5.2f} {c.top_p:>5.2f} "
                         f"{c.top_k:>5} {c.max_tokens:>7} {c.n:>2} {r.abs_dlogp_max:>11.2e} {r.k3_mean:>9.1e}  "
                         f"{'yes' if r.passed else 'NO'}")
        if self.shrunk_result:
            lines.append(f"minimal failing case: {describe(self.shrunk_result.case)} -> max |Δlogp| "
                         f"{self.shrunk_result.abs_dlogp_max:.2e}")
        return "\n".join(lines)


def case_row(r: CaseResult) -> dict:
    return {**asdict(r.case), "prompt_lens": list(r.case.prompt_lens), "abs_dlogp_max": r.abs_dlogp_max,
            "k3_mean": r.k3_mean, "n_tokens": r.n_tokens, "passed": r.passed}


def describe(c: Case) -> str:
    return (f"{len(c.prompt_lens)} request(s) of {list(c.prompt_lens)} prompt tokens, T={c.temperature:g}, "
            f"top_p={c.top_p:g}, top_k={c.top_k}, max_tokens={c.max_tokens}, n={c.n}")


def case_strategy(max_context: int, max_batch: int = 16, max_new: int = 24):
    """Cases over every axis. Each axis shrinks toward its benign value (T = 1, no truncation, one short
    request, one token, n = 1), so a shrunk failing case keeps only what makes it fail."""
    from hypothesis import strategies as st

    longest = max(2, max_context - max_new - 1)
    short = st.lists(st.integers(1, 32), min_size=1, max_size=max_batch)
    long = st.lists(st.integers(33, longest), min_size=0, max_size=2)  # up to near the context: heterogeneous
    return st.builds(
        Case,
        prompt_lens=st.tuples(short, long).map(lambda sl: tuple(sl[0] + sl[1])),
        temperature=st.one_of(st.just(1.0), st.floats(0.25, 2.0).map(lambda t: round(t, 2))),
        top_p=st.one_of(st.just(1.0), st.floats(0.5, 1.0).map(lambda p: round(p, 2))),
        top_k=st.one_of(st.just(0), st.integers(1, 40)),
        max_tokens=st.integers(1, max_new),
        n=st.integers(1, 3),
        seed=st.integers(0, 2**16),
    )


def prompt_ids(length: int, index: int, codec: tokenizer.PromptCodec) -> list[int]:
    """A task prompt of exactly `length` tokens under the model's own tokenizer: solved examples as
    context, cut from the left; a BOS the tokenizer adds stays first (tokenizers without one, as Qwen's,
    are cut plainly)."""
    lead = codec.encode("")  # what the tokenizer puts before any text: [BOS] or nothing
    n = 2 + length // 8
    while True:  # a tokenizer merging characters needs more examples for the same length
        probs = tasks.make_problems(n, seed=10_000 + index)
        text = "".join(f"{p.prompt}{p.worked_answer};" for p in probs[1:]) + probs[0].prompt
        ids = codec.encode(text)
        if len(ids) >= length or n > 64 * length:
            break
        n *= 2
    body = ids[len(lead):]
    keep = max(0, length - len(lead))
    return (lead + body[len(body) - keep:])[:length] if keep else lead[:length]


def run_case(worker: EngineWorker, scorer: TrainerScorer, case: Case, tolerance: float,
             codec: tokenizer.PromptCodec | None = None) -> CaseResult:
    codec = codec or tokenizer.PromptCodec()
    prompts = [prompt_ids(L, i, codec) for i, L in enumerate(case.prompt_lens)]
    ro = sample_and_score(worker, scorer, prompts, case.sampling(), raw=False)
    e, t = ro.flat()
    lr = t - e
    worst = float(np.max(np.abs(lr))) if lr.size else 0.0
    return CaseResult(case, worst, M.k3(lr) if lr.size else 0.0, int(lr.size), bool(worst <= tolerance))


def validate(worker: EngineWorker, scorer: TrainerScorer, cases: int = 50, seed: int = 0, tolerance: float = TOLERANCE,
             max_context: int | None = None, shrink: bool = True, progress: bool = True) -> Report:
    """Draw `cases` cases with hypothesis (seeded: the same cases for every engine), run each, and shrink
    one failing case to a minimal example."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from rlwb.progress import progress_bar

    if cases < 1:
        raise ValueError(f"cases must be >= 1, got {cases}")
    if tolerance <= 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    max_context = max_context or int(worker.info().get("settings", {}).get("max_model_len")
                                     or scorer.model.config.max_position_embeddings)
    strategy = case_strategy(max_context)
    codec = tokenizer.PromptCodec(worker.model)  # the model's own tokenizer (char codec for the default)
    results: list[CaseResult] = []
    bar = progress_bar(total=cases, desc=f"validate {worker.preset.name}", disable=not progress)
    quiet = settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
                     suppress_health_check=list(HealthCheck))

    @hseed(seed)
    @quiet
    @given(strategy)
    def draw(case):
        results.append(run_case(worker, scorer, case, tolerance, codec))
        bar.update(1)

    draw()
    bar.close()
    report = Report(worker.preset.name, tolerance, results,
                    settings={"cases": cases, "seed": seed, "max_context": max_context,
                              "tokenizer": codec.describe()})
    if shrink and any(not r.passed for r in results):
        report.shrunk_result = shrink_failure(worker, scorer, strategy, tolerance, seed, codec)
        report.shrunk = report.shrunk_result.case if report.shrunk_result else None
    return report


def shrink_failure(worker, scorer, strategy, tolerance: float, seed: int, codec) -> CaseResult | None:
    """hypothesis.find: the simplest case that fails, within `SHRINK_BUDGET` engine calls."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    calls = {"n": 0}

    def fails(case: Case) -> bool:
        if calls["n"] >= SHRINK_BUDGET:
            return False  # budget spent: keep the simplest failure found so far
        calls["n"] += 1
        return not run_case(worker, scorer, case, tolerance, codec).passed

    try:
        case = find(strategy, fails, settings=settings(max_examples=60, database=None, deadline=None,
                                                       phases=[Phase.generate, Phase.shrink],
                                                       suppress_health_check=list(HealthCheck)),
                    random=random.Random(seed))
    except NoSuchExample:
        return None
    return run_case(worker, scorer, case, tolerance, codec)
