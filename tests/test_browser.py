"""The live widget in a real JupyterLab, driven by Debian's chromium (headless).

JupyterLab listens on 127.0.0.1 only; the notebook starts a 2-engine cluster, runs a
small Cholesky and calls ``run.show()``. The test waits until the widget reports
completion and checks what a person would see: a timeline lane per rank, a
communication matrix that is not empty, progress at 100 %. It saves a screenshot
(``tests/screenshots/``). Everything it started is killed at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT, _clean_env, assert_none_left, mpi_segments, unused

pytestmark = [pytest.mark.mpi, pytest.mark.timeout(420)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / "tests" / "screenshots"

needs_browser = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (apt-get install chromium); CI installs it",
)

CELLS = [
    "import taskgraph as tg\nfrom taskgraph.linalg import cholesky",
    "cluster = tg.Cluster(n=2)",
    "A = tg.TiledMatrix.random_spd(1536, 128, cluster=cluster)\n"
    "run = cluster.run(cholesky(A))\n"
    "run.show()\n"
    "run.wait()",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 with one notebook; killed with all its children."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, tmp_path / "live.ipynb")
    port, token, marker = free_port(), uuid.uuid4().hex, uuid.uuid4().hex
    env = _clean_env(TASKGRAPH_TEST_JOB=marker, JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    log = open(tmp_path / "server.log", "wb")  # closed in the finally below
    before = mpi_segments()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            "--allow-root",
            f"--ServerApp.root_dir={tmp_path}",
            "--LabApp.expose_app_in_browser=True",
            "--ServerApp.disable_check_xsrf=True",
        ],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None:
                    text = (tmp_path / "server.log").read_text()[-2000:]
                    pytest.fail("jupyter lab exited: " + text)
                time.sleep(0.5)
        else:
            pytest.fail("jupyter lab did not start within 90 s")
        yield f"http://127.0.0.1:{port}/lab/tree/live.ipynb?token={token}"
    finally:
        # stop the engines the notebook started, then the server and its kernels
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
        assert_none_left(marker)
        # the engines' segments and their proxies' topology files, killed with the
        # server's group before the kernel could close its cluster: the watchdog's
        deadline = time.monotonic() + 10
        while unused(mpi_segments() - before) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not unused(mpi_segments() - before)


@needs_browser
def test_live_widget_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(lab, timeout=120_000)
            page.wait_for_function("window.jupyterapp !== undefined", timeout=120_000)
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_function(  # the kernel is up
                "document.querySelector('.jp-Notebook-ExecutionIndicator') === null || "
                "!document.title.includes('Busy')",
                timeout=120_000,
            )
            time.sleep(2)
            # fire and forget: the command's promise ends only when every cell has run
            page.evaluate("() => { window.jupyterapp.commands.execute('notebook:run-all-cells'); }")
            view = page.wait_for_selector(".tg-view", timeout=180_000)
            page.wait_for_function(
                "() => { const p = document.querySelector('.tg-view .tg-percent');"
                " return p && p.textContent.trim() === '100%'; }",
                timeout=180_000,
            )
            page.wait_for_function(  # the final, merged trace has reached the view
                "() => document.querySelectorAll('.tg-matrix .tg-nonzero').length > 0",
                timeout=60_000,
            )
            time.sleep(1)
            view.scroll_into_view_if_needed()
            page.screenshot(path=str(SHOTS / "live-widget-page.png"), full_page=True)
            view.screenshot(path=str(SHOTS / "live-widget.png"))
            ranks = page.eval_on_selector_all(
                ".tg-view .tg-lane", "els => els.map(e => e.dataset.rank)"
            )
            nonzero = page.eval_on_selector_all(".tg-matrix .tg-nonzero", "els => els.length")
            percent = page.text_content(".tg-view .tg-percent")
            errors = page.eval_on_selector_all(
                ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']",
                "els => els.map(e => e.textContent)",
            )
        finally:
            browser.close()
    assert sorted(set(ranks)) == ["0", "1"], ranks
    assert nonzero >= 2, "both ranks send tiles to each other"
    assert percent.strip() == "100%"
    assert not any("Error" in e for e in errors), errors
    assert (SHOTS / "live-widget.png").stat().st_size > 10_000
