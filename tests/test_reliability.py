"""Reliability: bad input never reaches compute, crashes and interrupts are archived honestly, runs reproduce."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlwb import params
from rlwb.params import ParamError
from rlwb.registry import NOTEBOOKS
from tests.conftest import process_group_members

REPO = Path(__file__).resolve().parent.parent

junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                    max_leaves=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(NOTEBOOKS)),
       st.dictionaries(st.sampled_from(["seed", "prompts", "temperature", "engines", "top_p", "top_k", "dtype",
                                        "model", "temperatures", "steps", "lr", "corrections", "batch_sizes",
                                        "full_vocab", "bogus"]), junk, max_size=4))
def test_random_junk_params_give_param_errors_not_tracebacks(nb, values):
    """Whatever the values, loading either succeeds or raises ParamError with a message naming a key."""
    try:
        params.load(nb, overrides=values)
    except ParamError as e:
        assert "parameter" in str(e) or "model" in str(e)


@pytest.mark.engines
@pytest.mark.slow
def test_sigint_interrupts_run_archives_failed_and_leaves_no_workers(outputs, default_model):
    """Ctrl-C during notebook 01: the run is archived as failed ('interrupted'), `latest` is not updated,
    earlier runs are untouched and no engine process survives."""
    earlier = outputs / "01_logprob_mismatch" / "20000101-000000-00000000"
    earlier.mkdir(parents=True)
    (earlier / "run.json").write_text(json.dumps({"status": "ok"}))
    proc = subprocess.Popen([sys.executable, "-m", "rlwb.cli", "run", "notebooks/01_logprob_mismatch.ipynb",
                             "-f", "params/01_logprob_mismatch/smoke.yaml", "-p", "engines", "[vllm-v1]",
                             "-p", "reward_samples", "16384"],  # ~1 min of sampling: the interrupt lands mid-run
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # as at a terminal: a launcher that runs the suite in the background (`cmd &`)
                            # leaves SIGINT ignored, and an ignored signal is inherited
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # wait until the engine worker is up, then interrupt
    deadline, workers = time.time() + 300, []
    while time.time() < deadline and not workers:
        time.sleep(1)
        workers = [int(p) for p in os.listdir("/proc")
                   if p.isdigit() and _is_worker(int(p)) and _descends_from(int(p), proc.pid)]
    assert workers, "the engine worker never started"
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode != 0
    run_dir = Path(out.strip().splitlines()[-1])
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and "interrupt" in info["error"].lower()
    assert not (outputs / "latest" / "01_logprob_mismatch").exists()
    assert json.loads((earlier / "run.json").read_text()) == {"status": "ok"}
    # the kernel shuts down, and each worker's parent-death watchdog ends its process group
    deadline = time.time() + 60
    while time.time() < deadline and any(process_group_members(pid) for pid in workers):
        time.sleep(1)
    for pid in workers:
        assert process_group_members(pid) == [], "engine worker left running"


def _descends_from(pid: int, ancestor: int) -> bool:
    """Only this run's workers count: the session's shared engine fixture keeps its own workers alive."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="ignore")
    except OSError:
        return ""


def _is_worker(pid: int) -> bool:
    """A worker started fresh runs server.py; a forked one keeps its fork server's command line (fork_server.py)
    and is that server's child."""
    if "rlwb/engines/server.py" in _cmdline(pid):
        return True
    try:
        parent = int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1])
    except (OSError, IndexError, ValueError):
        return False
    return "rlwb/engines/fork_server.py" in _cmdline(pid) and "rlwb/engines/fork_server.py" in _cmdline(parent)


@pytest.mark.engines
def test_workers_listen_on_no_tcp_port(engine):
    """rlwb talks to workers over pipes: the HF worker holds no listening TCP socket at all. vLLM V1 itself
    opens listening sockets for its own process group (torch.distributed/zmq); those must be bound to
    loopback only, never to an address reachable from outside the machine."""
    w = engine("hf")
    w2 = engine("vllm-v1")
    for worker in (w, w2):
        inodes = set()
        for pid in process_group_members(worker.pid):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    link = os.readlink(fd)
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        listening = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if f[3] == "0A":  # LISTEN
                    listening[f[9]] = f[1].split(":")[0]
        mine = {i: listening[i] for i in inodes & set(listening)}
        if worker.preset.backend == "hf":
            assert not mine, "the HF worker listens on a TCP port"
        loopback = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}
        assert all(addr in loopback for addr in mine.values()), f"{worker.preset.name} listens beyond loopback: {mine}"


def test_no_insecure_serialization_and_named_extension():
    src = (REPO / "rlwb" / "engines" / "vllm_backend.py").read_text()
    assert 'worker_extension_cls"] = "vllm_ext.RlwbWorkerExtension"' in src
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in src
    assert 'env.pop("VLLM_ALLOW_INSECURE_SERIALIZATION"' in (REPO / "rlwb" / "engines" / "worker.py").read_text()


def test_names_from_params_cannot_escape_the_outputs_dir(tmp_path):
    from rlwb.archive import Run

    run = Run(tmp_path / "r")
    for bad in ("../evil", "/abs", "a/../../b"):
        with pytest.raises(ValueError, match="name"):
            run.save_data(__import__("pandas").DataFrame({"a": [1]}), bad)
        with pytest.raises(ValueError, match="name"):
            run.save_figure(None, bad)


def test_run_kernels_talk_over_unix_sockets_not_tcp(tmp_path):
    """A run's kernel is started with `runner.ipc_kernel_manager()`: its five channels (shell, iopub, stdin,
    control, heartbeat) are Unix sockets, not loopback TCP ports, and ipykernel's plain-TCP warning never reaches
    the run's terminal. Measured from inside the kernel: its transport and its listening TCP sockets, against
    the same kernel started with papermill's default manager (TCP: one listener per channel, and more)."""
    import subprocess
    import sys

    import nbformat

    code = """import json, os, pathlib
from ipykernel.kernelapp import IPKernelApp
listening = {l.split()[9]: l.split()[1].split(":")[0] for t in ("/proc/net/tcp", "/proc/net/tcp6")
             for l in pathlib.Path(t).read_text().splitlines()[1:] if l.split()[3] == "0A"}
mine = []
for fd in os.listdir("/proc/self/fd"):
    try:
        link = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        continue
    if link.startswith("socket:[") and link[8:-1] in listening:
        mine.append(listening[link[8:-1]])
app = IPKernelApp.instance()
print(json.dumps({"transport": app.transport, "ip": app.ip, "tcp_listening": mine}))"""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nbformat.write(nb, tmp_path / "in.ipynb")
    script = ("import sys, papermill as pm\nfrom rlwb.runner import ipc_kernel_manager\n"
              "kw = {'kernel_manager_class': ipc_kernel_manager(sys.argv[4])} if sys.argv[3] == 'ipc' else {}\n"
              "pm.execute_notebook(sys.argv[1], sys.argv[2], kernel_name='python3', progress_bar=False, cwd='.', **kw)")
    seen, sockets, cwd = {}, tmp_path / "sockets", tmp_path / "cwd"
    sockets.mkdir(), cwd.mkdir()
    for manager in ("ipc", "papermill default"):
        out_nb = tmp_path / f"{manager[:3]}.ipynb"
        r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "in.ipynb"), str(out_nb), manager,
                            str(sockets)], capture_output=True, text=True, timeout=300, cwd=cwd)
        assert r.returncode == 0, r.stderr[-2000:]
        seen[manager] = (json.loads(nbformat.read(out_nb, 4).cells[0].outputs[0]["text"]), r.stderr)
    (ipc, ipc_err), (tcp, tcp_err) = seen["ipc"], seen["papermill default"]
    assert ipc["transport"] == "ipc" and tcp["transport"] == "tcp"
    # the sockets lived in the directory given, never in the kernel's working directory, and were removed
    assert ipc["ip"] == str(sockets / "kernel-ipc") and list(cwd.iterdir()) == [] and list(sockets.iterdir()) == []
    assert "without encryption" not in ipc_err and "WARNING" not in ipc_err, ipc_err[-2000:]
    assert "without encryption" in tcp_err  # the control: the warning this manager keeps out
    assert len(tcp["tcp_listening"]) - len(ipc["tcp_listening"]) >= 5  # every channel left TCP
    assert all(addr in ("0100007F", "00000000000000000000000001000000") for addr in ipc["tcp_listening"])
