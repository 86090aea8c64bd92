"""The explorer as a standalone page: a one-cell notebook served by Voilà (code cells hidden) on 127.0.0.1.

:func:`page_notebook` writes the notebook (it only calls :func:`llmcomm.explore.explore` with the starting
choice); :func:`start_page` starts ``python -m voila`` on a free port of 127.0.0.1, waits until the page answers
(at most ``timeout`` seconds) and returns a :class:`Page` whose :meth:`Page.stop` ends the server and its
kernels. ``llmcomm explore`` and the browser tests use the same two functions.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import atomic_path
from ..errors import LLMCommError, UsageError
from .view import Choice

HOST = "127.0.0.1"
START_TIMEOUT_S = 90.0


def free_port(host: str = HOST) -> int:
    """A TCP port nothing listens on at ``host`` now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def page_notebook(path: Path, choice: Choice | None = None) -> Path:
    """Write the page's notebook to ``path``: one code cell that shows the explorer for ``choice``."""
    import nbformat

    choice = choice or Choice()
    args = ", ".join(f"{k}={v!r}" for k, v in choice.to_dict().items() if v != getattr(Choice(), k))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(f"from llmcomm.explore import explore\n\nexplore({args})")]
    with atomic_path(path) as tmp:
        nbformat.write(nb, str(tmp))
    return path


@dataclass
class Page:
    """A running Voilà server: ``url`` of the page, the server process, the folder holding its notebook."""

    url: str
    process: subprocess.Popen
    folder: tempfile.TemporaryDirectory | None = None
    log: Path | None = None
    started_s: float = field(default=0.0)

    def stop(self, timeout: float = 10.0) -> None:
        """End the server and every process it started (its kernels run in sessions of their own, so they are
        found as descendants and ended by pid), then remove its folder."""
        children = descendants(self.process.pid)
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        _end(children, timeout)
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def descendants(pid: int) -> list[int]:
    """Process ids below ``pid`` (children, their children...), read from ``/proc`` (Linux; elsewhere none)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        parent[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def _end(pids: list[int], timeout: float) -> None:
    """SIGTERM each process of ``pids`` still alive, SIGKILL those left after ``timeout`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [p for p in pids if _alive(p)]
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in alive) and time.monotonic() < deadline:
            time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie (exited, not yet reaped by its parent) counts as ended
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(url: str, process: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    """Poll ``url`` until it answers HTTP 200; raise if the process exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
            raise LLMCommError(f"the server for {url} exited with status {process.returncode}:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 (our own 127.0.0.1 server)
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.25)
    raise LLMCommError(f"the server for {url} did not answer within {timeout:.0f} s")


def start_server(cmd: list[str], url: str, cwd: Path, timeout: float = START_TIMEOUT_S, log: Path | None = None,
                 folder: tempfile.TemporaryDirectory | None = None) -> Page:
    """Run ``cmd`` (a server) in its own process group with its output in ``log``; return a :class:`Page` once
    ``url`` answers, or stop it and raise after ``timeout`` seconds."""
    log = log or Path(cwd) / "server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True)  # its own process group: stop() ends it as a whole
    t0 = time.monotonic()
    page = Page(url, proc, folder, log)
    try:
        wait_for(url, proc, timeout, log)
    except BaseException:
        page.stop()
        raise
    page.started_s = time.monotonic() - t0
    return page


def start_page(choice: Choice | None = None, port: int = 0, timeout: float = START_TIMEOUT_S,
               log: Path | None = None) -> Page:
    """Serve the explorer with Voilà on ``127.0.0.1:port`` (0: a free port); return once the page answers."""
    try:
        import voila  # noqa: F401
    except ImportError:
        raise UsageError("llmcomm explore needs Voilà: pip install voila (or pip install -e '.[dev]')") from None
    if not 0 <= port < 65536:
        raise UsageError(f"--port {port}: a port is 0 (pick a free one) or 1..65535")
    folder = tempfile.TemporaryDirectory(prefix="llmcomm-explore-")
    nb = page_notebook(Path(folder.name) / "explore.ipynb", choice)
    port = port or free_port()
    cmd = [sys.executable, "-m", "voila", str(nb), f"--port={port}", f"--Voila.ip={HOST}", "--no-browser",
           "--Voila.port_retries=0", "--show_tracebacks=True"]
    return start_server(cmd, f"http://{HOST}:{port}/", Path(folder.name), timeout,
                        log or Path(folder.name) / "voila.log", folder)
