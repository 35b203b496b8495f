"""Drift, a run's metrics moving away from those of a reference run: `rlwb compare` and the checks of `rlwb rerun`,
two runs' metrics and provenance side by side.

Why `compare` separates timings: a nightly rerun should fail on drifted *numbers*, not on a busier machine."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rlwb import archive
from rlwb.formatting import number, text_table

TIMING_SUFFIXES = ("_s", "_s_mean", "_s_max", "_s_median", "_ms", "_ms_mean", "_ms_median", "tok_s", "throughput",
                   "throughput_ratio", "time_ratio")


def is_timing(key: str) -> bool:
    name = key.rsplit("/", 1)[-1]
    return name.startswith("t_") or name.endswith(TIMING_SUFFIXES) or key.startswith(("tput/", "bench/"))


def compare(run_a: str | os.PathLike, run_b: str | os.PathLike, rtol: float = 1e-6, atol: float = 1e-9,
            include_timing: bool = False) -> tuple[bool, list[dict]]:
    """Every metric of either run: both values, difference, and whether it agrees within tolerance.

    A metric present in one run only is drift (status `MISSING in a` / `MISSING in b`): a nightly rerun in
    which an engine's metrics vanished (the engine failed to start, a section was skipped) must not pass.
    Timing metrics are listed but only fail the comparison with `include_timing`, missing ones included."""
    ma = archive.read_json(Path(run_a) / "metrics.json")
    mb = archive.read_json(Path(run_b) / "metrics.json")
    for p, m in ((run_a, ma), (run_b, mb)):
        if m is None:
            raise FileNotFoundError(f"{p}/metrics.json is missing or unreadable")
    rows, ok = [], True
    for k in sorted(set(ma) | set(mb)):
        a, b = ma.get(k), mb.get(k)
        timing = is_timing(k)
        if k not in ma or k not in mb:
            missing = "MISSING in " + ("b" if k in ma else "a")
            status = "timing" if timing and not include_timing else missing
            ok &= status == "timing"
            rows.append({"metric": k, "a": a, "b": b, "diff": None, "status": status, "timing": timing})
            continue
        if a is None or b is None:
            agree = a is None and b is None
            diff = None
        else:
            diff = b - a
            agree = math.isclose(a, b, rel_tol=rtol, abs_tol=atol)
        status = "ok" if agree else ("timing" if timing and not include_timing else "DRIFT")
        ok &= status != "DRIFT"
        rows.append({"metric": k, "a": a, "b": b, "diff": diff, "status": status, "timing": timing})
    return ok, rows


def failing(rows: list[dict]) -> list[dict]:
    """The rows that make a comparison fail: drifted values and metrics missing from one run."""
    return [r for r in rows if r["status"] == "DRIFT" or r["status"].startswith("MISSING")]


def provenance_differences(run_a: str | os.PathLike, run_b: str | os.PathLike) -> list[str]:
    """What differs between two runs' builds, in words: the model's weights (checksum), torch, and each
    engine's vLLM / torch / transformers version. A metric that drifts between runs with a difference listed
    here may be explained by the build or the upgrade, not by the engine's behaviour; `compare` and `rerun`
    print these lines beside the drift so nobody has to guess."""
    ra = archive.read_record(run_a, {}) or {}
    rb = archive.read_record(run_b, {}) or {}
    out = []

    def model_fact(r: dict, key: str):
        m = r.get("model") or {}
        return m.get(key, (m.get("card") or {}).get(key))

    wa, wb = model_fact(ra, "weights_sha256_16"), model_fact(rb, "weights_sha256_16")
    if wa != wb:
        same_recipe = model_fact(ra, "recipe_hash") == model_fact(rb, "recipe_hash")
        out.append(f"model build differs: weights {wa or 'unknown'} vs {wb or 'unknown'}"
                   + (" (same recipe, another build)" if same_recipe else
                      f" (recipe {model_fact(ra, 'recipe_hash')} vs {model_fact(rb, 'recipe_hash')})"))
    pa, pb = (ra.get("packages") or {}), (rb.get("packages") or {})
    for pkg in sorted(set(pa) | set(pb)):
        if pkg in ("torch", "transformers", "vllm") and pa.get(pkg) != pb.get(pkg):
            out.append(f"kernel {pkg} differs: {pa.get(pkg)} vs {pb.get(pkg)}")
    ea, eb = (ra.get("engines") or {}), (rb.get("engines") or {})
    for name in sorted(set(ea) | set(eb)):
        a, b = ea.get(name) or {}, eb.get(name) or {}
        if not a or not b:
            continue  # an engine used by one run only shows up as metrics present in one run
        for key in ("vllm_version", "torch_version", "transformers_version"):
            if a.get(key) != b.get(key):
                out.append(f"engine {name}: {key.replace('_version', '')} {a.get(key)} vs {b.get(key)}")
    return out


def drift_summary(ok: bool, rows: list[dict], provenance: list[str]) -> str:
    """The closing line(s) of `compare` / `rerun`: what drifted and, if the builds differ, that they do."""
    drift = [r["metric"] for r in rows if r["status"] == "DRIFT"]
    missing = [f"{r['metric']} ({r['status']})" for r in rows if r["status"].startswith("MISSING")]
    lines = ["OK: all metrics agree" if ok else "; ".join(
        ([f"DRIFT in {len(drift)} metric(s): " + ", ".join(drift)] if drift else [])
        + ([f"{len(missing)} metric(s) present in one run only: " + ", ".join(missing)] if missing else []))]
    if provenance:
        head = "the runs differ in build or versions" + (" - the drift may come from that:" if not ok else ":")
        lines += [head] + [f"  {p}" for p in provenance]
    return "\n".join(lines)


def record_drift(run_dir: Path, reference: Path, ok: bool, rows: list[dict], provenance: list[str]) -> None:
    """A rerun's verdict in its run.json (`drift`), so the index's trend view can mark the run."""
    info = archive.read_record(run_dir, {})
    info["drift"] = {"reference": reference.name, "ok": ok,
                     "drifted": [r["metric"] for r in failing(rows)], "provenance": provenance}
    archive.write_record(run_dir, info)


def compare_table(rows: list[dict], only_interesting: bool = False) -> str:
    shown = [r for r in rows if not only_interesting or r["status"] != "ok"]
    table = [("metric", "run A", "run B", "B - A", "status")]
    table += [(r["metric"], *(number(r[k], ".5g", "-") for k in ("a", "b", "diff")), r["status"]) for r in shown]
    return text_table(table, "<>>>-", widths=[None, 12, 12, 12, None])


def dump_json(obj) -> str:
    return json.dumps(obj, indent=2, default=str)
