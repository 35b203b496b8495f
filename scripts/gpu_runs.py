"""The GPU runs of record in one command, sized to one lent H100 (≤ 9 minutes), resumable.

A lent GPU machine has torch and transformers but no vLLM and no package registry (`scripts/device/`), so what runs
there is rlwb's `hf` engine and its trainer: the half of the engine-trainer mismatch a GPU changes. The steps:

- build     `qwen2.5-0.5b-random` (Qwen2.5-0.5B's published config, weights from seed 0; no download)
- 09        notebook 09 with its gpu.yaml: the trainer's settings (bf16, fp16, SDPA/eager/flex/flash, packing,
            micro-batches, compile) against fp32, and whether a row's logprobs change with its batch
- 01-<dt>, 02-<dt>, 04-<dt>   notebooks 01, 02 and 04 with `engines: [hf]` in fp32 and bf16 at the 0.5B shapes:
            hf decode (KV cache) against the fp32 trainer's full forward
- 03        a short toy GRPO, the hf engine in bf16 against the fp32 trainer on the embedded default model
- memory    `scripts/gpu_memory_check.py`: the memory plan against torch's measured peaks

Each notebook is archived by `rlwb run` as usual (run.json names the GPU, its driver, CUDA and torch). Steps run in
lanes side by side (a step that needs the 0.5B model waits for `build`); at `--budget` seconds the steps still
running are interrupted (archived as such) and everything finished is packed into ≤ 8 files under `--out`. Run it
again and it does only what is not done (a step is done when its marker names an `ok` run under the archive root).

    scripts/gpu_runs.sh                      # on the GPU machine (installs the carried wheels first)
    scripts/gpu_runs.sh --cpu                # the CPU rehearsal: tiny sizes, the embedded default model
    python scripts/gpu_runs.py --list        # the steps and their commands
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PART_BYTES = 15 * 2**20  # the device returns files of ≤ 16 MiB, ≤ 8 of them
MAX_FILES = 8


@dataclass
class Step:
    name: str
    argv: list[str]  # after `python -m rlwb.cli` for notebook runs; a whole command for `script` steps
    lane: int
    needs_build: bool = False
    script: bool = False  # not an `rlwb run`: its stdout is saved as <name>.json under the output
    est_s: float = 60  # its time on an H100 (measured 2026-11-27, lanes side by side): not started unless it fits
    env: dict = field(default_factory=dict)


def nb_run(stem: str, files: list[str], overrides: dict) -> list[str]:
    argv = ["run", f"notebooks/{stem}.ipynb"]
    for f in files:
        argv += ["-f", f"params/{stem}/{f}"]
    for k, v in overrides.items():
        argv += ["-p", k, json.dumps(v) if isinstance(v, list) else str(v)]
    return argv


def plan(cpu: bool) -> list[Step]:
    """The steps, by lane. GPU sizes are fixed by the 9-minute budget (hf decodes one request at a time, ~20 ms a
    token at 0.5B); the CPU rehearsal runs every step at the smallest sizes on the embedded default model."""
    # lanes side by side on the GPU (a lane's steps run in order): 0 builds the 0.5B model, then 09; 1, 3 and 4 the
    # hf-engine notebooks; 2 the GRPO run (~12 s a step on the H100) and the memory check, which need no build, then
    # 09's compile settings, which a first call of ~5 minutes leaves to a second. The CPU rehearsal runs them one
    # after another (`--lanes 1`)
    big = "default" if cpu else "qwen2.5-0.5b-random"
    steps = [] if cpu else [Step("build", ["build-model", "--model", big], lane=0)]
    if cpu:
        steps.append(Step("09", nb_run("09_trainer_settings", ["smoke.yaml"], {
            "prompts": 2, "max_tokens": 6, "settings": ["batch1", "bf16"],
            "grid_engines": [], "grid_settings": ["fp32"]}), lane=0))
    else:
        # torch.compile's two settings took ~3 min each on the H100 (inductor compiling 24 layers), the other 16
        # under 3 min together: they are a step of their own, so neither outlasts one device call
        settings = yaml.safe_load((ROOT / "params/09_trainer_settings/gpu.yaml").read_text())["settings"]
        for name, part in (("09", [s for s in settings if "compile" not in s]),
                           ("09-compile", [s for s in settings if "compile" in s])):
            steps.append(Step(name, nb_run("09_trainer_settings", ["gpu.yaml"], {
                "prompts": 16, "max_tokens": 64, "settings": part}), lane=0 if name == "09" else 2,
                needs_build=True, est_s=170 if name == "09" else 420))
    # the hf-engine notebooks: each `params/<stem>/gpu-hf.yaml` (after its gpu.yaml), in fp32 (the control: the
    # float floor on this GPU) and bf16, spread over lanes 1, 3 and 4; the rehearsal shrinks them to the default model
    shrink = {"model": "default", "prompts": 2, "max_tokens": 6}
    hf_files = sorted(ROOT.glob("params/*/gpu-hf.yaml"))
    k = 0
    for f in hf_files:
        stem = f.parent.name
        for dt in ("float32", "bfloat16"):
            if cpu and dt != "float32":
                continue  # one dtype per notebook proves the imports and the script; the rehearsal must stay short
            over = {"dtype": dt, **(shrink if cpu else {})}
            if cpu and "prefix_tokens" in yaml.safe_load(f.read_text()):
                over["prefix_tokens"] = 64
            steps.append(Step(f"{stem[:2]}-{dt}", nb_run(stem, ["gpu.yaml", "gpu-hf.yaml"], over),
                              lane=(1, 3, 4)[k % 3], needs_build=True, est_s=130))
            k += 1
    grpo = {"engines": ["hf"], "dtype": "bfloat16", "corrections": ["none"], "num_seeds": 1 if cpu else 2,
            "steps": 2 if cpu else 8, "prompts_per_step": 2 if cpu else 8, "group_size": 4 if cpu else 8,
            "max_tokens": 8 if cpu else 48, "micro_batch": 1, "concurrent_runs": 1, "model": "default"}
    steps.insert(0 if cpu else 1, Step("03", nb_run("03_toy_grpo", ["gpu.yaml"], grpo), lane=2, est_s=200))
    if not cpu:
        steps.insert(2, Step("memory", [sys.executable, "scripts/gpu_memory_check.py"], lane=2, script=True,
                             est_s=60))
        steps.sort(key=lambda s: s.name == "09-compile")  # last in its lane: the step most likely cut
    return steps


class Runner:
    def __init__(self, args):
        self.a = args
        self.archive = Path(args.archive)
        self.markers = self.archive / "gpu-steps"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.out = Path(args.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs = self.archive / "gpu-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.procs: dict[str, subprocess.Popen] = {}
        self.lock = threading.Lock()
        self.built = threading.Event()
        self.results: dict[str, str] = {}

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f} s] {msg}", flush=True)

    def done(self, step: Step) -> str | None:
        """The run a step finished (its marker), if that run is still archived as ok."""
        m = self.markers / f"{step.name}.done"
        if not m.is_file():
            return None
        target = m.read_text().strip()
        if step.script or step.name == "build":
            return target
        rec = Path(target) / "run.json"
        try:
            return target if json.loads(rec.read_text()).get("status") == "ok" else None
        except (OSError, ValueError):
            return None

    def over_budget(self) -> bool:
        return time.monotonic() - self.t0 > self.a.budget

    def run_step(self, step: Step) -> None:
        if step.needs_build and not self.a.cpu:
            self.built.wait()
        if self.done(step):
            self.say(f"{step.name}: done before ({self.done(step)})")
            self.results[step.name] = "done before"
            return
        left = self.a.budget + self.a.grace - (time.monotonic() - self.t0)
        if not self.a.cpu and step.est_s > left:
            self.say(f"{step.name}: not started (~{step.est_s:.0f} s, {max(left, 0):.0f} s left of the budget): "
                     "run this again to finish it")
            self.results[step.name] = "not started"
            return
        if step.script:
            cmd = step.argv
        else:
            cmd = [sys.executable, "-m", "rlwb.cli", *step.argv]
            if step.argv[0] == "run":
                cmd += ["--outputs", str(self.archive)]
        self.say(f"{step.name}: {shlex.join(cmd[1:] if not step.script else cmd)}")
        log = (self.logs / f"{step.name}.log").open("w")
        stdout = (self.out / f"{step.name}.json").open("w") if step.script else log
        with self.lock:
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=log, env={**os.environ, **step.env},
                                 start_new_session=True)
            self.procs[step.name] = p
        rc = p.wait()
        with self.lock:
            self.procs.pop(step.name, None)
        log.close()
        if step.script:
            stdout.close()
        target = self.run_dir_of(step) if step.argv[0] == "run" else step.name
        status = "ok" if rc == 0 else f"failed (exit {rc}; log {self.logs / (step.name + '.log')})"
        if rc == 0 and target:
            (self.markers / f"{step.name}.done").write_text(str(target))
        self.results[step.name] = status
        self.say(f"{step.name}: {status}" + (f" -> {target}" if target else ""))
        if not step.script:
            tail = (self.logs / f"{step.name}.log").read_text().strip().splitlines()[-3:]
            if rc != 0:
                for line in tail:
                    self.say(f"  | {line}")

    def run_dir_of(self, step: Step) -> str | None:
        """The archive `rlwb run` printed as its last stdout line."""
        lines = (self.logs / f"{step.name}.log").read_text().strip().splitlines()
        for line in reversed(lines):
            if line.startswith(str(self.archive)) and Path(line.strip()).is_dir():
                return line.strip()
        return None

    def lane(self, steps: list[Step]) -> None:
        for s in steps:
            self.run_step(s)
            if s.name == "build":
                self.built.set()

    def watchdog(self) -> None:
        while time.monotonic() - self.t0 < self.a.budget + self.a.grace:
            time.sleep(2)
            if self.over_budget() and self.procs and not getattr(self, "_warned", False):
                self._warned = True
                self.say(f"budget of {self.a.budget:.0f} s spent: {len(self.procs)} step(s) get "
                         f"{self.a.grace:.0f} s more, then are interrupted")
        with self.lock:
            for name, p in self.procs.items():
                self.say(f"{name}: interrupted at the budget (archived as interrupted; run again to finish it)")
                try:
                    os.killpg(p.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass

    def go(self, steps: list[Step]) -> int:
        if not self.a.cpu and not any(s.name == "build" for s in steps):
            self.built.set()
        if self.a.cpu or any(s.name == "build" and self.done(s) for s in steps):
            self.built.set()
        lanes: dict[int, list[Step]] = {}
        for s in steps:
            lanes.setdefault(s.lane if self.a.lanes > 1 else 0, []).append(s)
        threads = [threading.Thread(target=self.lane, args=(ls,), daemon=True) for ls in lanes.values()]
        dog = threading.Thread(target=self.watchdog, daemon=True)
        dog.start()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.pack()
        failed = [n for n, r in self.results.items() if r not in ("ok", "done before")]
        self.say("summary: " + ", ".join(f"{n} {r}" for n, r in self.results.items()))
        return 1 if failed else 0

    def pack(self) -> None:
        """Every finished step's archive, the logs and the markers, as a tar split into ≤ 15 MiB parts."""
        tar_path = self.out / "gpu_runs.tar.gz"
        runs = sorted({m.read_text().strip() for m in self.markers.glob("*.done")}
                      | {str(d) for d in self.archive.glob("*/*") if (d / "run.json").is_file()})
        with tarfile.open(tar_path, "w:gz") as tar:
            for r in runs:
                p = Path(r)
                if p.is_dir() and p.is_relative_to(self.archive):
                    tar.add(p, arcname=str(p.relative_to(self.archive)))
            for d in (self.markers, self.logs):
                tar.add(d, arcname=d.name)
        size = tar_path.stat().st_size
        parts = []
        with tar_path.open("rb") as f:
            i = 0
            while chunk := f.read(PART_BYTES):
                part = self.out / f"gpu_runs.tar.gz.part{i}"
                part.write_bytes(chunk)
                parts.append(part)
                i += 1
        tar_path.unlink()
        files = list(self.out.iterdir())
        self.say(f"packed {len(runs)} archive(s), {size / 2**20:.1f} MiB in {len(parts)} part(s) under {self.out}"
                 + ("" if len(files) <= MAX_FILES else f" -- {len(files)} files: more than the {MAX_FILES} "
                    "the device returns"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="the CPU rehearsal: tiny sizes, the embedded default model")
    ap.add_argument("--steps", default="", help="comma-separated step names (default: every step not done)")
    ap.add_argument("--budget", type=float, default=480, help="seconds after which no step starts")
    ap.add_argument("--grace", type=float, default=45, help="seconds a running step gets past the budget")
    ap.add_argument("--lanes", type=int, default=5, help="lanes side by side (1: every step one after another)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "outputs" / "gpu-out"),
                    help="where the packed runs go (the device's $OUT)")
    ap.add_argument("--archive", default=str(ROOT / "outputs" / "gpu"), help="archive root of the runs")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run from a tree with uncommitted changes (its runs cannot be published)")
    a = ap.parse_args()
    steps = plan(a.cpu)
    if a.steps:
        names = a.steps.split(",")
        unknown = [n for n in names if n not in {s.name for s in steps}]
        if unknown:
            ap.error(f"unknown step(s) {unknown}; the steps are {[s.name for s in steps]}")
        steps = [s for s in steps if s.name in names]
    if not a.cpu and not a.list and not a.allow_dirty:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal"], cwd=ROOT,
                               capture_output=True, text=True)
        if dirty.returncode != 0 or dirty.stdout.strip():
            ap.error("the working tree is not a clean commit (git status: "
                     f"{(dirty.stdout or dirty.stderr).strip().splitlines()[:3]}): `rlwb publish` refuses runs made "
                     "from it, and `rlwb run` cannot resume them. Commit first (the device gets the tree as it is), "
                     "or pass --allow-dirty for a run that will not be of record")
    if a.list:
        for s in steps:
            print(f"{s.name:16s} lane {s.lane}  {shlex.join(s.argv)}")
        return 0
    return Runner(a).go(steps)


if __name__ == "__main__":
    sys.exit(main())
