"""report.html as a person sees it, in headless Chromium driven over the DevTools protocol (--remote-debugging-pipe,
stdlib only): one table row per scan, a click on a column header sorts the rows, every picture loads (the inline
ones and the full-size files they link to). Skips, with the reason, only where no Chromium can be found."""

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import labels, rgb, write
from predict_fixtures import one_thread, random_checkpoint  # noqa: F401

from srforge.cli import main_evaluate

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--allow-file-access-from-files",
]
pytestmark = pytest.mark.usefixtures("one_thread")


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """Chromium with the DevTools protocol on a pipe: commands go to its fd 3, answers and events come from fd 4,
    each message JSON ended by a NUL byte."""

    def __init__(self, executable: str, profile: Path):
        to_child, self.send_fd = os.pipe()
        self.recv_fd, from_child = os.pipe()

        def fds():  # in the child: the pipe ends at 3 and 4 (inheritable), where Chromium looks for them
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_child, from_child)]  # out of 3's and 4's way
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [executable, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"],
            preexec_fn=fds,
            close_fds=False,  # our own descriptors are not inheritable: only 3, 4 and stdio reach Chromium
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child)
        os.close(from_child)
        self.buffer, self.next_id, self.session = b"", 0, None

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if self.session is not None and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self.send_fd, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.recv_fd, 1 << 16)
                if not chunk:
                    raise RuntimeError(f"Chromium closed the DevTools pipe during {method}")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self.next_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 30
        while self.js("document.readyState") != "complete":
            assert time.monotonic() < deadline, "the page did not finish loading in 30 s"
            time.sleep(0.05)

    def js(self, expression: str):
        found = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in found, found
        return found["result"].get("value")

    def click(self, x: float, y: float) -> None:
        """A left click where a person would click: press and release of the mouse at (x, y)."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.send_fd)
        os.close(self.recv_fd)


SCANS = 7


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    ckpt = random_checkpoint(root / "a.pt")
    for i in range(SCANS):
        h, w = 9 + i, 12 + 7 * i if i < SCANS - 1 else 1400  # the widest is shrunk for the page
        write(root / "data" / "images" / f"s{i}.png", rgb(h, w, i))
        write(root / "data" / "masks" / f"s{i}.png", labels(h, w, 3, i))
    args = ["--checkpoint", root / "a.pt", "--input", root / "data", "--output", root / "out", "--worst", "5"]
    assert main_evaluate([*map(str, args), "--no-progress", "--workers", "0"]) == 0
    assert ckpt.is_file()
    return root / "out" / "report.html"


@pytest.mark.slow
def test_the_report_in_a_browser_counts_sorts_and_shows_every_picture(report, tmp_path):
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium found (chromium, chromium-browser, google-chrome); .ci/run installs the Debian one")
    browser = Browser(executable, tmp_path / "profile")
    try:
        browser.open(report.as_uri())
        assert browser.js("document.querySelectorAll('#scans tbody tr').length") == SCANS
        header = "Array.from(document.querySelectorAll('#scans th')).find(th => th.textContent === 'width')"
        column = f"Array.from(document.querySelectorAll('#scans th')).indexOf({header})"
        rows = "Array.from(document.querySelectorAll('#scans tbody tr'))"
        values = f"{rows}.map(tr => Number(tr.cells[{column}].textContent))"
        browser.js(f"{header}.scrollIntoView()")
        box = browser.js(
            f"(() => {{ const r = {header}.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; }})()"
        )
        browser.click(box[0] + box[2] / 2, box[1] + box[3] / 2)
        ascending = browser.js(values)
        assert ascending == sorted(ascending) and len(set(ascending)) == SCANS
        browser.click(box[0] + box[2] / 2, box[1] + box[3] / 2)
        assert browser.js(values) == sorted(ascending, reverse=True)
        images = browser.js("Array.from(document.images).map(i => [i.complete, i.naturalWidth])")
        assert len(images) == 5 and all(done and width > 0 for done, width in images), images
        linked = browser.js(
            "Promise.all(Array.from(document.querySelectorAll('a.full')).map(a => new Promise(done => {"
            " const i = new Image(); i.onload = () => done(i.naturalWidth); i.onerror = () => done(0);"
            " i.src = a.href; })))"
        )
        assert len(linked) == 5 and all(width > 0 for width in linked), linked
        assert 1400 in linked and max(w for _, w in images) <= 1200  # the wide scan: shrunk inline, whole when linked
    finally:
        browser.close()
