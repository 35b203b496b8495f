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
from dataclasses import dataclass
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
    script: bool = False  # not an `rlwb run`: its stdout is saved as gpu-logs/<name>.txt, which is packed
    est_s: float = 60  # its time on an H100 (measured 2026-11-27, lanes side by side): not started unless it fits
    phase: int = 1  # 0: before the lanes (the memory check, alone on the GPU, beside the build)


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
    # the memory check first, alone on the GPU, beside the build (CPU); then lanes side by side (a lane's steps run
    # in order): 0 notebook 09, 5 its compile settings (the longest step, so it starts first), 1, 3 and 4 the
    # hf-engine notebooks, 2 the GRPO run (~12 s a step on the H100). The CPU rehearsal runs them one after another
    # (`--lanes 1`)
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
                "prompts": 16, "max_tokens": 64, "settings": part}), lane=0 if name == "09" else 5,
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
        steps.insert(1, Step("memory", [sys.executable, "scripts/gpu_memory_check.py"], lane=2, script=True,
                             est_s=60, phase=0))
    return steps


class Runner:
    """Runs the steps: first the `phase 0` steps side by side (the model build, on the CPU, and the memory check,
    alone on the GPU so no other step's allocations meet its measured peaks), then the lanes."""

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
        self.phase0_done = threading.Event()  # the lanes' GPU steps wait for it (the build's lane starts before)
        self.build_ok = True
        self.results: dict[str, str] = {}

    def say(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.0f} s] {msg}", flush=True)

    def done(self, step: Step) -> str | None:
        """What a step finished (its marker): a notebook run only while it is still archived as ok."""
        m = self.markers / f"{step.name}.done"
        if not m.is_file():
            return None
        target = m.read_text().strip()
        if step.script or step.name == "build":
            return target
        try:
            rec = json.loads((Path(target) / "run.json").read_text())
        except (OSError, ValueError):
            return None
        # a run of another commit is not this command's: its code is not the code a rerun would run
        head = self.head()
        return target if rec.get("status") == "ok" and (head is None or rec.get("git_commit") == head) else None

    def head(self) -> str | None:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    def left(self) -> float:
        return self.a.budget + self.a.grace - (time.monotonic() - self.t0)

    def run_step(self, step: Step) -> None:
        if step.needs_build:
            self.built.wait()
            if not self.build_ok:
                self.results[step.name] = "not started (the build failed)"
                self.say(f"{step.name}: not started: the build failed")
                return
        if self.done(step):
            self.say(f"{step.name}: done before ({self.done(step)})")
            self.results[step.name] = "done before"
            return
        if step.est_s > self.left() and not self.a.cpu:
            self.say(f"{step.name}: not started (~{step.est_s:.0f} s, {max(self.left(), 0):.0f} s left of the "
                     "budget): run this again to finish it")
            self.results[step.name] = "not started"
            return
        if self.left() <= 0:
            self.results[step.name] = "not started"
            return
        if step.script:
            cmd = step.argv
        else:
            cmd = [sys.executable, "-m", "rlwb.cli", *step.argv]
            if step.argv[0] == "run":
                cmd += ["--outputs", str(self.archive)]
        self.say(f"{step.name}: {shlex.join(cmd[1:] if not step.script else cmd)}")
        log_path = self.logs / f"{step.name}.log"
        out_path = self.logs / f"{step.name}.txt"  # a script's stdout (the memory check's JSON lines), packed
        with log_path.open("w") as log, (out_path.open("w") if step.script else open(os.devnull, "w")) as out:
            with self.lock:
                # its own process group (not a new session): the watchdog interrupts the group, and the device
                # ends it with this command, so nothing outlives a call to run beside the next one
                p = subprocess.Popen(cmd, cwd=ROOT, stdout=out if step.script else log, stderr=log,
                                     process_group=0)
                self.procs[step.name] = p
            rc = p.wait()
            with self.lock:
                self.procs.pop(step.name, None)
        target = self.run_dir_of(step) if step.argv[0] == "run" else step.name
        # the memory check exits 1 when the plan is below a measured peak: a finding, complete in its output
        finding = step.script and rc == 1 and out_path.read_text().strip().endswith("}")
        status = "ok" if rc == 0 else ("ok (the check reports a plan below a peak)" if finding else
                                        f"failed (exit {rc}; log {log_path})")
        if (rc == 0 or finding) and target:
            (self.markers / f"{step.name}.done").write_text(str(target))
        self.results[step.name] = status
        self.say(f"{step.name}: {status}" + (f" -> {target}" if target else ""))
        if rc != 0 and not finding:
            for line in log_path.read_text().strip().splitlines()[-3:]:
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
            if s.phase != 0 and s.name != "build":
                # the build's lane starts beside phase 0, but its next step must not meet the memory check on the
                # GPU (on the H100 of record notebook 09 did, and ran out of memory)
                self.phase0_done.wait()
            try:
                self.run_step(s)
            except Exception as e:  # a lane that dies must not leave the others waiting or the runs unpacked
                self.results[s.name] = f"failed ({type(e).__name__}: {e})"
                self.say(f"{s.name}: {self.results[s.name]}")
            finally:
                if s.name == "build":
                    self.build_ok = self.results.get(s.name) in ("ok", "done before")
                    self.built.set()

    def interrupt(self) -> None:
        """SIGINT to every running step's group (rlwb archives the run as interrupted), SIGKILL 30 s later."""
        with self.lock:
            procs = dict(self.procs)
        for name, p in procs.items():
            self.say(f"{name}: interrupted at the budget (run this again to finish it)")
            try:
                os.killpg(p.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
            time.sleep(1)
        for p in procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def go(self, steps: list[Step]) -> int:
        signal.signal(signal.SIGTERM, lambda *_: (self.interrupt(), sys.exit(1)))
        # a step must stop at the budget's SIGINT (rlwb archives its run as interrupted, resumable): started by a
        # shell's `cmd &` without job control, this process ignores SIGINT and its steps inherit that, so the
        # budget's SIGINT did nothing and the step was SIGKILLed 30 s later, unarchived. A handled signal is reset to
        # its default in a child, an ignored one is not: a handler that does nothing keeps this process ignoring a
        # stray SIGINT (as it did) while its steps get the default. Restored when the steps are done.
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        if ignored:
            signal.signal(signal.SIGINT, lambda *_: None)
        try:
            return self._go(steps)
        finally:
            if ignored:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

    def _go(self, steps: list[Step]) -> int:
        if not any(s.name == "build" for s in steps):
            self.built.set()
        first = [s for s in steps if s.phase == 0]
        lanes: dict[int, list[Step]] = {}
        for s in steps:
            if s.phase != 0 or s.name == "build":
                lanes.setdefault(s.lane if self.a.lanes > 1 else 0, []).append(s)
        phase0 = [threading.Thread(target=self.lane, args=([s],), daemon=True) for s in first if s.name != "build"]
        threads = [threading.Thread(target=self.lane, args=(ls,), daemon=True) for ls in lanes.values()]
        for t in phase0:  # the memory check alone on the GPU, beside the build (on the CPU)
            t.start()
        build_lane = next((t for t, ls in zip(threads, lanes.values()) if ls[0].name == "build"), None)
        if build_lane:
            build_lane.start()
        stop = self.t0 + self.a.budget + self.a.grace
        for t in phase0:
            t.join(timeout=max(stop - time.monotonic(), 0))
        if any(t.is_alive() for t in phase0):  # a hung memory check must not hold the lanes past the budget
            self.interrupt()
            for t in phase0:
                t.join(timeout=15)
        self.phase0_done.set()
        for t in threads:
            if t is not build_lane:
                t.start()
        for t in threads:
            t.join(timeout=max(stop - time.monotonic(), 0))
        if any(t.is_alive() for t in threads):
            self.interrupt()
            for t in threads:
                t.join(timeout=15)
        self.pack()
        results = [self.results.get(s.name, "not started") for s in steps]
        self.say("summary: " + ", ".join(f"{s.name} {r}" for s, r in zip(steps, results)))
        if any(r.startswith("failed") for r in results):
            return 1
        return 3 if any(not r.startswith(("ok", "done before")) for r in results) else 0

    def pack(self) -> None:
        """The finished runs (ok ones first), the logs and the markers as a tar split into ≤ 15 MiB parts; the
        device returns at most 8 files and 64 MiB, so data of runs that are not ok go first when it is over."""
        for old in self.out.glob("gpu_runs.tar.gz*"):
            old.unlink()
        runs = sorted({Path(m.read_text().strip()) for m in self.markers.glob("*.done")}
                      | {d for d in self.archive.glob("*/*") if (d / "run.json").is_file() and not d.is_symlink()})
        runs = [r for r in runs if r.is_dir() and r.is_relative_to(self.archive)]
        ok = {r for r in runs if json.loads((r / "run.json").read_text()).get("status") == "ok"}
        room = (MAX_FILES - 1 - sum(1 for f in self.out.iterdir())) * PART_BYTES
        for drop_data in (False, True):
            tar_path = self.out / "gpu_runs.tar.gz"
            with tarfile.open(tar_path, "w:gz") as tar:
                for r in sorted(runs, key=lambda r: r not in ok):
                    for f in sorted(r.rglob("*")):
                        if f.is_file() and not (drop_data and r not in ok and "data" in f.relative_to(r).parts):
                            tar.add(f, arcname=str(f.relative_to(self.archive)))
                for d in (self.markers, self.logs):
                    tar.add(d, arcname=d.name)
            if tar_path.stat().st_size <= room:
                break
        size = tar_path.stat().st_size
        parts = []
        with tar_path.open("rb") as f:
            while chunk := f.read(PART_BYTES):
                part = self.out / f"gpu_runs.tar.gz.part{len(parts)}"
                part.write_bytes(chunk)
                parts.append(part)
        tar_path.unlink()
        n = sum(1 for _ in self.out.iterdir())
        self.say(f"packed {len(runs)} run(s) ({len(ok)} ok), {size / 2**20:.1f} MiB in {len(parts)} part(s) under "
                 f"{self.out} (cat the parts | tar xz)")
        if n > MAX_FILES or size > MAX_FILES * PART_BYTES:
            self.say(f"WARNING: {n} files, {size / 2**20:.1f} MiB under {self.out}: more than the device returns "
                     f"({MAX_FILES} files, 64 MiB); the parts after the limit are lost")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="the CPU rehearsal: tiny sizes, the embedded default model")
    ap.add_argument("--steps", default="", help="comma-separated step names (default: every step not done)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds (plus --grace) within which a step must end by its H100 estimate to start")
    ap.add_argument("--grace", type=float, default=45, help="seconds a running step gets past the budget")
    ap.add_argument("--lanes", type=int, default=6, help="lanes side by side (1: every step one after another)")
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "outputs" / "gpu-out"),
                    help="where the packed runs go (the device's $OUT)")
    ap.add_argument("--archive", default=str(ROOT / "outputs" / "gpu"), help="archive root of the runs")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--allow-dirty", action="store_true",
                    help="run from a tree with uncommitted changes (its runs cannot be published)")
    a = ap.parse_args()
    if a.budget is None:
        a.budget = 3600 if a.cpu else 480  # a lent H100's call: ≤ 10 minutes, its start and transfers included
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
