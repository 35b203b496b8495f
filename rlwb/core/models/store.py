"""Every embedded model by name, and its build in the cache: reused when there, installed from the build of record
rlwb ships (`published_builds`) or trained in the pinned child process (`pinned_build`) when not, one process at a
time (`build_lock`). The recipes are `llama`, `chat`, `moe`, `sampling_defaults_variant`, `random_init`.

The built model is cached under `cache_dir()/models/<name>-<recipe hash>/` and reused: the hash covers every recipe
value, so changing the recipe builds a new model and never silently reuses an old one.
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path

from rlwb.core.models import published_builds
from rlwb.core.models.chat import ChatModelRecipe
from rlwb.core.models.llama import ModelRecipe
from rlwb.core.models.moe import MoeRecipe
from rlwb.core.models.pinned_build import EmbeddedModel, run_pinned_build
from rlwb.core.models.published_builds import differs_from, install_shipped, model_card
from rlwb.core.models.random_init import RandomInitRecipe
from rlwb.core.models.sampling_defaults_variant import VariantRecipe
from rlwb.paths import cache_dir

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


def shipped_build(recipe) -> Path | None:
    """The build of record rlwb ships for `recipe` (`PUBLISHED_DIR/<cache dir name>`), or None."""
    d = published_builds.PUBLISHED_DIR / default_model_dir(recipe).name
    return d if (d / "model.json").exists() else None


def build_default_model(recipe=ModelRecipe(), force: bool = False, progress: bool = True,
                        from_recipe: bool = False) -> EmbeddedModel:
    """The embedded model of `recipe` (the default policy unless it says otherwise) in the cache; returns its path
    and model card.

    Where rlwb ships the build of record (`shipped_build`), that is the model, on every machine: its files are
    copied into the cache and checked against their recorded sha256 (`published_builds`: why). A cached model with
    other weights than the shipped ones (a build from before) is replaced. `from_recipe` trains the recipe here
    instead, into `<cache dir>-recipe` (the shipped copy is left alone): how the shipped weights are verified
    (`rlwb build-model --from-recipe`).

    A recipe with no shipped build is trained here, in the pinned child process (`pinned_build`: why); a MoE or
    variant recipe's base model is built (or taken from the cache) first.
    """
    out = default_model_dir(recipe)
    shipped = None if from_recipe else shipped_build(recipe)
    if from_recipe:
        out = out.with_name(out.name + "-recipe")
    if (out / "model.json").exists() and not force and not differs_from(out, shipped):
        return EmbeddedModel(out, model_card(out))
    try:  # fail before a minute of training, not after it, when the cache cannot take the model
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NotADirectoryError(f"model cache {out.parent} is not a usable directory (set RLWB_CACHE to one): "
                                 f"{type(e).__name__}: {e}") from None
    with build_lock(out):  # another process building the same recipe: wait for it, then take its model
        if force or not (out / "model.json").exists() or differs_from(out, shipped):
            if shipped is not None:
                install_shipped(shipped, out)
            else:
                base = (build_embedded_model(recipe.base, progress=progress).path
                        if isinstance(recipe, (MoeRecipe, VariantRecipe)) else None)
                run_pinned_build(recipe, out, base=base, force=True, progress=progress)
    return EmbeddedModel(out, model_card(out))


@contextlib.contextmanager
def build_lock(out: Path):
    """An exclusive lock on `out`'s build, held across processes (filelock's `FileLock` on `<out>.lock`: an flock,
    which ends with its holder, killed or not). Waits as long as the holder builds, silently, then the waiter finds
    the model built. Why: on a fresh machine `make setup`, a test session and a notebook run each found the default
    policy missing and built it three times at once on 2 cores (35 min instead of 2)."""
    from filelock import FileLock

    with FileLock(out.with_name(out.name + ".lock")):
        yield


def build_embedded_model(name: str, force: bool = False, progress: bool = True,
                         from_recipe: bool = False) -> EmbeddedModel:
    """`build_default_model` for the embedded model called `name` (see `EMBEDDED_RECIPES`)."""
    return build_default_model(recipe_for(name), force=force, progress=progress, from_recipe=from_recipe)


def resolve_model(model: str, progress: bool = True) -> Path:
    """An embedded model's name (`default`, `qwen2-chat`, ...) → its cached dir (built if missing); anything
    else → an HF id or path."""
    if model in EMBEDDED_NAMES:
        return build_embedded_model(model, progress=progress).path
    return Path(model) if Path(model).exists() else model  # type: ignore[return-value]
