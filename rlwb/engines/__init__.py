"""Inference engines as worker processes: presets (`presets.py`), the kernel-side client
(`worker.py`), the pipe protocol (`protocol.py`) and the code that runs in the engine's own
interpreter (`server.py` and its backends `vllm_backend.py` / `hf_backend.py`, `vllm_ext.py`,
`fork_server.py`)."""

from rlwb.engines.presets import Preset, available_presets, load_presets, resolve_preset
from rlwb.engines.worker import Completion, EngineWorker, Sampling
from rlwb.errors import EngineCrashed, EngineError, PresetError

__all__ = ["Completion", "EngineCrashed", "EngineError", "EngineWorker", "Preset", "PresetError", "Sampling",
           "available_presets", "load_presets", "resolve_preset"]
