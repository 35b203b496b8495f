"""An embedded model trained from its recipe in a child process with pinned CPU code paths (`BUILD_ENV`), and the
card that records the build.

Why a child process: the same recipe gave other weights on an AVX-512 machine than on an AVX2 one (greedy accuracy
0.595 vs 0.645), because torch and MKL pick vectorised kernels per CPU and 400 SFT steps amplify the rounding
differences. Those choices are made when torch loads, so they can only be pinned in a fresh process. The card
records the weights' checksum and whether it equals the published one for its CPU vendor (`published_builds`: the
pins hold across ISAs, not across vendors), which tests assert on every machine.

`python -m rlwb.core.models.pinned_build RECIPE_JSON --kind K --out DIR [--base DIR]` is the child
(`run_pinned_build` starts it); `store.build_default_model` decides when it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlwb import host
from rlwb.core.models.chat import ChatModelRecipe
from rlwb.core.models.llama import ModelRecipe
from rlwb.core.models.moe import MoeRecipe
from rlwb.core.models.published_builds import model_card, published_verdict, with_published
from rlwb.core.models.random_init import RandomInitRecipe
from rlwb.core.models.sampling_defaults_variant import VariantRecipe

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
KINDS = {"default": ModelRecipe, "chat": ChatModelRecipe, "moe": MoeRecipe, "variant": VariantRecipe,
         "random": RandomInitRecipe}  # the child's --kind -> the recipe class it rebuilds from JSON


@dataclass(frozen=True)
class EmbeddedModel:
    path: Path
    card: dict

    @property
    def recipe_hash(self) -> str:
        return self.card["recipe_hash"]


def weights_hash(model) -> str:
    """sha256 over every parameter's bytes, in name order: equal hashes = bitwise equal weights."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def run_pinned_build(recipe, out: Path, *, base: Path | None = None, force: bool = False, progress: bool = True,
                     env: dict | None = None) -> None:
    """`python -m rlwb.core.models.pinned_build` in a child process whose environment is `env` (default: ours) plus
    BUILD_ENV, building `recipe` into `out` (`base`: the built base model a MoE or variant recipe starts from).
    The child's progress goes to our stderr (a terminal directly; otherwise forwarded line by line, so it shows in
    JupyterLab or a log), or inside an archived run to its progress log (`rlwb.progress`), which `rlwb run` echoes
    to the terminal: never into report.html."""
    import subprocess
    import sys

    kind = next(k for k, cls in KINDS.items() if type(recipe) is cls)
    cmd = [sys.executable, "-m", "rlwb.core.models.pinned_build", json.dumps(asdict(recipe)), "--kind", kind,
           "--out", str(out)]
    cmd += ["--force"] * force + ["--quiet"] * (not progress) + (["--base", str(base)] if base else [])
    from rlwb.progress import progress_stream

    child_env = {**(os.environ if env is None else env), **BUILD_ENV}
    stream = progress_stream()  # inside an archived run its progress log: a build never lands in report.html
    tty = stream is sys.stderr and sys.stderr.isatty()
    proc = subprocess.Popen(cmd, env=child_env, stderr=None if tty else subprocess.PIPE, text=True)
    tail: list[str] = []
    if not tty:
        for line in proc.stderr:
            stream.write(line)
            tail = (tail + [line])[-20:]
    if proc.wait() != 0:
        what = "the default policy" if kind == "default" else f"embedded model {recipe.name!r}"
        raise RuntimeError(f"building {what} failed (exit {proc.returncode}): {''.join(tail).strip()}")


def build_here(recipe, out: Path, base: Path | None = None, force: bool = False,
               progress: bool = True) -> EmbeddedModel:
    """The build proper; only inside the pinned child process (`run_pinned_build`). Writes to a temporary directory
    and renames it, so an interrupted build never leaves a half model that a later run would reuse."""
    unpinned = {k: os.environ.get(k) for k, v in BUILD_ENV.items() if os.environ.get(k) != v}
    if unpinned:
        raise RuntimeError(f"embedded models must be built under BUILD_ENV (call build_default_model); "
                           f"differs here: {unpinned}")
    if isinstance(recipe, (MoeRecipe, VariantRecipe)) and base is None:
        raise ValueError(f"{type(recipe).__name__} {recipe.name!r} starts from a built base model: pass base")
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" is noise in a build log
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

        model, fields = moe.build(recipe, EmbeddedModel(base, model_card(base)), tmp, progress)
    elif isinstance(recipe, VariantRecipe):
        from rlwb.core.models import sampling_defaults_variant

        model, fields = sampling_defaults_variant.build(recipe, EmbeddedModel(base, model_card(base)), tmp)
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
        "host_cpu": host.cpu(),
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


def _main(argv: list[str] | None = None) -> None:
    """The pinned child of `run_pinned_build`."""
    import argparse

    ap = argparse.ArgumentParser(description="build an embedded model (run via store.build_default_model)")
    ap.add_argument("recipe", help="recipe fields as JSON")
    ap.add_argument("--kind", choices=list(KINDS), default="default")
    ap.add_argument("--out", type=Path, required=True, help="build into this directory")
    ap.add_argument("--base", type=Path, default=None, help="the built base model (MoE and variant recipes)")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    build_here(KINDS[a.kind](**json.loads(a.recipe)), a.out, base=a.base, force=a.force, progress=not a.quiet)


if __name__ == "__main__":
    _main()
