"""Download one source distribution from the package index pip is configured with, checking its sha256.

Why not `pip download vllm==0.8.5 --no-binary vllm`: vLLM's CPU build names itself `0.8.5+cpu`, so pip
rejects the sdist for an "inconsistent version". We ask the index pip uses (PIP_INDEX_URL or pip's own
default) for the file list (PEP 691 JSON) and fetch the exact file.

usage: python scripts/fetch_sdist.py NAME VERSION DEST_DIR   → prints the file's path
"""

import hashlib
import json
import os
import sys
import urllib.request
from pathlib import Path


def index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        from pip._internal.models.index import PyPI  # pip's own default index

        url = PyPI.simple_url
    return url.rstrip("/") + "/"


def main(name: str, version: str, dest: str) -> None:
    filename = f"{name}-{version}.tar.gz"
    out = Path(dest) / filename
    if out.exists():
        print(out)
        return
    req = urllib.request.Request(index_url() + name + "/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        files = json.load(r)["files"]
    match = [f for f in files if f["filename"] == filename]
    if not match:
        sys.exit(f"fetch_sdist: {filename} is not on the index {index_url()}")
    f = match[0]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    with urllib.request.urlopen(f["url"], timeout=600) as r, open(tmp, "wb") as w:
        w.write(r.read())
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    if "sha256" in f.get("hashes", {}) and digest != f["hashes"]["sha256"]:
        tmp.unlink()
        sys.exit(f"fetch_sdist: sha256 mismatch for {filename}")
    tmp.rename(out)
    print(out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
