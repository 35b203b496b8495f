"""What machine this is: the CPU's model, vendor and widest vector ISA, read from /proc/cpuinfo.

psutil (used for processes and memory) reports neither the CPU's model nor its flags, so this is the one reader of
/proc/cpuinfo: the archive records the model in every run.json, the model build records vendor and ISA in a build's
card (the vendor selects the published build), and the V0 build script reads the flags (it loads this file by path:
it runs in the engine environment, where rlwb is not installed). Standard library only, for that reason."""

from __future__ import annotations

import platform
import re
from pathlib import Path


def _cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def _flags(text: str) -> set[str]:
    line = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    return set(line.group(1).split()) if line else set()


def cpu_flags() -> set[str]:
    """The first CPU's flags (`avx2`, `avx512f`, ...); empty without /proc/cpuinfo."""
    text = _cpuinfo()
    return _flags(text) if text is not None else set()


def cpu_name(record: dict | None) -> str | None:
    """A run record's host CPU as a reader names it: the model and, where recorded, its instruction set
    ("AMD EPYC, AVX2"): one model name covers CPUs (and one machine image on hosts) with and without AVX-512, whose
    kernels round otherwise and which run different engines (vLLM V1 keeps an fp8 KV cache only with AVX-512)."""
    record = record or {}
    if not record.get("cpu"):
        return None
    isa = {"avx512": "AVX-512", "avx2": "AVX2"}.get(str(record.get("isa")))
    return f"{record['cpu']}, {isa}" if isa else str(record["cpu"])


def cpu() -> dict:
    """{"model", "vendor", "isa"}: the first CPU's model name (platform.processor() where /proc/cpuinfo has none),
    its vendor_id ("unknown" where absent) and "avx512" / "avx2" / "other" from its flags; without /proc/cpuinfo,
    platform.processor() and an "unknown" ISA, and no vendor (a build's card then names it by the model's name)."""
    text = _cpuinfo()
    if text is None:
        return {"model": platform.processor(), "isa": "unknown"}
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    vendor = re.search(r"^vendor_id\s*:\s*(.*)$", text, re.M)
    flags = _flags(text)
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    return {"model": model.group(1).strip() if model else platform.processor(), "isa": isa,
            "vendor": vendor.group(1).strip() if vendor else "unknown"}
