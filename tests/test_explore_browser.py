"""The explorer in a real browser: the Voilà page (``llmcomm explore``) and notebook 12 in JupyterLab, served on
127.0.0.1 and driven by Playwright on headless Chromium. Changing tp and pp must redraw every panel; an
impossible tp must show the rule it breaks and keep the panels. Screenshots of each panel go to
``build/explore-browser/`` for a reviewer (``LLMCOMM_README_SCREENSHOT=1`` also rewrites the README's
``docs/explorer.png``).

Chromium: Debian's ``chromium`` package (``apt-get install -y chromium``; ``.ci/run`` installs it) or the
executable named by ``$LLMCOMM_CHROMIUM``; Playwright's own browser download is not used. Without a browser the
tests skip with the command that installs one, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from llmcomm.atomic import write_bytes
from llmcomm.explore import Choice
from llmcomm.explore.panels import PANELS
from llmcomm.explore.serve import HOST, free_port, start_page, start_server
from llmcomm.paths import PROJECT_ROOT as ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SHOTS = ROOT / "build" / "explore-browser"
README_SHOT = ROOT / "docs" / "explorer.png"
HOW = ("the browser tests need Chromium and Playwright: `apt-get install -y chromium` (Debian; or set "
       "LLMCOMM_CHROMIUM=/path/to/chromium) and `pip install playwright`, then "
       "`python -m pytest -m slow tests/test_explore_browser.py`")
START = Choice(model="gpt3-6.7b", cluster="a100-80g-hdr200", tp=8, pp=4, dp=1, global_batch=32)
RENDER_TIMEOUT_MS = 120_000


def _missing(why: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{why}; in CI the browser tests must run: {HOW}")
    pytest.skip(f"{why}: {HOW}")


def chromium_path() -> str:
    for cand in (os.environ.get("LLMCOMM_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and Path(cand).exists():
            return cand
    _missing("no Chromium executable found")
    raise AssertionError  # unreachable


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    exe = chromium_path()
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, headless=True,
                              args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


def _srcs(page) -> dict[str, tuple[str, str]]:
    """Per panel, its figure's source and its text (the call panel's figure may stay when only its groups'
    ranks change: a TP all-reduce moves b·s·h whatever the TP size)."""
    return {p: (page.get_attribute(f".llmcomm-panel-{p} img", "src") or "",
                page.locator(f".llmcomm-panel-{p}").inner_text()) for p in PANELS}


def _render(page, n: int) -> None:
    page.wait_for_selector(f".llmcomm-render[data-render='{n}']", timeout=RENDER_TIMEOUT_MS)


def _set(page, control: str, value: int) -> None:
    box = page.locator(f".llmcomm-control-{control} input")
    box.fill(str(value))
    box.press("Enter")


def drive(page, prefix: str) -> dict[str, str]:
    """Change tp, then pp, then an impossible tp, checking the panels each time; screenshots under SHOTS."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    _render(page, 1)
    status = page.locator(".llmcomm-status")
    assert "tp8 pp4 dp1" in status.inner_text()
    first = _srcs(page)
    assert all(s.startswith(("data:image/png", "blob:")) for s, _ in first.values()), first

    _set(page, "tp", 16)  # 16 x 4 = 64 GPUs: TP now spans two nodes
    _render(page, 2)
    assert "tp16 pp4 dp1" in status.inner_text() and "64 GPUs" in status.inner_text()
    second = _srcs(page)
    assert [p for p in PANELS if second[p] == first[p]] == [], "a panel did not redraw after tp changed"
    assert "TP, PP groups cross a node boundary" in page.locator(".llmcomm-panel-layout").inner_text()

    _set(page, "pp", 2)  # back to 32 GPUs
    _render(page, 3)
    assert "tp16 pp2 dp1" in status.inner_text() and "32 GPUs" in status.inner_text()
    third = _srcs(page)
    assert [p for p in PANELS if third[p] == second[p]] == [], "a panel did not redraw after pp changed"
    for p in PANELS:
        page.locator(f".llmcomm-panel-{p}").screenshot(path=str(SHOTS / f"{prefix}-{p}.png"))

    _set(page, "tp", 3)  # breaks a rule: the message, and the last valid panels stay
    page.wait_for_selector(".llmcomm-error", timeout=RENDER_TIMEOUT_MS)
    text = status.inner_text()
    assert "llmcomm explore: error: tp=3 does not divide num_attention_heads=32" in text
    assert "showing the last valid configuration, gpt3-6.7b tp16 pp2 dp1" in text
    assert _srcs(page) == third
    status.screenshot(path=str(SHOTS / f"{prefix}-error.png"))
    return third


def test_voila_page(browser) -> None:
    with start_page(START, timeout=120) as server:
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(RENDER_TIMEOUT_MS)
        page.goto(server.url, timeout=RENDER_TIMEOUT_MS)
        drive(page, "voila")
        assert "from llmcomm.explore import" not in page.content(), "Voilà must not show the code cell"
        _set(page, "tp", 8)  # the README's picture: the starting configuration with its error cleared
        _set(page, "pp", 4)
        _render(page, 5)
        page.set_viewport_size({"width": 1500, "height": 2400})  # all of it on screen, so all of it is painted
        shot = page.locator(".llmcomm-explorer").screenshot()
        write_bytes(SHOTS / "voila-explorer.png", shot)
        if os.environ.get("LLMCOMM_README_SCREENSHOT") == "1":
            write_bytes(README_SHOT, shot)
        page.close()


def test_notebook_in_jupyterlab(browser, tmp_path) -> None:
    nb = nbformat.read(ROOT / "notebooks" / "12_explore.ipynb", as_version=4)
    params = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", ()))
    assert "out_dir = None" in params.source
    params.source = params.source.replace("out_dir = None", f"out_dir = {str(tmp_path / 'out')!r}")
    nbformat.write(nb, str(tmp_path / "12_explore.ipynb"))
    port = free_port()
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--ServerApp.ip={HOST}",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", "--IdentityProvider.token=",
           "--ServerApp.password=", f"--ServerApp.root_dir={tmp_path}", "--LabApp.news_url=None", "--allow-root",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with start_server(cmd, f"http://{HOST}:{port}/lab", tmp_path, timeout=120) as server:
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        page.set_default_timeout(RENDER_TIMEOUT_MS)
        page.goto(f"{server.url}/tree/12_explore.ipynb", timeout=RENDER_TIMEOUT_MS)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=RENDER_TIMEOUT_MS)
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=RENDER_TIMEOUT_MS)  # kernel connected
        page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
        page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
        page.locator(".llmcomm-explorer").wait_for(timeout=RENDER_TIMEOUT_MS)
        page.locator(".llmcomm-explorer").scroll_into_view_if_needed()
        drive(page, "lab")
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=RENDER_TIMEOUT_MS)  # all cells ran
        page.locator(".llmcomm-explorer").screenshot(path=str(SHOTS / "lab-explorer.png"))
        page.close()
    assert (tmp_path / "out" / "results" / "12_explore.json").exists(), "the notebook's cells did not all run"
