"""The builds of record shipped with rlwb (`published/<name>-<recipe hash>/`) and the checksums every machine of a
CPU vendor must reproduce (`PUBLISHED_WEIGHTS`): installing a shipped build into the cache, publishing one, and a
build card's verdict against them.

Why shipped builds: the pinned build (`pinned_build`) gives the same weights on every ISA of one CPU vendor, not
across vendors (an Intel Xeon trained other weights from the same recipe than the AMD EPYC of record), so a nightly
audit that moved between machines compared different policies. Where a build is shipped, that is the model on
every machine."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

# recipe hash -> CPU vendor -> weights checksum of the build every machine of that vendor must reproduce.
# The pins make a build independent of the ISA and thread layout on one vendor's CPUs, but not across vendors:
# the same pinned default recipe built other weights on an Intel Xeon (Sapphire Rapids, AVX-512 + AMX) than on
# the AMD EPYC of record (greedy accuracy 0.67 vs 0.565). Ruled out on the Intel machine (checksum unchanged):
# MKL_DYNAMIC=FALSE, one MKL thread, MKL_ENABLE_INSTRUCTIONS=AVX2, strict CNR (COMPATIBLE,STRICT); MKL's own
# AVX2 / AVX-512 branches give still other weights. Tests assert a machine reproduces its vendor's build.
# The README's numbers come from REFERENCE_VENDOR's builds.
PUBLISHED_WEIGHTS: dict[str, dict[str, str]] = {
    "e681a5e09fd3": {"AuthenticAMD": "55ff690a01f1bba5",  # default: AMD EPYC, AVX-512
                     "GenuineIntel": "cf6e9d946fdb11b9"},  # default: Intel Xeon (Sapphire Rapids)
    "3247b68a9fe7": {"AuthenticAMD": "a62e40a6ea9f6d69",  # qwen2-chat, Python 3.11.7 stdlib: greedy acc 0.41
                     "GenuineIntel": "f536d2093f18cffe"},  # qwen2-chat on the Intel Xeon: greedy accuracy 0.46
    "d8989e3ee50a": {"AuthenticAMD": "5f05af192dcabf07"},  # qwen2.5-0.5b-random (Python 3.11.7 stdlib)
    # qwen2.5-0.5b-random on the lent GPU machine's image (Python 3.12.3 stdlib: another tokenizer, so another recipe),
    # built on its Intel Xeon: the same weights as the 3.11.7 recipe on AMD (a random init meets no corpus, no matmul)
    "c53ecd0ec60f": {"GenuineIntel": "5f05af192dcabf07"},
}
REFERENCE_VENDOR = "AuthenticAMD"
PUBLISHED_DIR = Path(__file__).with_name("published")  # the builds of record, shipped with rlwb
SUMS = "SHA256SUMS"  # `sha256sum` format: every file of a shipped build but this one


def differs_from(out: Path, shipped: Path | None) -> bool:
    """Whether the build cached at `out` has other weights than the shipped build `shipped` (False when either is
    missing)."""
    if shipped is None or not (out / "model.json").exists():
        return False
    return (json.loads((out / "model.json").read_text()).get("weights_sha256_16")
            != json.loads((shipped / "model.json").read_text())["weights_sha256_16"])


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
    """Copy a cached build into `PUBLISHED_DIR` with its SHA256SUMS (how a build of record is added: run on the
    reference vendor's machine, then commit the directory)."""
    dest = PUBLISHED_DIR / path.name
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(path, dest)
    card = json.loads((dest / "model.json").read_text())
    card.pop("source", None)
    (dest / "model.json").write_text(json.dumps(card, indent=2))
    (dest / SUMS).write_text("".join(f"{h}  {n}\n" for n, h in file_sums(dest).items()))
    return dest


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


def model_card(path) -> dict | None:
    """The model card rlwb wrote for an embedded model's build, with today's published verdict (`with_published`),
    or None for other models."""
    p = Path(str(path)) / "model.json"
    return with_published(json.loads(p.read_text())) if p.exists() else None
