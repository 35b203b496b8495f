"""rlwb: audit LLM inference engines used as RL rollout generators.

The notebook kernel imports only this package (torch + transformers for the trainer side). Engines run
in worker processes with their own interpreters (`rlwb.engines`), so the kernel never imports vLLM.
"""

__version__ = "0.1.0"
