"""`ServedEngine`: an engine someone else runs, audited over HTTP through its OpenAI-compatible API.

Why: an RL team's rollouts come from a server it started its own way (`vllm serve MODEL --flags`), not from rlwb's
presets. The question is whether *that* server, as served, is on-policy with the team's trainer. So the server is
an engine like the others: the same `generate(prompts, sampling)` -> `Completion`s, token ids in and out, the
engine's reported logprob of every sampled token, one seed per request (`seed + i`, as every engine here).

What is sent, and why each field (vLLM's `/v1/completions`):
- `prompt`: the token ids (never text: tokenization cannot differ between the engine and the trainer);
- `logprobs: 0` (the sampled token's logprob; the vocabulary size when the full distribution is asked for) and
  `return_tokens_as_token_ids: true` (tokens come back as `token_id:N`, so no detokenization is trusted);
- `temperature`, `top_p`, `top_k`, `seed`, `max_tokens`, `n`, `ignore_eos`;
- and every other sampling field at its neutral value (`repetition_penalty: 1`, `presence_penalty` and
  `frequency_penalty: 0`, `min_p: 0`, `min_tokens: 0`): a field left out takes the server's default, which vLLM
  reads from the checkpoint's `generation_config.json` (`--generation-config auto`, its default) - a hub instruct
  checkpoint's repetition penalty would then change the sampling distribution the trainer never applies.

Before any sampling the server is checked, each failure one line (`EngineError`): reachable (`/version`), serves
the model (`/v1/models`), tokenizes a probe text as the trainer does (the caller passes the trainer's ids of it:
the trainer's tokenizer is core's business), returns logprobs for a probe request, and, where the full
distribution is asked for, allows that many logprobs (`--max-logprobs`). What the server reports
about itself (version, models, its `system_fingerprint`, its `/metrics` config gauges) goes into `info()`, which
the archive records in run.json.

Only the standard library (urllib): nothing to install in the kernel, and nothing of the server's own stack.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rlwb import timing
from rlwb.engines.presets import Preset, served_preset
from rlwb.engines.worker import Completion, generate_requests
from rlwb.errors import EngineError

NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
           "min_tokens": 0}
TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def _base(url: str) -> str:
    """The server's root (without a trailing `/v1`): `/version`, `/tokenize` and `/metrics` live there."""
    u = url.rstrip("/")
    return u[:-3] if u.endswith("/v1") else u


class ServedEngine:
    """`ServedEngine(preset_or_url)`: checks the server at once (see the module docstring); `close()` ends
    nothing on the server (rlwb did not start it)."""

    def __init__(self, preset: Preset | str, *, probe: tuple[str, list[int]] | None = None, full_logprobs: int = 0,
                 timeout: float = 600.0, workers: int = 16):
        """`probe`: a text and the trainer's token ids of it (`check_tokenizer`); `full_logprobs`: the number of
        logprobs per step the caller will ask for with `full=True` (the model's vocabulary), checked against what
        the server allows before any sampling; 0 when it never asks."""
        self.preset = preset if isinstance(preset, Preset) else served_preset(preset)
        if self.preset.backend != "openai" or not self.preset.url:
            raise EngineError(f"engine {self.preset.name!r} is not a served engine (backend openai with a url)")
        self.base, self.timeout, self.workers = _base(self.preset.url), timeout, workers
        self._echo: dict = {}
        self.tokenizer_probe: dict | None = None
        self.version = self._request("/version").get("version")
        models = self._request("/v1/models").get("data") or []
        served = [m.get("id") for m in models]
        wanted = self.preset.served_model
        if wanted and wanted not in served:
            raise self._error(f"model {wanted!r} is not served here (it serves: {', '.join(map(str, served))})")
        if not wanted and len(served) != 1:
            raise self._error(f"serves {len(served)} models ({', '.join(map(str, served))}): name one with "
                              f"served_model")
        self.model = wanted or served[0]
        self.model_info = next(m for m in models if m.get("id") == self.model)
        self.full_logprobs = int(full_logprobs)
        prompt = self.check_tokenizer(*probe) if probe else self.tokenize("Hello")
        self._probe_logprobs(prompt)

    # -- HTTP ------------------------------------------------------------------------------------------
    def _error(self, problem: str) -> EngineError:
        return EngineError(f"served engine {self.preset.name}: {problem}")

    def _request(self, path: str, body: dict | None = None):
        url = self.base + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                     method="GET" if body is None else "POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                text = r.read().decode()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")
            try:
                detail = json.loads(detail).get("error", {}).get("message", detail) if detail.startswith("{") \
                    else detail
            except (json.JSONDecodeError, AttributeError):
                pass
            raise self._error(f"{path} answered HTTP {e.code}: {' '.join(str(detail).split())[:300]}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise self._error(f"cannot reach the server at {url} ({reason})") from None
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise self._error(f"{path} answered something that is not JSON: {text[:120]!r}") from None

    # -- checks ----------------------------------------------------------------------------------------
    def _probe_logprobs(self, prompt: list[int]) -> None:
        """One token after `prompt`, with the logprobs the caller will ask for: the server must return them (a
        server that caps `--max-logprobs` below the vocabulary refuses here, with its own message)."""
        for k in sorted({0, self.full_logprobs}):
            try:
                out = self._request("/v1/completions", self._body(prompt, 1.0, 1.0, 0, 1, 0, 1, False, k))
            except EngineError as e:
                if not k:
                    raise
                raise self._error(f"refuses {k} logprobs per step (the whole vocabulary; a vLLM server needs "
                                  f"--max-logprobs {k} or more): {str(e).split(': ', 1)[1]}") from None
            choice = (out.get("choices") or [{}])[0]
            lp = choice.get("logprobs") or {}
            if not lp.get("token_logprobs"):
                raise self._error("returned no logprobs for a request that asked for them (the audit needs the "
                                  "engine's logprob of every sampled token)")
            got = len((lp.get("top_logprobs") or [None])[0] or {})
            if k and got < k:
                raise self._error(f"returned {got} logprobs per step where {k} (the whole vocabulary) were asked for")
            self._echo = {key: out.get(key) for key in ("model", "object", "system_fingerprint") if key in out}

    def tokenize(self, text: str) -> list[int]:
        """The server's token ids of `text` (vLLM's `/tokenize`, special tokens added as its tokenizer adds them)."""
        out = self._request("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": True})
        return [int(t) for t in out.get("tokens", [])]

    def check_tokenizer(self, text: str, trainer_ids: list[int]) -> list[int]:
        """Refuse a server whose tokenizer is not the trainer's: its ids of `text` must equal `trainer_ids` (the
        trainer's tokenizer on the same text). Prompts travel as ids, but a server loaded with another model or
        tokenizer would sample tokens that mean something else to the trainer. Returns the ids."""
        ids = self.tokenize(text)
        if ids != list(trainer_ids):
            at = next((i for i, (a, b) in enumerate(zip(ids, trainer_ids)) if a != b), min(len(ids), len(trainer_ids)))
            raise self._error(f"its tokenizer is not the trainer's: {text!r} gives {len(ids)} tokens there and "
                              f"{len(trainer_ids)} here, first difference at token {at} "
                              f"({ids[at:at + 3]} vs {list(trainer_ids)[at:at + 3]}); serve the model the trainer "
                              f"scores, or audit with the server's model")
        self.tokenizer_probe = {"text": text, "tokens": len(ids), "match": True}
        return ids

    def _metrics_info(self) -> list[str]:
        """The config gauges of vLLM's Prometheus `/metrics` (`vllm:cache_config_info{...}` and the like): what
        the server says about its own settings. Empty where the server has no such endpoint."""
        try:
            req = urllib.request.Request(self.base + "/metrics")
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read().decode(errors="replace")
        except (urllib.error.URLError, OSError):
            return []
        return [ln for ln in text.splitlines() if "_info{" in ln and not ln.startswith("#")]

    # -- the engine interface ------------------------------------------------------------------------
    def info(self) -> dict:
        """What the server reports about itself: version, the model entry of `/v1/models`, what it echoed in a
        completion (`system_fingerprint`), its config gauges; the settings it does not report are said to be so."""
        return {"backend": "openai", "engine": "served", "url": self.preset.url, "served_model": self.model,
                "vllm_version": self.version, "server_version": self.version, "model_entry": self.model_info,
                "echo": dict(self._echo), "metrics_info": self._metrics_info(),
                "tokenizer_probe": self.tokenizer_probe, "preset": self.preset.name,
                "settings": {"max_model_len": self.model_info.get("max_model_len"),
                             "logprobs_mode": "not reported by the server (its --logprobs-mode flag)",
                             "sent_neutral": dict(NEUTRAL)}}

    def _body(self, prompt, temperature, top_p, top_k, max_tokens, seed, n, ignore_eos, logprobs) -> dict:
        return {"model": self.model, "prompt": [int(t) for t in prompt], "max_tokens": int(max_tokens),
                "temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k) if top_k else 0,
                "seed": seed, "n": int(n), "ignore_eos": bool(ignore_eos), "logprobs": int(logprobs),
                "return_tokens_as_token_ids": True, "skip_special_tokens": False, "stream": False, **NEUTRAL}

    def _one(self, request: dict, full: bool) -> list[dict]:
        s = request["sampling"]
        k = self.full_logprobs if full else 0
        if full and not k:
            raise self._error("full distributions were asked for but the engine was opened with full_logprobs=0")
        out = self._request("/v1/completions", self._body(request["prompt_token_ids"], s["temperature"], s["top_p"],
                                                          s["top_k"], s["max_tokens"], s["seed"], s["n"],
                                                          s["ignore_eos"], k))
        self._echo = {key: out.get(key) for key in ("model", "object", "system_fingerprint") if key in out}
        samples = []
        for c in sorted(out.get("choices") or [], key=lambda c: c.get("index", 0)):
            lp = c.get("logprobs") or {}
            ids = [self._token_id(t) for t in lp.get("tokens") or []]
            logprobs = lp.get("token_logprobs") or []
            if len(logprobs) != len(ids) or any(x is None for x in logprobs):
                raise self._error(f"returned {len(logprobs)} logprobs for {len(ids)} tokens (some missing)")
            sample = {"token_ids": ids, "logprobs": np.asarray(logprobs, dtype=np.float32), "text": c.get("text", ""),
                      "finish_reason": c.get("finish_reason") or "length"}
            if full:
                dist = np.full((len(ids), k), -np.inf, dtype=np.float32)
                for i, step in enumerate(lp.get("top_logprobs") or []):
                    for tok, v in (step or {}).items():
                        dist[i, self._token_id(tok)] = v
                sample["full"] = dist
            samples.append(sample)
        if len(samples) != int(s["n"]):
            raise self._error(f"returned {len(samples)} completions where n={s['n']} were asked for")
        return samples

    def _token_id(self, token: str) -> int:
        m = TOKEN_ID.match(str(token))
        if not m:
            raise self._error(f"returned token {token!r}, not 'token_id:N': it ignores return_tokens_as_token_ids")
        return int(m.group(1))

    def generate(self, prompts: list[list[int]], sampling, full: bool = False, text: bool = True):
        """Sample completions for token-id prompts, one HTTP request per prompt (in `workers` threads, so the
        server batches them); request i gets seed + i. Returns `Completion`s ordered by (request, sample).
        `text` is `EngineWorker.generate`'s (a server's completions come with their text either way)."""
        reqs = generate_requests(prompts, sampling)
        with timing.phase("sampling"), ThreadPoolExecutor(max_workers=self.workers) as pool:
            results = list(pool.map(lambda r: self._one(r, full), reqs))
        return [Completion(i, j, list(r["prompt_token_ids"]), s["token_ids"], s["logprobs"], s["text"],
                           s["finish_reason"], s.get("full"))
                for i, (r, samples) in enumerate(zip(reqs, results)) for j, s in enumerate(samples)]

    def close(self) -> None:
        """Nothing to end: the server is not rlwb's."""

    def __enter__(self) -> ServedEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

