"""Your trainer's logprobs: a scorer that is a command, so the audit's reference is the trainer an RL team runs.

Why a command and not a Python hook: a team's trainer lives in its own environment (Megatron, FSDP, another
torch); a process boundary and a Parquet file are the one interface every stack can meet. The contract (also in
docs/results/10_audit.md, "Audit your own stack"):

    CMD --model MODEL --input IN.parquet --output OUT.parquet

`CMD` is the command as given (split like a shell does), `MODEL` the model directory (or hub id) the audit runs,
`IN.parquet` one row per completion with the columns

    prompt_token_ids      list<int64>   the prompt, as the engine received it
    completion_token_ids  list<int64>   the tokens the engine sampled
    temperature           float64       the sampling distribution the tokens came from: softmax of the logits / T,
    top_p                 float64       truncated to the top-k tokens (0 = off), then to the top-p nucleus (1 = off),
    top_k                 int64         renormalised (vLLM's order; `rlwb.core.scoring.trainer.process_logits`)

and `OUT.parquet` must hold one row per input row, in the same order, with the column

    logprobs              list<float>   per completion token, log p(token | prompt, earlier tokens) under that
                                        distribution: as many as the row's completion tokens, finite, <= 0

The command must exit 0. Anything else fails the audit with one line naming the command and the first problem
(`ScorerError`): it could not start, exited non-zero (with its stderr's last line), ran past the timeout, wrote no
file or no Parquet, no `logprobs` column, another row count, a row of another length, a NaN or infinite value, a
positive logprob. Row numbers in messages are 0-based, as in the files. A scorer that ignores temperature or
truncation is not refused: the audit measures exactly that gap.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from rlwb.errors import ScorerError

LOGPROB_SLACK = 1e-4  # a logprob above this is no log-probability (float rounding of log 1 stays below it)


def write_input(path: Path, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float,
                top_k: int, top_p: float) -> None:
    """`IN.parquet` of the contract."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = len(prompt_ids)
    table = pa.table({"prompt_token_ids": pa.array([list(map(int, p)) for p in prompt_ids], pa.list_(pa.int64())),
                      "completion_token_ids": pa.array([list(map(int, c)) for c in completion_ids],
                                                       pa.list_(pa.int64())),
                      "temperature": pa.array([float(temperature)] * n, pa.float64()),
                      "top_p": pa.array([float(top_p)] * n, pa.float64()),
                      "top_k": pa.array([int(top_k)] * n, pa.int64())})
    pq.write_table(table, path)


def read_output(path: Path, completion_lens: list[int], who: str) -> list[np.ndarray]:
    """`OUT.parquet` checked against the contract: per row, the completion's logprobs (float64)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.exists():
        raise ScorerError(f"{who} exited 0 but wrote no {path.name}")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ScorerError(f"{who} wrote {path.name}, which is not a Parquet file: {e}") from None
    if "logprobs" not in table.column_names:
        raise ScorerError(f"{who} wrote no 'logprobs' column (columns: {', '.join(table.column_names) or 'none'})")
    if table.num_rows != len(completion_lens):
        raise ScorerError(f"{who} wrote {table.num_rows} rows for {len(completion_lens)} completions")
    out = []
    for i, (row, n) in enumerate(zip(table.column("logprobs").to_pylist(), completion_lens)):
        if row is None:
            raise ScorerError(f"{who}: row {i}: logprobs is null")
        if len(row) != n:
            raise ScorerError(f"{who}: row {i}: {len(row)} logprobs for {n} completion tokens")
        a = np.asarray([np.nan if v is None else v for v in row], dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            raise ScorerError(f"{who}: row {i}, token {bad[0]}: logprob is {a[bad[0]]} ({bad.size} non-finite in "
                              f"the row)")
        pos = np.flatnonzero(a > LOGPROB_SLACK)
        if pos.size:
            raise ScorerError(f"{who}: row {i}, token {pos[0]}: logprob {a[pos[0]]:.4g} > 0 is not a log-probability")
        out.append(a)
    return out


class ExternalScorer:
    """A trainer's scorer behind the contract above; `score` has `TrainerScorer.score`'s signature, so
    `rlwb.core.scoring.rollouts.sample_and_score` and the audit take either."""

    def __init__(self, command: str, model, timeout: float = 3600.0, cwd=None):
        """`cwd`: where the command runs (the audit runs it from the repository root)."""
        self.command, self.model, self.timeout, self.cwd = command, str(model), timeout, cwd
        self.argv = shlex.split(command)
        if not self.argv:
            raise ScorerError("the trainer command is empty")
        self.last_stderr = ""
        self.calls = 0

    def describe(self) -> dict:
        return {"kind": "command", "command": self.command, "calls": self.calls,
                "stderr_tail": self.last_stderr[-2000:]}

    def score(self, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float = 1.0,
              top_k: int = 0, top_p: float = 1.0, raw: bool = False, full: bool = False, entropy: bool = False,
              batch_size: int = 64) -> dict[str, list[np.ndarray]]:
        """Per sequence `logp` from the command. `raw`, `full` and `entropy` are what rlwb's own scorer adds; the
        contract asks a trainer for its logprobs only, so they are not returned (and not asked of it)."""
        from rlwb import timing

        who = f"trainer command {self.command!r}"
        with timing.phase("scoring"), tempfile.TemporaryDirectory(prefix="rlwb-scorer-") as d:
            src, dst = Path(d) / "input.parquet", Path(d) / "output.parquet"
            write_input(src, prompt_ids, completion_ids, temperature, top_k, top_p)
            argv = [*self.argv, "--model", self.model, "--input", str(src), "--output", str(dst)]
            t0 = time.perf_counter()
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout, cwd=self.cwd,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
            except OSError as e:  # not found, not executable
                raise ScorerError(f"{who} could not start: {e.strerror}: {e.filename}") from None
            except subprocess.TimeoutExpired:
                raise ScorerError(f"{who} ran past {self.timeout:.0f} s") from None
            self.calls += 1
            self.last_stderr = r.stderr or ""
            self.seconds = time.perf_counter() - t0
            if r.returncode != 0:
                last = next((ln.strip() for ln in reversed(r.stderr.splitlines()) if ln.strip()), "(no stderr)")
                raise ScorerError(f"{who} exited with status {r.returncode}: {last}")
            logp = read_output(dst, [len(c) for c in completion_ids], who)
        return {"logp": logp}
