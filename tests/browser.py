"""A page as a listener sees it: Debian's Chromium, headless, driven over the Chrome DevTools protocol.

`read_samples_page` serves a folder on 127.0.0.1 with Python's HTTP server, opens ``samples.html`` in a fresh
Chromium profile, waits for the page to load and for every ``<audio>`` element's metadata (or its error), and returns
what the page shows: each player's source and duration, and each score cell (``data-key``/``data-value``) with its
table's step and kind and its row's index; on request it plays every player and reports how far each got. Chromium
comes from the system packages (scripts/setup.d/browser.sh).
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import signal
import socketserver
import subprocess
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--mute-audio",
    "--autoplay-policy=no-user-gesture-required",
    "--remote-debugging-port=0",
)

READ_PAGE = """
(async (play) => {
  const audios = [...document.querySelectorAll('audio')];
  // a player that neither loads nor fails within 30 s reads -2 (so a test fails instead of waiting forever)
  const durations = await Promise.all(audios.map(a => new Promise(resolve => {
    if (a.readyState >= 1) { resolve(a.duration); return; }
    a.addEventListener('loadedmetadata', () => resolve(a.duration));
    a.addEventListener('error', () => resolve(-1));
    setTimeout(() => resolve(-2), 30000);
  })));
  const cells = [...document.querySelectorAll('td[data-value]')].map(td => ({
    step: Number(td.closest('table').dataset.step), kind: td.closest('table').dataset.kind,
    index: Number(td.closest('tr').dataset.index), key: td.dataset.key, value: Number(td.dataset.value)}));
  const tables = [...document.querySelectorAll('table.samples')].map(t => [Number(t.dataset.step), t.dataset.kind]);
  // the before/after table: per sentence its set, its text and the players shown side by side
  const beforeAfter = [...document.querySelectorAll('table.before-after tr[data-set]')].map(tr => ({
    set: tr.dataset.set, text: tr.children[1].textContent, players: tr.querySelectorAll('audio').length}));
  // play: each player from its start until its clock has moved 0.2 s (muted), as a listener pressing play hears it
  const played = play ? await Promise.all(audios.map(a => new Promise(resolve => {
    if (a.error) { resolve(-1); return; }
    a.addEventListener('timeupdate', () => { if (a.currentTime >= 0.2) { a.pause(); resolve(a.currentTime); } });
    a.addEventListener('ended', () => resolve(a.currentTime));
    a.play().catch(() => resolve(-1));
    setTimeout(() => resolve(-2), 30000);
  }))) : [];
  return JSON.stringify({title: document.title, sources: audios.map(a => a.getAttribute('src')), durations, cells,
                         tables, played, beforeAfter});
})(PLAY)
"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextmanager
def serve(folder: Path):
    """``http://127.0.0.1:<port>/`` serving ``folder`` (a real HTTP server, in a thread)."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()


def _devtools_port(profile: Path, proc: subprocess.Popen, wait_s: float) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().split()[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.1)
    raise TimeoutError(f"chromium wrote no {marker} within {wait_s} s")


class _DevTools:
    def __init__(self, socket):
        self._socket = socket
        self._next = 0

    def call(self, method: str, **params):
        self._next += 1
        self._socket.send(json.dumps({"id": self._next, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv())
            if message.get("id") == self._next:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")


def read_samples_page(folder: Path, page: str = "samples.html", wait_s: float = 60, play: bool = False) -> dict:
    """What headless Chromium shows of ``folder/page`` served over HTTP (see the module docstring); ``play``: also
    play every player until its clock passes 0.2 s (``played``: the time each reached, -1 if it could not play)."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium is not installed (scripts/setup.d/browser.sh installs Debian's)")
    # Chromium's helper processes can still write into the profile as it is removed: the profile's removal ignores
    # what they leave ("Directory not empty: 'Default'"), and the whole process group is stopped first.
    with serve(folder) as base, tempfile.TemporaryDirectory(prefix="chromium_", ignore_cleanup_errors=True) as profile:
        proc = subprocess.Popen(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            port = _devtools_port(Path(profile), proc, wait_s)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response:
                target = next(t for t in json.load(response) if t["type"] == "page")
            from websockets.sync.client import connect

            with connect(target["webSocketDebuggerUrl"], max_size=None) as socket:
                devtools = _DevTools(socket)
                devtools.call("Page.enable")
                devtools.call("Page.navigate", url=f"{base}/{page}")
                deadline = time.monotonic() + wait_s
                while devtools.evaluate("document.readyState") != "complete" or not devtools.evaluate(
                    "location.href.endsWith('/" + page + "')"
                ):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{page} did not load within {wait_s} s")
                    time.sleep(0.1)
                return json.loads(devtools.evaluate(READ_PAGE.replace("PLAY", "true" if play else "false")))
        finally:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """TERM to Chromium's process group, then KILL to whatever of the group outlived the browser."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:  # the whole group has gone
            break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    proc.wait()
