"""report.html as a person sees it, in headless Chromium driven over the DevTools protocol (--remote-debugging-pipe,
stdlib only), on two models' predictions of tiny scans (--predictions twice): the headline's numbers are
metrics.json's, clicks on a header sort the scan table and its filters change the rows shown, a plot has one mark
per scan, a picture opens at full resolution in the page and zooms, any scan opens from its table row, names and
class names with HTML in them are text, and a page of 10,000 scans has its DOM ready in under 2 s (measured by the
browser). Skips, with the reason, only where no Chromium can be found."""

import csv
import fcntl
import io
import json
import math
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import labels, rgb, write
from predict_fixtures import one_thread  # noqa: F401
from test_report_page import write_report

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

    def open(self, url: str, width: int = 1400, height: int = 1000) -> None:
        """Navigate a new tab to ``url`` and wait until it is loaded; every alert() it calls is recorded in
        window.alerts instead of shown (a page that runs a scan's name as code calls it)."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        self.call("Page.enable")
        self.call(
            "Page.addScriptToEvaluateOnNewDocument", source="window.alerts = []; window.alert = m => alerts.push(m);"
        )
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

    def click_on(self, expression: str) -> None:
        """Scroll the element ``expression`` finds into view and click its middle."""
        box = self.js(
            f"(() => {{ const e = {expression}; e.scrollIntoView({{block: 'center'}});"
            " const r = e.getBoundingClientRect(); return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        self.click(*box)

    def type(self, expression: str, text: str) -> None:
        """Focus the input ``expression`` finds and type ``text`` into it, as a keyboard would."""
        self.click_on(expression)
        self.call("Input.insertText", text=text)

    def wheel(self, x: float, y: float, delta: float) -> None:
        self.call("Input.dispatchMouseEvent", type="mouseWheel", x=x, y=y, deltaX=0, deltaY=delta)

    def screenshot(self, path: Path) -> None:
        """The whole page as a PNG at ``path``."""
        import base64

        size = self.js("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        clip = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
        shot = self.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.send_fd)
        os.close(self.recv_fd)


HTML_NAME = "<img src=x onerror=alert(1)>"  # a scan's file name that a careless page would run
CLASSES = ["paper", "<b>ink</b>", "<script>alert(2)</script>"]
SHAPES = [(9, 12), (10, 19), (11, 26), (12, 33), (13, 40), (14, 47), (15, 1400)]  # the widest is shrunk for the page
NAMES = ["s0", "s1", HTML_NAME, "s3", "s4", "s5", "wide"]
WORST = 3


def guess(truth: np.ndarray, wrong: float, seed: int) -> np.ndarray:
    """``truth`` with a share ``wrong`` of its pixels given a random class."""
    rng = np.random.default_rng(seed)
    out = truth.copy()
    flip = rng.random(truth.shape) < wrong
    out[flip] = rng.integers(0, len(CLASSES), int(flip.sum()))
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """Two models' predictions (--predictions twice) of seven scored scans and one scan A and B did not predict
    ('lost': a failed row), class names and a file name with HTML in them; the report's folder."""
    root = tmp_path_factory.mktemp("report")
    for i, (name, (h, w)) in enumerate(zip([*NAMES, "lost"], [*SHAPES, (9, 14)])):
        truth = labels(h, w, 3, i)
        write(root / "data" / "images" / f"{name}.png", rgb(h, w, i))
        write(root / "data" / "masks" / f"{name}.png", truth)
        if name != "lost":
            write(root / "a" / f"{name}.png", guess(truth, 0.1 + 0.08 * i, i))
            write(root / "b" / f"{name}.png", guess(truth, 0.55 - 0.07 * i, 100 + i))
    args = ["--predictions", root / "a", "--predictions", root / "b", "--masks", root / "data"]
    args += ["--classes", ",".join(CLASSES), "--output", root / "out", "--worst", str(WORST)]
    assert main_evaluate([*map(str, args), "--no-progress", "--workers", "0"]) == 1  # 'lost' failed
    return root / "out"


@pytest.fixture()
def browser(tmp_path):
    """A Chromium of the test's own (conftest wants no process left running after a test)."""
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium found (chromium, chromium-browser, google-chrome); .ci/run installs the Debian one")
    found = Browser(executable, tmp_path / "profile")
    yield found
    found.close()


@pytest.fixture()
def page(report, browser) -> Browser:
    browser.open((report / "report.html").as_uri())
    assert browser.js("window.alerts") == []  # nothing a name holds ran
    return browser


def choose(page: Browser, field: str, value: str) -> None:
    """Set the filter ``field`` (an input or a select) to ``value``, as picking it does (an input event)."""
    page.js(
        f"(f => {{ f.value = {json.dumps(value)}; f.dispatchEvent(new Event('input')); }})"
        f"(document.getElementById('{field}'))"
    )


ROWS = "Array.from(document.querySelectorAll('#scans tbody tr'))"


def column(name: str) -> str:
    """JS: the values shown in the scan table's column headed ``name``, top to bottom."""
    index = f"Array.from(document.querySelectorAll('#scans th')).findIndex(th => th.textContent === {json.dumps(name)})"
    return f"{ROWS}.map(tr => tr.cells[{index}].textContent)"


@pytest.mark.slow
def test_the_headline_shows_metrics_json_figures_and_which_model_is_better(page, report):
    found = json.loads((report / "metrics.json").read_text())
    shown = page.js(
        "Array.from(document.querySelectorAll('.headline [data-model]'))"
        ".map(e => [e.dataset.model, e.dataset.figure, e.dataset.class, e.textContent])"
    )
    expected = []
    for model in found["models"]:
        micro = model["results"]["micro"]
        for name in CLASSES[1:]:
            expected += [[model["name"], f, name, f"{micro['per_class'][f][name]:.3f}"] for f in ("iou", "tol_f1")]
        expected.append([model["name"], "pixel_accuracy", "", f"{micro['pixel_accuracy']:.3f}"])
    assert sorted(shown) == sorted(expected) and len(shown) == 10
    rows = list(csv.DictReader(io.StringIO((report / "scans.csv").read_text())))
    diffs = [float(r["difference"]) for r in rows if r["difference"]]
    assert page.js("document.getElementById('b-better').textContent") == str(sum(d > 0 for d in diffs))
    assert page.js("document.getElementById('a-better').textContent") == str(sum(d < 0 for d in diffs))
    median = sorted(diffs)[len(diffs) // 2]  # seven scored scans: the middle one
    assert page.js("document.getElementById('median').textContent") == f"{'+' if median > 0 else ''}{median:.3f}"
    hover = page.js("document.querySelector('.headline .label').title")
    assert "intersection over union" in hover and "pooled" in hover


@pytest.mark.slow
def test_names_and_class_names_with_html_are_text(page, report):
    assert HTML_NAME in page.js(column("name"))
    assert page.js("document.querySelectorAll('img[src=\"x\"], .headline b, table b').length") == 0
    assert page.js("document.scripts.length") == 2  # the page's data and its script, no other
    labels = page.js("Array.from(document.querySelectorAll('.headline .label')).map(e => e.textContent)")
    assert "IoU \u00b7 <b>ink</b>" in labels and "IoU \u00b7 <script>alert(2)</script>" in labels
    raw = (report / "report.html").read_text()
    assert HTML_NAME not in raw and CLASSES[2] not in raw and CLASSES[1] not in raw
    assert page.js("window.alerts") == []


@pytest.mark.slow
def test_sorting_and_filtering_change_the_visible_rows(page, report):
    statuses = page.js(column("status"))
    assert len(statuses) == len(NAMES) + 1 and statuses[0] == "failed"  # failed scans first, with their error
    assert "no prediction for scan 'lost'" in page.js(f"{ROWS}[0].querySelector('td.error').textContent")
    header = "Array.from(document.querySelectorAll('#scans th')).find(th => th.textContent === 'width')"
    page.click_on(header)
    ascending = [int(v) for v in page.js(column("width"))]
    assert ascending == sorted(ascending) and len(set(ascending)) == len(NAMES) + 1
    page.click_on(header)
    assert [int(v) for v in page.js(column("width"))] == sorted(ascending, reverse=True)
    page.type("document.getElementById('f-name')", "s")
    assert sorted(page.js(column("name"))) == sorted(n for n in [*NAMES, "lost"] if "s" in n)
    page.type("document.getElementById('f-name')", "1")
    assert page.js(column("name")) == ["s1"] and page.js("document.getElementById('count').textContent").startswith(
        "1 of 8"
    )
    choose(page, "f-name", "")
    choose(page, "f-metric", "mean_iou_without_bg")
    choose(page, "f-limit", "0.5")
    rows = list(csv.DictReader(io.StringIO((report / "scans.csv").read_text())))
    low = sorted(r["name"] for r in rows if r["mean_iou_without_bg"] and float(r["mean_iou_without_bg"]) <= 0.5)
    assert 0 < len(low) < len(NAMES) and sorted(page.js(column("name"))) == low
    choose(page, "f-limit", "")
    choose(page, "f-status", "failed")
    assert page.js(column("name")) == ["lost"]


@pytest.mark.slow
def test_a_plot_has_one_mark_per_scan(page):
    for plot in ("plot-width", "plot-height", "plot-compare"):
        assert page.js(f"document.querySelectorAll('#{plot} circle.mark').length") == len(NAMES), plot
    heights = page.js(
        "Array.from(document.querySelectorAll('#plot-histogram rect.bar')).map(r => r.getAttribute('height'))"
    )
    assert len(heights) == 20
    assert page.js("document.querySelectorAll('#plot-classes rect.bar').length") == 2 * 2 * len(CLASSES)


@pytest.mark.slow
def test_a_picture_opens_at_full_resolution_and_zooms_and_any_scan_opens_from_its_row(page, report):
    strips = page.js(
        "Array.from(document.querySelectorAll('figure img')).map(i => [i.complete, i.naturalWidth, i.width])"
    )
    assert len(strips) == 2 * WORST and all(done and natural > 0 for done, natural, _ in strips), strips
    assert all(shown >= natural for _, natural, shown in strips)  # never drawn smaller than the strip: no error lost
    wide = "document.querySelector('figure img[data-name=\"wide\"]')"
    assert page.js(f"{wide}.naturalWidth") == 700  # the 1400-px scan shrunk by 2 for the page
    page.click_on(wide)
    assert page.js("document.getElementById('viewer').classList.contains('open')")
    image = "document.querySelector('#content img')"
    done = f"new Promise(ok => {{ const i = {image}; if (i.complete) ok(); else i.onload = ok; }})"
    page.js(done)
    assert page.js(f"[{image}.naturalWidth, {image}.naturalHeight]") == [1400, 2 * 15 + 2]  # scan above errors
    before = page.js(f"{image}.getBoundingClientRect().width")
    scale = float(page.js("document.getElementById('viewer').dataset.scale"))
    for _ in range(6):
        page.wheel(700, 500, -100)
    after = page.js(f"{image}.getBoundingClientRect().width")
    assert after > 2 * before and float(page.js("document.getElementById('viewer').dataset.scale")) > 2 * scale
    page.click_on("document.getElementById('one')")
    assert page.js(f"{image}.getBoundingClientRect().width") == 1400  # 1:1: one picture pixel a page pixel
    page.click_on("document.getElementById('close')")
    page.click_on(f"{ROWS}.find(tr => tr.cells[0].textContent === 's0')")  # not among the worst: from its files
    panels = page.js(
        "Promise.all(Array.from(document.querySelectorAll('#content img')).map(i => new Promise(ok => {"
        " const seen = () => ok([i.alt, i.naturalWidth]); if (i.complete) seen(); else i.onload = i.onerror = seen;"
        " })))"
    )
    assert panels == [["scan", 12], ["truth", 12], ["prediction of A", 12], ["prediction of B", 12]]
    assert page.js("document.getElementById('viewer-title').textContent") == "s0"


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """``n`` scored rows of random counts for 3 classes (widths 200-800, heights 30-40), 20 of them failed."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % (n // 20) == 0:
            rows.append(
                {"name": f"scan_{i:05d}", "status": "failed", "height": 30, "width": 200, "error": "unreadable"}
            )
            continue
        confusion = [[rng.randint(0, 5000) if a == b else rng.randint(0, 300) for b in range(3)] for a in range(3)]
        predicted = [sum(row[c] for row in confusion) for c in range(3)]
        true = [sum(confusion[c]) for c in range(3)]
        tolerance = [
            [min(p, confusion[c][c] + 50), p, min(t, confusion[c][c] + 50), t]
            for c, (p, t) in enumerate(zip(predicted, true))
        ]
        h, w = rng.randint(30, 40), rng.randint(200, 800)
        rows.append(
            {
                "name": f"scan_{i:05d}",
                "status": "ok",
                "height": h,
                "width": w,
                "confusion": confusion,
                "tolerance": tolerance,
            }
        )
    return rows


@pytest.mark.slow
def test_a_report_of_10000_scans_has_its_dom_ready_in_under_2_s(browser, tmp_path, capsys):
    write_report(tmp_path, synthetic_rows(10_000, 0), synthetic_rows(10_000, 1), ["paper", "ink", "margin"])
    browser.open((tmp_path / "report.html").as_uri())
    ready = browser.js("performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd")
    with capsys.disabled():
        megabytes = (tmp_path / "report.html").stat().st_size / 1e6
        print(f"\n10,000-scan report ({megabytes:.1f} MB): DOM ready in {ready:.0f} ms")
    assert ready < 2000
    assert browser.js("document.querySelectorAll('#plot-width circle.mark').length") == 10_000 - 20
    assert browser.js(f"{ROWS}.length") == 200 and browser.js(f"{ROWS}[0].cells[1].textContent") == "failed"
    assert (
        browser.js("document.getElementById('count').textContent") == "10000 of 10000 scans match, the first 200 shown"
    )
    assert not math.isnan(ready)


def _rewrite_data(path: Path, change) -> None:
    """report.html at ``path`` with its page data changed by ``change(data)`` (kept unable to end its script block)."""
    page = path.read_text()
    start = page.index('id="report-data">') + len('id="report-data">')
    end = page.index("</script>", start)
    data = json.loads(page[start:end])
    change(data)
    path.write_text(page[:start] + json.dumps(data).replace("</", "<\\/") + page[end:])


# Before the page's script: Math.min and Math.max refuse more than 8 arguments, as some browsers refuse a call of more
# than about 65,536 (JavaScriptCore): a page of 12 scans then meets the limit a page of 70,000 meets there.
CAPPED = (
    "<script>['min', 'max'].forEach(k => { const f = Math[k]; Math[k] = function () {"
    " if (arguments.length > 8) { throw new RangeError('too many arguments'); } return f.apply(null, arguments); };"
    " });</script>"
)


@pytest.mark.slow
def test_a_scan_named_like_an_objects_property_opens_and_a_broken_plot_leaves_the_rest_working(browser, tmp_path):
    names = ["constructor", "toString", "__proto__", "hasOwnProperty"]
    rows_a, rows_b = synthetic_rows(400, 0)[1:13], synthetic_rows(400, 1)[1:13]  # 12 scored rows (every 20th fails)
    for a, b, name in zip(rows_a, rows_b, names):
        a["name"] = b["name"] = name
    write_report(tmp_path, rows_a, rows_b, ["paper", "ink", "margin"])
    path = tmp_path / "report.html"
    _rewrite_data(path, lambda data: data.update(pr=None))  # the plot of classes fails to draw
    path.write_text(path.read_text().replace("<script", CAPPED + "<script", 1))
    browser.open(path.as_uri())
    for plot in ("plot-width", "plot-height", "plot-compare"):
        assert browser.js(f"document.querySelectorAll('#{plot} circle.mark').length") == 12, plot
    assert browser.js("document.getElementById('plot-classes')") is None
    broken = browser.js("Array.from(document.querySelectorAll('.broken')).map(e => e.textContent)")
    assert len(broken) == 1 and broken[0].startswith("the plot of classes could not be drawn (TypeError")
    assert browser.js(f"{ROWS}.length") == 12  # the table and the viewer still work
    for name in names:
        browser.click_on(f"{ROWS}.find(tr => tr.cells[0].textContent === {json.dumps(name)})")
        assert browser.js("document.getElementById('viewer').classList.contains('open')"), name
        assert browser.js("document.getElementById('viewer-title').textContent") == name
        panel = browser.js("document.querySelector('#content .panel').textContent")
        assert panel.startswith("No picture of this scan"), (name, panel)
        browser.click_on("document.getElementById('close')")
