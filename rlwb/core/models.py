"""The embedded default policy: a tiny Llama (GQA + RoPE) that rlwb builds and SFT-trains itself.

Why: nothing can be downloaded from a model hub here, and the experiments need a policy that (a) real
vLLM loads as a Llama, (b) is deterministic from a seed, (c) solves the toy task only partly, so RL has
headroom, and (d) writes completions long enough for per-token mismatch to accumulate.

Why the SFT corpus has a bad habit: half its examples write the final sum reversed ("#521" for 125). A
policy whose only errors are capability errors (miscopied digits) gives an RL gradient that is mostly
noise at this size: with the habit-free recipe (190 steps, greedy accuracy 0.435) every learning rate
tried made GRPO *lower* the reward (Adam lr 3e-4: 0.45 -> 0.03 in 40 steps; a step of norm 0.03 along
a 512-rollout policy gradient already lowered the sampled reward 0.437 -> 0.409). A habit that the
reward alone reveals is one consistent direction, so GRPO learns it in tens of steps (measured with the
HF engine, lr 1e-4, T 0.7: batch reward 0.67 -> 0.86 over 30 steps, greedy accuracy 0.525 -> 0.84) and
the engines' logprob errors have something to disturb. Toy RL testbeds use the same construction.

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
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rlwb.core import tasks, tokenizer
from rlwb.core.chat_model import ChatModelRecipe
from rlwb.core.checkpoint_variant import VariantRecipe
from rlwb.core.moe_model import MoeRecipe
from rlwb.core.random_model import RandomInitRecipe
from rlwb.paths import cache_dir

RECIPE_VERSION = 2  # bump when the training code changes in a way the fields below do not capture
# 2: built under BUILD_ENV (ISA-independent weights); version-1 builds depended on the machine's CPU.

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


@dataclass(frozen=True)
class ModelRecipe:
    """Everything that determines the default policy's weights."""

    hidden_size: int = 128  # d_model
    intermediate_size: int = 384  # SwiGLU width
    num_hidden_layers: int = 4
    num_attention_heads: int = 4  # head_dim = 32
    num_key_value_heads: int = 2  # GQA: 2 query heads share each KV head
    max_position_embeddings: int = 4096  # long enough for the long-context checks on CPU
    rope_theta: float = 10000.0
    seed: int = 0
    train_steps: int = 400  # SFT steps: digits copied reliably, the reversal habit the only common error
    reversed_answer_frac: float = 0.5  # share of SFT targets with the sum reversed (the habit RL removes)
    batch_size: int = 64
    lr: float = 3e-3
    warmup_steps: int = 50
    max_digits: int = 3  # operands of 1..3 digits
    version: int = RECIPE_VERSION

    def hash(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def llama_config(recipe: ModelRecipe):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer.VOCAB),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_hidden_layers,
        num_attention_heads=recipe.num_attention_heads,
        num_key_value_heads=recipe.num_key_value_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_theta=recipe.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.BOS_ID,
        eos_token_id=tokenizer.EOS_ID,
        pad_token_id=tokenizer.PAD_ID,
        torch_dtype="float32",
    )


def sft_batch(problems: list[tasks.Problem], reversed_mask: list[bool] | None = None):
    """(input_ids, labels) for teacher forcing: loss only on completion tokens (+ EOS). `reversed_mask[i]`
    makes example i a `reversed_answer` (the corpus's bad habit)."""
    import torch

    reversed_mask = reversed_mask or [False] * len(problems)
    seqs, labels = [], []
    for p, rev in zip(problems, reversed_mask):
        prompt = tokenizer.encode_prompt(p.prompt)
        target = p.reversed_answer if rev else p.worked_answer
        completion = tokenizer.encode_prompt(target)[1:] + [tokenizer.EOS_ID]
        seqs.append(prompt + completion)
        labels.append([-100] * len(prompt) + completion)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.PAD_ID, dtype=torch.long)
    lab = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (s, lab_i) in enumerate(zip(seqs, labels)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(lab_i)] = torch.tensor(lab_i)
    return ids, lab


def train(recipe: ModelRecipe, progress: bool = True):
    """SFT from a seeded random init. Deterministic for a given recipe and thread count."""
    import torch
    from transformers import LlamaForCausalLM

    from rlwb.progress import progress_bar

    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(llama_config(recipe)).float()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / recipe.warmup_steps) * max(0.05, 1 - s / recipe.train_steps)
    )
    # Training data seeds are disjoint from evaluation seeds (eval uses seed + 10**6 upward).
    model.train()
    for step in progress_bar(range(recipe.train_steps), desc="SFT default policy", disable=not progress):
        problems = tasks.make_problems(recipe.batch_size, seed=recipe.seed * 100_003 + step,
                                       max_digits=recipe.max_digits)
        habit = random.Random(f"habit-{recipe.seed}-{step}")  # independent of the problem stream
        ids, lab = sft_batch(problems, [habit.random() < recipe.reversed_answer_frac for _ in problems])
        loss = model(input_ids=ids, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return model


def weights_hash(model) -> str:
    """sha256 over every parameter's bytes, in name order: equal hashes = bitwise equal weights."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def greedy_eval(model, n: int = 200, seed: int = 10**6, max_digits: int = 3, max_new_tokens: int = 40):
    """Greedy accuracy, mean completion length (tokens incl. EOS) and the share of answers written reversed
    (the SFT habit; sums that read the same both ways are not counted) on `n` held-out problems."""
    import torch

    problems = tasks.make_problems(n, seed=seed, max_digits=max_digits)
    prompts = [tokenizer.encode_prompt(p.prompt) for p in problems]
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), tokenizer.PAD_ID, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=tokenizer.PAD_ID, eos_token_id=tokenizer.EOS_ID)
    rows, lengths, rewards, habit = [], [], [], 0
    for p, seq in zip(problems, out[:, width:].tolist()):
        n_tok = seq.index(tokenizer.EOS_ID) + 1 if tokenizer.EOS_ID in seq else len(seq)
        text = tokenizer.decode(seq)
        r = tasks.reward(p, text)
        rows.append({"prompt": p.prompt, "completion": text, "target": p.worked_answer, "reward": r})
        lengths.append(n_tok)
        rewards.append(r)
        habit += tasks.is_reversed(p, text)
    return {
        "greedy_accuracy": sum(rewards) / n,
        "reversed_answer_frac": habit / n,
        "mean_completion_tokens": sum(lengths) / n,
        "samples": rows,
    }


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
                    # engine and the trainer must ignore them (rlwb/core/checkpoint_variant.py)
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
    """`python -m rlwb.core.models` in a child process whose environment is `env` (default: ours) plus BUILD_ENV.
    The child's progress goes to our stderr (a terminal directly; otherwise forwarded line by line, so it
    shows in JupyterLab or a log), or inside an archived run to its progress log (`rlwb.progress`), which
    `rlwb run` echoes to the terminal: never into report.html."""
    import subprocess
    import sys

    kind = {ModelRecipe: "default", ChatModelRecipe: "chat", MoeRecipe: "moe", VariantRecipe: "variant",
            RandomInitRecipe: "random"}[type(recipe)]
    cmd = [sys.executable, "-m", "rlwb.core.models", json.dumps(asdict(recipe)), "--kind", kind]
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


def _build_default_policy(recipe: ModelRecipe, out: Path, progress: bool) -> tuple[object, dict]:
    """Train the default policy and save it into `out`; returns (model, card fields)."""
    t0 = time.time()
    model = train(recipe, progress=progress)
    build_s = time.time() - t0
    ev = greedy_eval(model, max_digits=recipe.max_digits)
    model.save_pretrained(out, safe_serialization=True)
    gen_cfg = out / "generation_config.json"
    gen_cfg.write_text(json.dumps({"bos_token_id": tokenizer.BOS_ID, "eos_token_id": tokenizer.EOS_ID,
                                   "pad_token_id": tokenizer.PAD_ID}, indent=2))
    tokenizer.save_tokenizer(tokenizer.build_tokenizer(), out)
    return model, {
        "name": "rlwb-default-policy",
        "architecture": "LlamaForCausalLM (GQA + RoPE), char-level tokenizer",
        "greedy_accuracy": ev["greedy_accuracy"],
        "reversed_answer_frac": ev["reversed_answer_frac"],
        "mean_completion_tokens": ev["mean_completion_tokens"],
        "eval_problems": 200,
        "build_s": round(build_s, 1),
    }


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
        model, fields = _build_default_policy(recipe, tmp, progress)
    elif isinstance(recipe, MoeRecipe):
        from rlwb.core import moe_model

        base = build_embedded_model(recipe.base, progress=progress)  # built first if missing
        model, fields = moe_model.build(recipe, base, tmp, progress)
    elif isinstance(recipe, VariantRecipe):
        from rlwb.core import checkpoint_variant

        base = build_embedded_model(recipe.base, progress=progress)  # built first if missing
        model, fields = checkpoint_variant.build(recipe, base, tmp)
    elif isinstance(recipe, RandomInitRecipe):
        from rlwb.core import random_model

        model, fields = random_model.build(recipe, tmp, progress)
    else:
        from rlwb.core import chat_model

        model, fields = chat_model.build(recipe, tmp, progress)
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
    """`python -m rlwb.core.models RECIPE_JSON [--force] [--quiet]`: the pinned child of `run_pinned_build`."""
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
