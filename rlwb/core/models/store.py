"""Every embedded model's build: the cache, the build lock, the pinned child process and the published
builds of record shipped with rlwb (the recipes are `llama`, `chat`, `moe`, `sampling_defaults_variant`,
`random_init`).

The built model is cached under `cache_dir()/models/default-<recipe hash>/` and reused: the hash covers
every recipe value, so changing the recipe builds a new model and never silently reuses an old one.

Why the build runs in a child process with pinned CPU code paths (`BUILD_ENV`): the same recipe gave
other weights on an AVX-512 machine than on an AVX2 one (greedy accuracy 0.595 vs 0.645), because torch
and MKL pick vectorised kernels per CPU and 400 SFT steps amplify the rounding differences. Those choices
are made when torch loads, so they can only be pinned in a fresh process. The card records the weights'
checksum and whether it equals the published one for its CPU vendor (`PUBLISHED_WEIGHTS`: the pins hold across
ISAs, not across vendors), which tests assert on every machine.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlwb.core.models.chat import ChatModelRecipe
from rlwb.core.models.llama import ModelRecipe
from rlwb.core.models.moe import MoeRecipe
from rlwb.core.models.random_init import RandomInitRecipe
from rlwb.core.models.sampling_defaults_variant import VariantRecipe
from rlwb.paths import cache_dir

# What makes the build bit-identical across x86-64 CPUs, each measured with 40-step builds on an AMD EPYC
# with AVX-512 (weights hash per setting):
# - ATEN_CPU_CAPABILITY: torch's own vectorised kernels are chosen per CPU when torch loads; AVX512, AVX2
#   and DEFAULT gave three different hashes. avx2 is the widest set every CPU vLLM's CPU backend runs on has.
# - MKL_CBWR=COMPATIBLE: MKL's sgemm computes the linear layers (setting CBWR changed the hash) and picks
#   its kernels per CPU model and vendor. COMPATIBLE is the conditional-numerical-reproducibility branch MKL
#   documents as giving the same results on Intel and non-Intel processors (the AVX2 branch is only
#   guaranteed on Intel). The price: the build takes longer (see the card's build_s).
# - ONEDNN_MAX_CPU_ISA=AVX2: oneDNN was not in this model's path (capping it at SSE41 left the hash
#   unchanged); pinned so a torch that routes a matmul through oneDNN cannot bring the dependence back.
# - Threads: float reductions are split by thread count; always 2 (MKL's reproducibility needs a fixed count).
BUILD_THREADS = 2
BUILD_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "OMP_NUM_THREADS": str(BUILD_THREADS), "MKL_NUM_THREADS": str(BUILD_THREADS)}
# recipe hash -> CPU vendor -> weights checksum of the build every machine of that vendor must reproduce.
# The pins make a build independent of the ISA and thread layout on one vendor's CPUs, but not across vendors:
# the same pinned default recipe built other weights on an Intel Xeon (Sapphire Rapids, AVX-512 + AMX) than on
# the AMD EPYC of record (greedy accuracy 0.67 vs 0.565). Ruled out on the Intel machine (checksum unchanged):
# MKL_DYNAMIC=FALSE, one MKL thread, MKL_ENABLE_INSTRUCTIONS=AVX2, strict CNR (COMPATIBLE,STRICT); MKL's own
# AVX2 / AVX-512 branches give still other weights. Tests assert a machine reproduces its vendor's build.
# The README's numbers come from REFERENCE_VENDOR's builds.
PUBLISHED_WEIGHTS: dict[str, dict[str, str]] = {
    "e681a5e09fd3": {"AuthenticAMD": "55ff690a01f1bba5",  # default: AMD EPYC, AVX-512, 2026-11-22
                     "GenuineIntel": "cf6e9d946fdb11b9"},  # default: Intel Xeon (Sapphire Rapids), 2026-11-23
    "3247b68a9fe7": {"AuthenticAMD": "a62e40a6ea9f6d69",  # qwen2-chat, Python 3.11.7 stdlib: greedy acc 0.41
                     "GenuineIntel": "f536d2093f18cffe"},  # qwen2-chat on the Intel Xeon: greedy accuracy 0.46
    "d8989e3ee50a": {"AuthenticAMD": "5f05af192dcabf07"},  # qwen2.5-0.5b-random (Python 3.11.7 stdlib), 2026-11-25
}
REFERENCE_VENDOR = "AuthenticAMD"


def weights_hash(model) -> str:
    """sha256 over every parameter's bytes, in name order: equal hashes = bitwise equal weights."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class EmbeddedModel:
    path: Path
    card: dict

    @property
    def recipe_hash(self) -> str:
        return self.card["recipe_hash"]


# `model:` name -> recipe of every model rlwb builds itself. `qwen2-chat-smoke` is the chat model on a tiny budget
# (a minute): for tests and dry runs of GPU configurations, never for findings. `qwen2.5-0.5b-random`: Qwen2.5-0.5B's
# published config with seeded random weights (shapes and kernels at a real size, for GPU runs; not a policy).
EMBEDDED_RECIPES = {"default": ModelRecipe(),
                    "qwen2-chat": ChatModelRecipe(),
                    "qwen2-chat-smoke": ChatModelRecipe(name="qwen2-chat-smoke", pretrain_steps=12, sft_steps=12,
                                                        warmup_steps=4),
                    "qwen2-moe-chat": MoeRecipe(),
                    "qwen2-moe-chat-smoke": MoeRecipe(name="qwen2-moe-chat-smoke", base="qwen2-chat-smoke"),
                    # the default policy with a hub checkpoint's sampling defaults in generation_config.json: every
                    # engine and the trainer must ignore them (rlwb/core/models/sampling_defaults_variant.py)
                    "default-sampling-defaults": VariantRecipe(),
                    "qwen2.5-0.5b-random": RandomInitRecipe()}
EMBEDDED_NAMES = tuple(EMBEDDED_RECIPES)


def recipe_for(name: str):
    """The recipe of embedded model `name`, bound to this machine's inputs (the chat model's corpus hash)."""
    if name not in EMBEDDED_RECIPES:
        raise ValueError(f"no embedded model {name!r}; embedded models: {', '.join(EMBEDDED_NAMES)}")
    r = EMBEDDED_RECIPES[name]
    return r if isinstance(r, ModelRecipe) else _with_corpus(r)


@functools.cache
def _with_corpus(recipe):
    if isinstance(recipe, (MoeRecipe, VariantRecipe)):
        return recipe.with_corpus(recipe_for(recipe.base).hash())
    return recipe.with_corpus()  # hashing 12 MB of stdlib takes a second: once per process


def default_model_dir(recipe=ModelRecipe()) -> Path:
    prefix = "default" if isinstance(recipe, ModelRecipe) else recipe.name
    return cache_dir() / "models" / f"{prefix}-{recipe.hash()}"


PUBLISHED_DIR = Path(__file__).with_name("published")  # the builds of record, shipped with rlwb (see below)


def build_default_model(recipe=ModelRecipe(), force: bool = False, progress: bool = True,
                        from_recipe: bool = False) -> EmbeddedModel:
    """The embedded model of `recipe` (the default policy unless it says otherwise) in the cache; returns its path
    and model card.

    Where rlwb ships the build of record (`PUBLISHED_DIR/<name>-<recipe hash>/`), that is the model, on every
    machine: its files are copied into the cache and checked against their recorded sha256. Why: the pinned build
    (below) gives the same weights on every ISA of one CPU vendor, not across vendors (an Intel Xeon trained other
    weights from the same recipe than the AMD EPYC of record), so a nightly audit that moved between machines
    compared different policies. A cached model with other weights than the shipped ones (a build from before)
    is replaced. `from_recipe` trains the recipe here instead, into `<cache dir>-recipe` (the shipped copy is left
    alone): how the shipped weights are verified (`rlwb build-model --from-recipe`).

    A recipe with no shipped build is trained here. The build runs in a child process under `BUILD_ENV` (see the
    module docstring): that is the only way to pin the CPU kernels torch picks when it loads. The child writes to a
    temporary directory and renames it, so an interrupted build never leaves a half model that a later run would
    reuse.
    """
    out = default_model_dir(recipe)
    shipped = None if from_recipe else shipped_build(recipe)
    if from_recipe:
        out = out.with_name(out.name + "-recipe")
    if (out / "model.json").exists() and not force and not _differs_from(out, shipped):
        return EmbeddedModel(out, model_card(out))
    try:  # fail before a minute of training, not after it, when the cache cannot take the model
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NotADirectoryError(f"model cache {out.parent} is not a usable directory (set RLWB_CACHE to one): "
                                 f"{type(e).__name__}: {e}") from None
    with build_lock(out):  # another process building the same recipe: wait for it, then take its model
        if force or not (out / "model.json").exists() or _differs_from(out, shipped):
            if shipped is not None:
                install_shipped(shipped, out)
            else:
                run_pinned_build(recipe, force=True, progress=progress, out=out)
    return EmbeddedModel(out, model_card(out))


def shipped_build(recipe) -> Path | None:
    """The build of record rlwb ships for `recipe` (`PUBLISHED_DIR/<cache dir name>`), or None."""
    d = PUBLISHED_DIR / default_model_dir(recipe).name
    return d if (d / "model.json").exists() else None


def _differs_from(out: Path, shipped: Path | None) -> bool:
    if shipped is None or not (out / "model.json").exists():
        return False
    return (json.loads((out / "model.json").read_text()).get("weights_sha256_16")
            != json.loads((shipped / "model.json").read_text())["weights_sha256_16"])


SUMS = "SHA256SUMS"  # `sha256sum` format: every file of a shipped build but this one


def file_sums(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir())
            if f.is_file() and f.name != SUMS}


def install_shipped(shipped: Path, out: Path) -> None:
    """Copy a shipped build into the cache at `out` (through a temporary directory and a rename), refusing files
    that do not match the build's SHA256SUMS (a corrupted or hand-edited checkout)."""
    want = dict(reversed(line.split()) for line in (shipped / SUMS).read_text().splitlines() if line.strip())
    got = file_sums(shipped)
    if got != want:
        bad = sorted(set(got.items()) ^ set(want.items()))
        raise RuntimeError(f"the shipped model {shipped} does not match its {SUMS} ({', '.join(k for k, _ in bad)}): "
                           f"restore it from git (`git checkout -- {shipped}`)")
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(shipped, tmp)
    (tmp / SUMS).unlink()
    card = json.loads((tmp / "model.json").read_text())
    card["source"] = f"shipped with rlwb ({shipped.relative_to(PUBLISHED_DIR.parent.parent.parent)})"
    (tmp / "model.json").write_text(json.dumps(card, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def publish_build(path: Path) -> Path:
    """Copy a cached build into `PUBLISHED_DIR` with its SHA256SUMS (how a build of record was added: run on the
    reference vendor's machine, then commit the directory)."""
    dest = PUBLISHED_DIR / path.name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(path, dest)
    card = json.loads((dest / "model.json").read_text())
    card.pop("source", None)
    (dest / "model.json").write_text(json.dumps(card, indent=2))
    (dest / SUMS).write_text("".join(f"{h}  {n}\n" for n, h in file_sums(dest).items()))
    return dest


@contextlib.contextmanager
def build_lock(out: Path):
    """An exclusive lock on `out`'s build, held across processes (`fcntl.flock` on `<out>.lock`). Why: on a fresh
    machine `make setup`, a test session and a notebook run each found the default policy missing and built it
    three times at once on 2 cores (35 min instead of 2). The lock ends with its holder, killed or not."""
    import fcntl

    with open(out.with_name(out.name + ".lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_embedded_model(name: str, force: bool = False, progress: bool = True,
                         from_recipe: bool = False) -> EmbeddedModel:
    """`build_default_model` for the embedded model called `name` (see `EMBEDDED_RECIPES`)."""
    return build_default_model(recipe_for(name), force=force, progress=progress, from_recipe=from_recipe)


def build_vendor(card: dict) -> str:
    """The CPU vendor a card's build ran on (cards written before the vendor was recorded name it in the model)."""
    host = card.get("host_cpu") or {}
    if host.get("vendor"):
        return host["vendor"]
    name = str(host.get("model", ""))
    return "AuthenticAMD" if "AMD" in name else "GenuineIntel" if "Intel" in name else "unknown"


def with_published(card: dict) -> dict:
    """The card with today's `PUBLISHED_WEIGHTS` verdict for the vendor it was built on (a cache may predate the
    published checksum), and whether it is the build the README's numbers come from."""
    builds = PUBLISHED_WEIGHTS.get(card.get("recipe_hash", ""), {})
    published = builds.get(build_vendor(card))
    checksum = card.get("weights_sha256_16")
    return {**card, "weights_published_sha256_16": published,
            "weights_match_published": None if published is None else checksum == published,
            "weights_reference_build": bool(builds) and checksum == builds.get(REFERENCE_VENDOR)}


def published_verdict(card: dict) -> str:
    """One line on how a build compares with the published ones (`rlwb build-model`, the build's warning)."""
    vendor, pub = build_vendor(card), card.get("weights_published_sha256_16")
    if pub is None:
        return f"no published build of this recipe for {vendor} CPUs"
    if pub != card.get("weights_sha256_16"):
        return f"DIFFERS from the published {vendor} build {pub}"
    ref = "" if card.get("weights_reference_build") else \
        f"; the README's numbers come from the {REFERENCE_VENDOR} build"
    return f"matches the published {vendor} build{ref}"


def run_pinned_build(recipe, *, force: bool = False, progress: bool = True, env: dict | None = None,
                     out: Path | None = None) -> None:
    """`python -m rlwb.core.models.store` in a child process whose environment is `env` (default: ours) plus BUILD_ENV.
    The child's progress goes to our stderr (a terminal directly; otherwise forwarded line by line, so it
    shows in JupyterLab or a log), or inside an archived run to its progress log (`rlwb.progress`), which
    `rlwb run` echoes to the terminal: never into report.html."""
    import subprocess
    import sys

    kind = {ModelRecipe: "default", ChatModelRecipe: "chat", MoeRecipe: "moe", VariantRecipe: "variant",
            RandomInitRecipe: "random"}[type(recipe)]
    cmd = [sys.executable, "-m", "rlwb.core.models.store", json.dumps(asdict(recipe)), "--kind", kind]
    cmd += ["--force"] * force + ["--quiet"] * (not progress) + (["--out", str(out)] if out else [])
    from rlwb.progress import progress_stream

    child_env = {**(os.environ if env is None else env), **BUILD_ENV}
    out = progress_stream()  # inside an archived run its progress log: a build never lands in report.html
    tty = out is sys.stderr and sys.stderr.isatty()
    proc = subprocess.Popen(cmd, env=child_env, stderr=None if tty else subprocess.PIPE, text=True)
    tail: list[str] = []
    if not tty:
        for line in proc.stderr:
            out.write(line)
            tail = (tail + [line])[-20:]
    if proc.wait() != 0:
        what = "the default policy" if kind == "default" else f"embedded model {recipe.name!r}"
        raise RuntimeError(f"building {what} failed (exit {proc.returncode}): {''.join(tail).strip()}")


def _build_here(recipe, force: bool, progress: bool, out: Path | None = None) -> EmbeddedModel:
    """The build proper; only inside the pinned child process (`run_pinned_build`)."""
    unpinned = {k: os.environ.get(k) for k, v in BUILD_ENV.items() if os.environ.get(k) != v}
    if unpinned:
        raise RuntimeError(f"embedded models must be built under BUILD_ENV (call build_default_model); "
                           f"differs here: {unpinned}")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" is noise in a build log
    out = out or default_model_dir(recipe)
    if (out / "model.json").exists() and not force:
        return EmbeddedModel(out, json.loads((out / "model.json").read_text()))
    torch.set_num_threads(BUILD_THREADS)
    torch.use_deterministic_algorithms(True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if isinstance(recipe, ModelRecipe):
        from rlwb.core.models import llama

        model, fields = llama.build(recipe, tmp, progress)
    elif isinstance(recipe, MoeRecipe):
        from rlwb.core.models import moe

        base = build_embedded_model(recipe.base, progress=progress)  # built first if missing
        model, fields = moe.build(recipe, base, tmp, progress)
    elif isinstance(recipe, VariantRecipe):
        from rlwb.core.models import sampling_defaults_variant

        base = build_embedded_model(recipe.base, progress=progress)  # built first if missing
        model, fields = sampling_defaults_variant.build(recipe, base, tmp)
    elif isinstance(recipe, RandomInitRecipe):
        from rlwb.core.models import random_init

        model, fields = random_init.build(recipe, tmp, progress)
    else:
        from rlwb.core.models import chat

        model, fields = chat.build(recipe, tmp, progress)
    checksum = weights_hash(model)
    card = with_published({
        **{k: v for k, v in fields.items() if k in ("name", "architecture")},
        "recipe": asdict(recipe),
        "recipe_hash": recipe.hash(),
        "params": sum(p.numel() for p in model.parameters()),
        "weights_sha256_16": checksum,
        **{k: v for k, v in fields.items() if k not in ("name", "architecture")},
        "torch_threads": torch.get_num_threads(),
        "build_env": dict(BUILD_ENV),
        "build_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "host_cpu": host_cpu(),
        "torch_version": torch.__version__,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })
    (tmp / "model.json").write_text(json.dumps(card, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    if card["weights_match_published"] is False:
        import sys

        print(f"warning: this build's weights ({checksum}) of recipe {recipe.hash()}: {published_verdict(card)}",
              file=sys.stderr)
    return EmbeddedModel(out, card)


def host_cpu() -> dict:
    """The build machine's CPU vendor, model and widest vector ISA (the vendor selects the published build)."""
    import platform
    import re

    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor(), "isa": "unknown"}
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    vendor = re.search(r"^vendor_id\s*:\s*(.*)$", text, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "other"
    return {"model": model.group(1).strip() if model else platform.processor(), "isa": isa,
            "vendor": vendor.group(1).strip() if vendor else "unknown"}


def resolve_model(model: str, progress: bool = True) -> Path:
    """An embedded model's name (`default`, `qwen2-chat`, ...) → its cached dir (built if missing); anything
    else → an HF id or path."""
    if model in EMBEDDED_NAMES:
        return build_embedded_model(model, progress=progress).path
    return Path(model) if Path(model).exists() else model  # type: ignore[return-value]


def model_card(path) -> dict | None:
    """The model card rlwb wrote for an embedded model's build, or None for other models."""
    p = Path(str(path)) / "model.json"
    return with_published(json.loads(p.read_text())) if p.exists() else None


def _main(argv: list[str] | None = None) -> None:
    """`python -m rlwb.core.models.store RECIPE_JSON [--force] [--quiet]`: the pinned child of `run_pinned_build`."""
    import argparse

    ap = argparse.ArgumentParser(description="build an embedded model (run via build_default_model)")
    ap.add_argument("recipe", help="recipe fields as JSON")
    ap.add_argument("--kind", choices=["default", "chat", "moe", "variant", "random"], default="default")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--out", type=Path, default=None, help="build into this directory (default: the cache's)")
    a = ap.parse_args(argv)
    recipe = {"default": ModelRecipe, "chat": ChatModelRecipe, "moe": MoeRecipe,
              "variant": VariantRecipe, "random": RandomInitRecipe}[a.kind](**json.loads(a.recipe))
    _build_here(recipe, force=a.force, progress=not a.quiet, out=a.out)


if __name__ == "__main__":
    _main()
