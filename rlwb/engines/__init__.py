"""Inference engines as worker processes: presets (`presets.py`), the kernel-side client
(`worker.py`), the pipe protocol (`protocol.py`) and the code that runs in the engine's own
interpreter (`server.py`, `vllm_ext.py`)."""

from .presets import Preset, PresetError, available_presets, load_presets, resolve_preset
from .worker import Completion, EngineCrashed, EngineError, EngineWorker, Sampling

__all__ = ["Completion", "EngineCrashed", "EngineError", "EngineWorker", "Preset", "PresetError", "Sampling",
           "available_presets", "load_presets", "resolve_preset"]
