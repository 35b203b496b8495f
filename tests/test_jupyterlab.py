"""JupyterLab, for real: start it on a free loopback port, open notebook 00 in headless Chromium (Debian's,
driven by Playwright with `executable_path`; no browser download), run all cells through the UI and wait
for the conclusion the last cell prints. The notebook is copied first, so the committed one stays clean."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_notebook_00_runs_top_to_bottom_in_jupyterlab(tmp_path, default_model):
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium")
    assert chromium, "Debian's chromium is required (make setup installs it)"
    work = tmp_path / "nb"
    work.mkdir()
    shutil.copy(REPO / "notebooks" / "00_default_policy.ipynb", work)
    port, token = _free_port(), "rlwb-test-token"
    env = {**os.environ, "RLWB_OUTPUTS": str(tmp_path / "outputs"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    env.pop("RLWB_RUN_DIR", None)
    lab = subprocess.Popen([str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
                            f"--port={port}", f"--IdentityProvider.token={token}", f"--notebook-dir={work}",
                            "--ServerApp.open_browser=False"] + (["--allow-root"] if os.geteuid() == 0 else []),
                           env=env, stdout=subprocess.DEVNULL,
                           stderr=open(tmp_path / "lab.log", "wb"), start_new_session=True)  # noqa: SIM115
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not start: " + (tmp_path / "lab.log").read_text()[-2000:])
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True,
                                        args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                                              "--disable-component-update", "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{base}/lab/tree/00_default_policy.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            _wait_for_rlwb_kernel(page, base, token)
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_text("Run All Cells", exact=True).click()
            # outputs (not sources): the answer under the compute cell, then the model card in the last cell
            page.locator(".jp-OutputArea-output", has_text="Conclusion.").wait_for(timeout=300_000)
            page.locator(".jp-OutputArea-output", has_text="weights_sha256_16").wait_for(timeout=120_000)
            shot = tmp_path / "jupyterlab.png"
            page.screenshot(path=str(shot), full_page=False)
            stderr = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
            errors = page.locator(stderr).all_text_contents()
            assert not any("Traceback" in e or "Error" in e for e in errors), errors
            assert page.locator(".jp-OutputArea-output", has_text="greedy accuracy").count() >= 1
            assert page.locator(".jp-OutputArea-output img").count() >= 1  # the figure rendered inline
            browser.close()
        assert shot.stat().st_size > 10_000
        print("screenshot:", shot)
    finally:
        os.killpg(lab.pid, 15)
        lab.wait(timeout=30)


def _wait_for_rlwb_kernel(page, base: str, token: str) -> None:
    """The notebook names the `rlwb` kernel; accept it if JupyterLab asks, then wait until it is idle."""
    import json

    deadline = time.time() + 120
    while time.time() < deadline:
        dialog = page.locator(".jp-Dialog")
        if dialog.count() and dialog.is_visible():
            sel = dialog.locator("select")
            if sel.count():
                sel.select_option(label="rlwb (.venv)")
            dialog.get_by_role("button", name="Select").click()
        sessions = json.load(urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=5))
        states = [(s["kernel"]["name"], s["kernel"]["execution_state"]) for s in sessions]
        if ("rlwb", "idle") in states:
            return
        time.sleep(0.5)
    pytest.fail(f"the rlwb kernel never became idle: {states}")


@pytest.mark.engines
def test_explore_notebook_runs_and_shows_the_raw_gap(tmp_path, default_model):
    """`notebooks/explore.ipynb`, the dozen-line scratch pad over `rlwb.explore`, executes top to bottom in a kernel
    and shows what it promises: V1's raw logprobs off the trainer at T = 0.7 (k3 above the float floor), the
    worst tokens with their text, the scatter figure."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(REPO / "notebooks" / "explore.ipynb", as_version=4)
    assert len([c for c in nb.cells if c.cell_type == "code"]) <= 6  # a scratch pad, not an experiment
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    metrics_text = nb.cells[2].outputs[-1]["data"]["text/plain"]
    k3 = float(next(line.split()[-1] for line in metrics_text.splitlines() if line.startswith("k3_mean ")))
    assert k3 > 1e-8, metrics_text  # the raw gap (fp32 processed engines sit at ~1e-13)
    assert "dlogp" in nb.cells[3].outputs[-1]["data"]["text/plain"]
    assert any("image/png" in o.get("data", {}) for o in nb.cells[4].outputs)
