"""Every exception rlwb raises on purpose, in one place (so no module imports another just for an error type).

The user-facing ones say what is wrong and what to do; the CLI prints their message without a traceback.
"""

from __future__ import annotations

from pathlib import Path


class RlwbError(Exception):
    """Base of rlwb's own errors."""


class ParamError(RlwbError, ValueError):
    """A parameter is unknown, mistyped or out of range; the message names it and what is allowed."""


class PublishRefused(RlwbError, ValueError):
    """A run cannot become a run of record (`rlwb publish`); the message names the run, why, and what to do."""


class PresetError(ParamError):
    """An engine preset's name or definition is wrong; the message says which and what is allowed."""


class PromptFileError(ParamError):
    """A prompts file cannot be used: the message names the file, the row (1-based) and the field."""


class ScorerError(RlwbError, RuntimeError):
    """An external trainer scorer failed or broke its contract (rlwb/core/scoring/external.py); the message says
    which command, and what was wrong with what it wrote."""


class MemoryPlanError(RlwbError, ValueError):
    """The run cannot fit the GPU; the message says how much is needed, how much there is, and what to change."""


class EngineCrashed(RlwbError, RuntimeError):
    """The worker process died (or closed its pipe). `stderr_tail` holds the end of its log."""

    def __init__(self, preset: str, reason: str, stderr_tail: str):
        self.preset, self.stderr_tail = preset, stderr_tail
        super().__init__(f"engine {preset!r} crashed: {reason}\n--- last lines of its stderr ---\n{stderr_tail}")


class EngineError(RlwbError, RuntimeError):
    """The worker is alive but the operation failed inside it (its traceback is in the message)."""


class MismatchBreakerTripped(RlwbError, RuntimeError):
    """Raised by `MismatchBreaker.update` when the breaker trips (and `raise_on_trip` is set)."""

    def __init__(self, step: int, metric: str, value: float, threshold: float, saved: Path | None):
        self.step, self.metric, self.value, self.threshold, self.saved = step, metric, value, threshold, saved
        where = f"; the step's rollouts are in {saved}" if saved else ""
        super().__init__(f"engine/trainer mismatch at step {step}: windowed {metric} = {value:.3g} > {threshold:.3g} "
                         f"for the configured patience{where}")


class RunFailed(RlwbError, RuntimeError):
    """A run failed (`rlwb run`: the notebook raised; `rlwb bench`: a measurement did); it is archived (as failed)
    at `run_dir`."""

    def __init__(self, run_dir: Path, error: str):
        self.run_dir, self.error = run_dir, error
        super().__init__(f"run failed: {error}\narchived as failed: {run_dir}")


class PeerMissing(RlwbError, RuntimeError):
    """A peer's code (verl, SkyRL, OpenRLHF, TRL's block) is not where tests/peers.py looks; the message says
    how to install it."""


class SetupFailed(RlwbError, RuntimeError):
    """`rlwb engines setup` could not make an environment; the message has the failing command's last lines."""


class BMDInputError(RlwbError, ValueError):
    """A dose-response study's arrays cannot be fitted (rlwb/core/measure/benchmark_dose.py); the message names what is
    wrong: a shape, a dose, a missing value and where."""


class BMDSUnavailable(RlwbError, RuntimeError):
    """EPA's BMDS engine (pybmds) cannot be run: its environment (.venvs/bmds) is missing or its setup did not finish;
    the message says how to make it (`make bmds`)."""
