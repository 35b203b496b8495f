"""`EngineWorker`: the kernel's handle on one engine running in its own process and environment.

The notebook kernel never imports vLLM: each engine runs `server.py` under its preset's interpreter, in a
new process group (so closing it also ends vLLM's engine-core children), and talks over its stdin/stdout
pipes. Its stderr goes to a log file whose tail is attached to `EngineCrashed` when it dies. On CPU, V1
workers are forked from a process that has imported vLLM already (`forking.py`); others start fresh.
"""

from __future__ import annotations

import atexit
import math
import os
import select
import signal
import subprocess
import tempfile
import time
import warnings
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rlwb import timing
from rlwb.engines import forking, protocol
from rlwb.engines.presets import Preset, resolve_preset, unsupported_here
from rlwb.errors import EngineCrashed, EngineError, PresetError

SERVER = Path(__file__).with_name("server.py")
_LIVE: weakref.WeakSet[EngineWorker] = weakref.WeakSet()




def reports_raw_logprobs(info: dict) -> bool:
    """Does the engine described by `info()` report raw (pre-temperature, untruncated) logprobs?

    vLLM V1 does unless its `logprobs_mode` says processed (its default is `raw_logprobs`; V1 versions older
    than the setting always report raw ones, hence "unless", not "if raw"). V0 and the hf reference report
    the processed (sampling) distribution's logprobs."""
    mode = str((info.get("settings") or {}).get("logprobs_mode", ""))
    return info.get("engine") == "v1" and "processed" not in mode


def expected_agreement(settings: dict, raw: bool) -> str:
    """What an engine reporting `settings` (its `info()["settings"]`) must match against an fp32 trainer, from what
    it says it runs, not from its name: "float floor" (fp32 weights and KV cache, processed logprobs), "raw gap"
    (fp32, raw logprobs: at the floor against the trainer's raw logprobs) or "low-precision band" (bf16/fp16
    weights or an fp8 KV cache). `rlwb engines check` holds every preset to it; GRPO grids flag a float-floor engine
    that leaves its floor during a run."""
    lossy = (str(settings.get("dtype", "float32")) not in ("float32", "torch.float32")
             or "fp8" in str(settings.get("kv_cache_dtype", "")))
    return "low-precision band" if lossy else ("raw gap" if raw else "float floor")


@dataclass(frozen=True)
class Sampling:
    """Per-request sampling settings, as vLLM's `SamplingParams` (top_k = 0 means off).

    `seed` is a base: request i of a `generate` call is sampled with seed + i, so a request's sample does
    not depend on which other requests share its batch.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 32
    seed: int | None = 0
    n: int = 1
    ignore_eos: bool = False

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.max_tokens, int) and self.max_tokens >= 1):
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if not (isinstance(self.n, int) and self.n >= 1):
            raise ValueError(f"n must be an int >= 1, got {self.n!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")


@dataclass
class Completion:
    """One sampled completion. `logprobs[i]` is what the engine reported for `token_ids[i]`."""

    request_id: int
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: np.ndarray  # [L] float32
    text: str
    finish_reason: str
    full: np.ndarray | None = None  # [L, V] float32 log-distribution, when asked for


def _close_all() -> None:
    for w in list(_LIVE):
        w.close()


atexit.register(_close_all)


def without_aliases(state: dict) -> dict:
    """A state dict safetensors can write: on the CPU, every name with its own memory.

    Why: with tied embeddings (Qwen2.5-0.5B) `model.embed_tokens.weight` and `lm_head.weight` are one tensor,
    and safetensors refuses to write shared memory. The alias is written as a copy rather than dropped: with
    the embedding alone, vLLM V1's layerwise reload left the tied engine 0.5 nat from the trainer (measured;
    V0 was at the float floor either way, it skips `lm_head.weight` of a tied model)."""
    out, seen = {}, set()
    for k, v in state.items():
        t = v.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.dtype) if t.numel() else None
        out[k] = t.cpu().clone() if key is not None and key in seen else t.contiguous().cpu()
        seen.add(key)
    return out


def generate_requests(prompts: list[list[int]], sampling: Sampling | list[Sampling]) -> list[dict]:
    """The `generate` requests a worker receives: one `Sampling` for all prompts gives request i the seed
    `seed + i` (distinct streams, reproducible)."""
    if isinstance(sampling, Sampling):
        sampling = [Sampling(**{**asdict(sampling), "seed": None if sampling.seed is None else sampling.seed + i})
                    for i in range(len(prompts))]
    if len(sampling) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(sampling)} sampling settings")
    for i, p in enumerate(prompts):
        if not p or not all(isinstance(t, (int, np.integer)) and t >= 0 for t in p):
            raise ValueError(f"prompt {i} must be a non-empty list of token ids >= 0")
    return [{"prompt_token_ids": [int(t) for t in p], "sampling": asdict(s)} for p, s in zip(prompts, sampling)]


def worker_spec(preset: Preset, model: str, dtype: str = "float32", extra_vllm_kwargs: dict | None = None) -> dict:
    """What the worker process is started with (`server.py` builds its engine from it): the preset's settings
    for this machine. `rlwb bench` builds its in-process baseline from the same spec, so both run one config."""
    from rlwb.engines.presets import cuda_available, engine_kwargs

    return {"backend": preset.backend, "model": str(model), "dtype": dtype,
            "vllm_kwargs": engine_kwargs({**preset.vllm_kwargs, **(extra_vllm_kwargs or {})}, cuda=cuda_available()),
            "fp32_lm_head": preset.fp32_lm_head, "reset_prefix_cache_on_update": preset.reset_prefix_cache_on_update,
            "full_vocab_limit": preset.full_vocab_limit, "idle_spin_s": preset.idle_spin_s}


class EngineWorker:
    """Start with `EngineWorker(preset, model)` (or as a context manager); `close()` ends it.

    `model` is a directory or an HF id as the engine understands it; `dtype` is the engine's weights and
    activations dtype (float32 / bfloat16 / float16).
    """

    def __init__(self, preset: str | Preset, model: str | os.PathLike, dtype: str = "float32",
                 start_timeout: float = 900.0, extra_vllm_kwargs: dict | None = None, log_dir: str | None = None,
                 wait: bool = True, check_host: bool = True):
        """`wait=False` returns as soon as the process is launched: it imports its engine and builds it in the
        background while the caller does other work (`iter_engines` starts the next engine that way), and
        the first call that needs it, or `wait_ready()`, waits for the rest. Start-up errors surface there.
        An engine this machine is known to refuse (`presets.unsupported_here`) raises `EngineError` at once,
        without a process; `check_host=False` starts it anyway (to see the engine's own refusal)."""
        self._info: dict | None = None
        self._start_error: BaseException | None = None
        self._t_launch = time.perf_counter()
        self.start_s = float("nan")  # launch to ready, wall seconds (overlapping other work when prefetched)
        with timing.phase("engine_start"):
            self._launch(preset, model, dtype, extra_vllm_kwargs, log_dir, check_host)
        self._start_deadline = time.monotonic() + start_timeout
        if wait:
            self.wait_ready()

    def _launch(self, preset, model, dtype, extra_vllm_kwargs, log_dir, check_host) -> None:
        self.preset = resolve_preset(preset) if isinstance(preset, str) else preset
        if self.preset.backend == "openai":
            raise PresetError(f"engine preset {self.preset.name!r} is a served engine (backend openai): rlwb starts "
                              f"no process for it; audit it with `rlwb audit --engine {self.preset.name}`")
        why = unsupported_here(self.preset, model=model) if check_host else None
        if why:
            raise EngineError(f"engine {self.preset.name!r} cannot start on this machine: {why}")
        self.preset.check_interpreter()
        self.model, self.dtype = str(model), dtype
        self._tmp = tempfile.TemporaryDirectory(prefix=f"rlwb-{self.preset.name}-",
                                                dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        # Inside `rlwb run` the log is part of the archive (logs/engine-<preset>.log): when an engine dies,
        # its full stderr stays with the failed run, not only the tail in the error message.
        run_dir = os.environ.get("RLWB_RUN_DIR")
        log_dir = log_dir or (Path(run_dir) / "logs" if run_dir and Path(run_dir).is_dir() else self._tmp.name)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self.log_path = Path(log_dir) / f"engine-{self.preset.name}.log"
        self._log = open(self.log_path, "ab")  # append: a restarted engine never erases the previous log  # noqa: SIM115 (open for the worker's lifetime)
        self._log.write(f"=== rlwb: starting {self.preset.name} on {model} ({dtype}) at "
                        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} ===\n".encode())
        self._log.flush()
        env = {**os.environ, "NO_COLOR": "1", **self.preset.env, "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(SERVER.parent), "TOKENIZERS_PARALLELISM": "false"}
        env.pop("VLLM_ALLOW_INSECURE_SERIALIZATION", None)  # never needed: no pickled callables
        # forked from a process that has imported the engine where it can be (rlwb/engines/forking.py), else fresh
        self.proc = forking.start([str(self.preset.python), str(SERVER)], env, self.preset.backend, self._log)
        _LIVE.add(self)
        spec = worker_spec(self.preset, self.model, dtype, extra_vllm_kwargs)
        try:
            protocol.write_frame(self.proc.stdin, spec)
        except BaseException:
            self.close()
            raise

    @property
    def ready(self) -> bool:
        return self._info is not None

    def wait_ready(self) -> EngineWorker:
        """Wait until the engine has started (at once if it has); raises what its start-up raised."""
        if self._info is not None:
            return self
        if self._start_error is not None:  # asked again after a failed start: the same error
            raise self._start_error
        with timing.phase("engine_start"):
            try:
                info = self._reply(max(0.0, self._start_deadline - time.monotonic()), "start")
            except BaseException as e:
                self._start_error = e
                self.close()
                raise
        self.start_s = time.perf_counter() - self._t_launch
        info["preset"] = self.preset.name
        info["model"] = self.model
        self._info = info
        for w in info.get("warnings") or []:  # visible in the notebook / terminal, not only the log
            warnings.warn(f"engine {self.preset.name}: {w}", RuntimeWarning, stacklevel=3)
        return self

    # -- plumbing -----------------------------------------------------------------------------------
    def log_ref(self) -> str:
        """Where to read the whole log: relative to the run directory when it is archived with a run (the
        run's temporary directory is renamed when the run ends, so an absolute path would go stale)."""
        run_dir = os.environ.get("RLWB_RUN_DIR")
        if run_dir and self.log_path.parent == Path(run_dir) / "logs":
            return f"logs/{self.log_path.name} in the run directory"
        return str(self.log_path)

    def stderr_tail(self, lines: int = 40) -> str:
        try:
            self._log.flush()
            text = self.log_path.read_bytes()[-20000:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _crashed(self, reason: str) -> EngineCrashed:
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        code = self.proc.poll()
        if code is not None and code < 0:
            reason += f" (killed by signal {signal.Signals(-code).name})"
        elif code is not None:
            reason += f" (exit code {code})"
        reason += f"; full log: {self.log_ref()}"
        err = EngineCrashed(self.preset.name, reason, self.stderr_tail())
        self._kill_group()
        return err

    def _reply(self, timeout: float | None, what: str):
        deadline = None if timeout is None else time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if ready:
                break
            if self.proc.poll() is not None:
                raise self._crashed(f"worker exited during {what}")
            if deadline is not None and time.monotonic() > deadline:
                self._kill_group()
                raise EngineCrashed(self.preset.name, f"no answer to {what} within {timeout:.0f} s",
                                    self.stderr_tail())
        try:
            msg = protocol.read_frame(self.proc.stdout)
        except (EOFError, ValueError) as e:
            raise self._crashed(f"pipe closed during {what}: {e}") from None
        if not msg.get("ok"):
            err = EngineError(f"engine {self.preset.name!r} failed in {what}: {msg.get('error')} "
                              f"(full log: {self.log_ref()})\n{msg.get('traceback', '')}")
            err.stderr_tail = self.stderr_tail(200)  # vLLM's root cause is often only in its engine core's log
            raise err
        return msg.get("result")

    def _call(self, op: str, timeout: float | None = None, **args):
        self.wait_ready()
        if self.proc.poll() is not None:
            raise self._crashed(f"worker is not running (before {op})")
        try:
            protocol.write_frame(self.proc.stdin, {"op": op, "args": args})
        except (BrokenPipeError, OSError):
            raise self._crashed(f"pipe broken when sending {op}") from None
        return self._reply(timeout, op)

    def _kill_group(self) -> None:
        # The whole group: vLLM's engine-core children outlive a leader that already exited.
        pid = self.proc.pid  # None: a fork server never forked this worker
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    # -- operations ---------------------------------------------------------------------------------
    @property
    def pid(self) -> int:
        return self.proc.pid

    def info(self) -> dict:
        """Engine identity and effective settings (vllm version, v0/v1/hf, dtype, prefix caching, ...)."""
        return dict(self.wait_ready()._info)

    def generate(self, prompts: list[list[int]], sampling: Sampling | list[Sampling], full: bool = False,
                 timeout: float | None = None, text: bool = True) -> list[Completion]:
        """Sample completions for token-id prompts; flat list ordered by (request, sample).

        `text=False`: the engine does not detokenize (each `Completion.text` is ""); the tokens and logprobs are
        bitwise the same (tested), and vLLM skips its per-token detokenizer and its decoding of every logprob's
        token, work a caller that decodes the token ids itself (the GRPO loop, notebook 08's scoring) never reads."""
        with timing.phase("sampling"):
            return self._generate(prompts, sampling, full, timeout, text)

    def _generate(self, prompts, sampling, full, timeout, text: bool = True) -> list[Completion]:
        out = self._call("generate", timeout=timeout, requests=generate_requests(prompts, sampling), full=full,
                         **({} if text else {"text": False}))
        comps = []
        for rid, r in enumerate(out):
            for j, s in enumerate(r["samples"]):
                comps.append(Completion(rid, j, r["prompt_token_ids"], list(s["token_ids"]),
                                        np.asarray(s["logprobs"], dtype=np.float32), s.get("text", ""),
                                        s.get("finish_reason") or "", s.get("full")))
        return comps

    def update_weights(self, weights: dict | str | os.PathLike, reset_prefix_cache: bool | None = None) -> dict:
        """In-flight weight update (no restart). `weights`: a state dict or a safetensors file of HF names.
        Resets the prefix cache afterwards when the preset says so; `reset_prefix_cache` overrides the
        preset (notebook 04 updates without a reset on purpose, to measure the stale cache)."""
        with timing.phase("weight_sync"):
            return self._update_weights(weights, reset_prefix_cache)

    def _update_weights(self, weights, reset_prefix_cache) -> dict:
        if isinstance(weights, dict):
            from safetensors.torch import save_file

            path = Path(self._tmp.name) / "weights.safetensors"
            save_file(without_aliases(weights), str(path))
        else:
            path = Path(weights)
        return self._call("update_weights", path=str(path), reset=reset_prefix_cache)

    def reset_prefix_cache(self) -> bool:
        return bool(self._call("reset_prefix_cache"))

    def weights_checksum(self) -> float:
        """Sum of all parameters inside the engine, over every tensor-parallel rank: a cheap check that an
        update really landed."""
        return float(self._call("weights_checksum"))

    def weights_checksums(self) -> list[float]:
        """One checksum per tensor-parallel rank: an update must change every rank's, not only rank 0's."""
        return [float(x) for x in self._call("weights_checksums")]

    def record_routing(self, on: bool = True) -> int:
        """Start (stop) recording the MoE router logits the engine computes; returns the router layers hooked
        (0: not an MoE model). vLLM engines only."""
        return int(self._call("record_routing", on=on))

    def take_routing(self) -> dict[int, np.ndarray]:
        """Router logits recorded since the last take: {layer: [rows, experts]}, rows in the engine's order
        (one request at a time: the prompt's prefill rows, then one row per decoded token but the last)."""
        return {int(k): np.asarray(v, dtype=np.float32) for k, v in self._call("take_routing").items()}

    def stats(self) -> dict:
        """Engine counters since start: `preemptions` (None where the engine does not expose them: the HF
        engine has no paged KV cache; V1 counts only when started with `disable_log_stats=False`)."""
        return dict(self._call("stats"))

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            try:
                protocol.write_frame(proc.stdin, {"op": "close"})
                proc.wait(timeout=15)
            except Exception:
                pass
        if proc is not None:
            self._kill_group()
            for s in (proc.stdin, proc.stdout):
                try:
                    s.close()
                except Exception:
                    pass
        if getattr(self, "_log", None) and not self._log.closed:
            self._log.close()
        _LIVE.discard(self)

    def __enter__(self) -> EngineWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
