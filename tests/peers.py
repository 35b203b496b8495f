"""Peers' own implementations of the off-policy corrections, loaded as oracles for rlwb's.

Why: re-deriving verl's or TRL's formula from its docs checks rlwb against rlwb's reading of the docs. These
loaders run the peer's code itself on rlwb's tensors: verl 0.9.1's `rollout_corr_helper`, its policy loss
(`core_algos`) and debug metrics, SkyRL 0.3.0's `off_policy_correction_utils` and PPO loss, OpenRLHF 0.11.2's
`PolicyLoss` (from `$RLWB_ENVS/peers`, installed by `scripts/setup.sh peers`), and TRL's (the kernel env's, pinned
in pyproject.toml).

How, where a peer's package cannot be imported whole on this machine: SkyRL's package `__init__` needs
Python 3.12 and OpenRLHF's needs its training stack (peft, flash-attn, deepspeed), so their correction modules
are loaded from their files, each under its own module name. SkyRL's `off_policy_correction_utils` gets its
sibling `torch_utils` as it is. OpenRLHF's `loss.py` needs one function of `models/utils.py`, `masked_mean`,
and that file imports deepspeed at the top; deepspeed on the path would change what transformers, accelerate
and TRL import for the rest of the process (TRL's GRPOTrainer then fails to import), so `masked_mean` is taken
from OpenRLHF's file by its source (the function's own lines, nothing else); SkyRL's PPO loss likewise (its
`ppo_utils` imports SkyRL's training config, which needs skyrl_gym). TRL computes its vLLM
importance-sampling ratio inline in `GRPOTrainer._generate_and_score_completions`; `trl_vllm_is_ratio`
executes exactly those source lines (located by the comments around them, and refused if they moved).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import math
import sys
import textwrap
import types
from pathlib import Path

from rlwb.errors import PeerMissing
from rlwb.paths import envs_dir


def peers_dir() -> Path:
    return envs_dir() / "peers"


def _on_path() -> Path:
    d = peers_dir()
    if not (d / ".rlwb-stamp").exists():
        raise PeerMissing(f"the peer oracles are not installed in {d}: run `make peers` "
                          "(scripts/setup.sh peers)")
    if str(d) not in sys.path:
        sys.path.append(str(d))  # appended: the kernel env's own packages (torch, TRL) win
    return d


def omegaconf():
    """`OmegaConf` from the peers' directory (SkyRL's configs are OmegaConf objects), importable in any test order:
    the directory goes on sys.path first (an import before any peer was loaded failed when a test ran alone)."""
    _on_path()
    from omegaconf import OmegaConf

    return OmegaConf


def _load_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _package(name: str, path: Path) -> None:
    """An empty package object, so that a module file can be loaded beneath it without running the
    package's own `__init__`."""
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(path)]
        sys.modules[name] = pkg


@functools.cache
def verl_rollout_corr() -> types.ModuleType:
    """verl's `verl.trainer.ppo.rollout_corr_helper` (imports normally)."""
    _on_path()
    import verl.trainer.ppo.rollout_corr_helper as m

    return m


@functools.cache
def verl_debug_metrics() -> types.ModuleType:
    """verl's `verl.utils.debug.metrics` (`calculate_debug_metrics`: the `training/rollout_probs_diff_*` metrics
    it logs with `rollout.calculate_log_probs=True`), and `verl.DataProto` it takes, as `.DataProto`."""
    _on_path()
    import verl.utils.debug.metrics as m
    from verl import DataProto

    m.DataProto = DataProto
    return m


@functools.cache
def skyrl_off_policy() -> types.ModuleType:
    """SkyRL's `off_policy_correction_utils` (its functions take an omegaconf config)."""
    root = _on_path() / "skyrl"
    utils = root / "backends" / "skyrl_train" / "utils"
    for name, path in (("skyrl", root), ("skyrl.backends", root / "backends"),
                       ("skyrl.backends.skyrl_train", root / "backends" / "skyrl_train"),
                       ("skyrl.backends.skyrl_train.utils", utils)):
        _package(name, path)
    _load_file("skyrl.backends.skyrl_train.utils.torch_utils", utils / "torch_utils.py")
    return _load_file("skyrl.backends.skyrl_train.utils.off_policy_correction_utils",
                      utils / "off_policy_correction_utils.py")


def _function_from_source(path: Path, name: str, module: str, names: tuple[str, ...] = (),
                          namespace: dict | None = None) -> types.ModuleType:
    """A module holding only the top-level function `name` (and `names`) of the file at `path`, from their own
    source lines (decorators left out), run with `namespace` as their globals besides torch and typing."""
    import ast
    import typing

    import torch

    src = path.read_text()
    mod = types.ModuleType(module)
    mod.__dict__.update({"torch": torch, **{k: getattr(typing, k) for k in ("Optional", "List", "Tuple", "Union")},
                         **(namespace or {})})
    for fn in (name, *names):
        node = next((n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == fn), None)
        if node is None:
            raise PeerMissing(f"{path} has no function {fn!r} any more; update tests/peers.py")
        exec(compile(ast.get_source_segment(src, node), str(path), "exec"), mod.__dict__)
    sys.modules[module] = mod
    return mod


@functools.cache
def skyrl_policy_loss() -> types.ModuleType:
    """SkyRL's PPO policy loss and its loss reduction, from `ppo_utils.py`: `ppo_policy_loss` (the clipped
    surrogate, its off-policy correction, the masked sum), `reduce_loss`, and
    `apply_loss_reduction_to_advantages_minibatch` (how the trainer pre-scales advantages so that the sum is a
    token or sequence mean). The module itself imports SkyRL's training stack (its config needs skyrl_gym, ray,
    loguru), so these functions are taken from its source, with SkyRL's own `off_policy_correction_utils` and
    `torch_utils` as their globals; the config type in their annotations is not needed to run them."""
    import typing

    off_policy = skyrl_off_policy()
    torch_utils = sys.modules["skyrl.backends.skyrl_train.utils.torch_utils"]
    path = _on_path() / "skyrl" / "backends" / "skyrl_train" / "utils" / "ppo_utils.py"
    return _function_from_source(path, "ppo_policy_loss", "skyrl.backends.skyrl_train.utils.ppo_utils",
                                 ("reduce_loss", "apply_loss_reduction_to_advantages_minibatch"),
                                 {"AlgorithmConfig": typing.Any, "safe_exp_delta": torch_utils.safe_exp_delta,
                                  "masked_mean": torch_utils.masked_mean,
                                  "apply_off_policy_correction": off_policy.apply_off_policy_correction})


@functools.cache
def verl_policy_loss() -> types.ModuleType:
    """verl's `verl.trainer.ppo.core_algos` (`compute_policy_loss_vanilla`, `agg_loss`; imports normally)."""
    _on_path()
    import verl.trainer.ppo.core_algos as m

    return m


@functools.cache
def openrlhf_loss() -> types.ModuleType:
    """OpenRLHF's `openrlhf.models.loss` (`PolicyLoss` holds its IcePop / TIS correction)."""
    root = _on_path() / "openrlhf"
    _package("openrlhf", root)
    _package("openrlhf.models", root / "models")
    _function_from_source(root / "models" / "utils.py", "masked_mean", "openrlhf.models.utils")
    return _load_file("openrlhf.models.loss", root / "models" / "loss.py")


TRL_IS_BEGIN = "# Compute the importance sampling ratio when using vLLM"
TRL_IS_END = "# Compute the per-token log probabilities for the reference model"


@functools.cache
def _trl_is_source() -> str:
    from trl import GRPOTrainer

    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    if TRL_IS_BEGIN not in src or TRL_IS_END not in src:
        import trl

        raise PeerMissing(f"TRL {trl.__version__}: the vLLM importance-sampling block moved (markers "
                          f"{TRL_IS_BEGIN!r} .. {TRL_IS_END!r} not found); update tests/peers.py")
    block = src[src.index(TRL_IS_BEGIN): src.index(TRL_IS_END)]
    return textwrap.dedent(block.split("\n", 1)[1])


def trl_vllm_is_ratio(mode: str, old_per_token_logps, sampling_per_token_logps, completion_mask,
                      clip_max: float | None = 3.0, clip_min: float | None = None):
    """TRL's `vllm_importance_sampling_ratio` ([B, L] token modes, [B, 1] sequence modes), computed by TRL's
    own source lines with the trainer attributes they read set as given."""
    import torch

    trainer = types.SimpleNamespace(use_vllm=True, vllm_importance_sampling_correction=True,
                                    vllm_importance_sampling_mode=mode, vllm_importance_sampling_clip_max=clip_max,
                                    vllm_importance_sampling_clip_min=clip_min)
    scope = {"self": trainer, "torch": torch, "math": math, "old_per_token_logps": old_per_token_logps,
             "sampling_per_token_logps": sampling_per_token_logps, "completion_mask": completion_mask,
             "tool_mask": None}
    exec(compile(_trl_is_source(), "<trl GRPOTrainer vLLM IS block>", "exec"), scope)
    return scope["vllm_importance_sampling_ratio"]


def trl_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, threshold: float):
    """TRL's `GRPOTrainer.get_off_policy_mask` (DeepSeek-V3.2 OPSM), [B, 1]."""
    from trl import GRPOTrainer

    return GRPOTrainer.get_off_policy_mask(advantages, per_token_logps, sampling_per_token_logps, mask, threshold)
