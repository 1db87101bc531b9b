"""The HTML report in a real browser: headless Chromium loads index.html; a missing image, a console error, an
uncaught exception or a failed load fails the test (skipped where no Chromium is present: `make browser`).

The check uses the standard library only: the DevTools protocol over `--remote-debugging-pipe` (JSON messages
separated by NUL on file descriptors 3 and 4), no driver, no websocket package."""
from __future__ import annotations

import json
import os
import resource
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
IMAGES_JS = ("JSON.stringify(Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, "
             "i.naturalWidth]))")


def find_chromium() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


class _Pipe:
    """One headless browser process and a DevTools session over its pipe."""

    def __init__(self, exe: str, profile: str):
        to_child, self._w = os.pipe()  # we write commands, the browser reads them on fd 3
        self._r, from_child = os.pipe()  # the browser writes on fd 4

        def fds():  # in the child, before exec: commands on 3, replies on 4
            a, b = os.dup(to_child), os.dup(from_child)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                f"--user-data-dir={profile}", "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, pass_fds=(3, 4), preexec_fn=fds)
        os.close(to_child)
        os.close(from_child)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout_s: float = 30.0):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._next(timeout_s)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float) -> bool:
        if any(e.get("method") == method for e in self.events):
            return True
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                event = self._next(end - time.monotonic())
            except TimeoutError:
                return False
            self.events.append(event)
            if event.get("method") == method:
                return True
        return False

    def _next(self, timeout_s: float) -> dict:
        end = time.monotonic() + timeout_s
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("no reply from the browser")
            chunk = os.read(self._r, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its DevTools pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout_s=5)
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


def check_page(path: Path, exe: str | None = None, timeout_s: float = 30.0) -> dict:
    """Open `path` (file://), wait for its load event; returns {"images": [[src, complete, naturalWidth]],
    "problems": [text, ...]} where problems are missing images, console errors, exceptions and failed loads."""
    exe = exe or find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium found (make browser)")
    with tempfile.TemporaryDirectory(prefix="ulacache-chromium-") as profile:
        b = _Pipe(exe, profile)
        try:
            target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            sid = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                b.send(f"{domain}.enable", session=sid)
            b.send("Page.navigate", {"url": Path(path).resolve().as_uri()}, session=sid)
            loaded = b.wait_for("Page.loadEventFired", timeout_s)
            b.wait_for("never.arrives", 0.5)  # let late console messages come in
            res = b.send("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True}, session=sid)
            images = json.loads(res["result"]["value"])
        finally:
            b.close()
    problems = [] if loaded else ["the page never fired its load event"]
    problems += [f"image did not load: {src}" for src, complete, width in images if not complete or width == 0]
    for e in b.events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            problems.append("console error: " + " ".join(str(a.get("value", a.get("description", "")))
                                                         for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            problems.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            problems.append(f"log error: {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not p.get("canceled"):
            problems.append(f"load failed: {p.get('errorText')} ({p.get('type')})")
    return {"images": images, "problems": problems}


# ---------------------------------------------------------------------------------------------------------- tests
CHROMIUM = find_chromium()
AS_LIMIT = resource.getrlimit(resource.RLIMIT_AS)[0]  # Chromium reserves far more address space than it uses
pytestmark = [pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (install it with `make browser`)"),
              pytest.mark.skipif(AS_LIMIT != resource.RLIM_INFINITY,
                                 reason="an address-space limit (ulimit -v / prlimit --as) stops Chromium starting")]


def test_checker_sees_a_missing_image_and_a_console_error(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [1, 0])
    fig.savefig(tmp_path / "ok.png")
    plt.close(fig)
    page = tmp_path / "bad.html"
    page.write_text("<!doctype html><html><head><meta charset='utf-8'><title>t</title></head><body>"
                    "<img src='gone.png'><img src='ok.png'><script>console.error('boom')</script></body></html>")
    out = check_page(page, CHROMIUM)
    assert [src for src, _, width in out["images"] if width > 0] == ["ok.png"]
    text = "\n".join(out["problems"])
    assert "image did not load: gone.png" in text and "console error: boom" in text


def test_report_loads_clean_in_chromium(tmp_path):
    from test_reports_render import make_results

    from reports import build_report
    from traces import generate_trace
    from ulacache_cli.main import main

    (tmp_path / "results").mkdir()
    root = make_results(tmp_path / "results")
    trace = generate_trace(tmp_path / "trace", profile="small", num_requests=3, seed=5, num_groups=2)
    assert main(["policy-compare", str(trace), "--gpu-slots", "7000,12000", "--warmup-steps", "2", "--max-steps",
                 "6", "--concurrency", "3", "--out", str(root / "peers")]) == 0
    index = build_report(root)
    pngs = sorted(p.name for p in index.parent.glob("*.png"))
    out = check_page(index, CHROMIUM)
    assert out["problems"] == []
    assert sorted(src for src, complete, width in out["images"] if complete and width > 0) == pngs
    assert len(pngs) >= 9
