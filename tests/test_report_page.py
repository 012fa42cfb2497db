"""report.html's markup without a browser: names and class names with HTML in them reach the page only escaped
(in markup) or as JSON that cannot end its script block; the headline's figures are metrics' to three decimals."""

import html
import json
import re

from srforge.evaluate.aggregate import results
from srforge.evaluate.report import scan_table, write_html

CLASSES = ["bg", "<b>ink</b>", "</script><script>alert(1)</script>"]
NAMES = ["<img src=x onerror=alert(1)>", "a</script>b", "plain"]


def rows(shift: int) -> list[dict]:
    """Three scored scans of 3 classes, counts differing by ``shift``."""
    out = []
    for i, name in enumerate(NAMES):
        confusion = [[50 + i + shift, 3, 1], [2, 20 + shift, 4], [1, 2, 9 + i]]
        tolerance = [
            [sum(r[c] for r in confusion), sum(r[c] for r in confusion), sum(confusion[c]), sum(confusion[c])]
            for c in range(3)
        ]
        out.append(
            {"name": name, "status": "ok", "height": 5, "width": 9 + i, "confusion": confusion, "tolerance": tolerance}
        )
    return out


def write_report(out, rows_a: list[dict], rows_b: list[dict], classes, data: str = "synthetic") -> list[dict]:
    """report.html in ``out`` of two models' rows (with ``confusion`` and ``tolerance`` counts) as
    srforge-evaluate writes it, without pictures; the models (their ``results``)."""
    models = [
        {"name": n, "source": n, "fingerprint": None, "results": results(r, classes)}
        for n, r in (("A", rows_a), ("B", rows_b))
    ]
    document = {"data": data, "options": {"tolerance": 2}, "classes": classes, "ignore_index": 255}
    document.update(primary="mean_iou_without_bg", models=models)
    write_html(out, document, scan_table(rows_a, rows_b, "mean_iou_without_bg"), [])
    return models


def test_names_are_escaped_and_the_headline_is_metrics_to_three_decimals(tmp_path):
    models = write_report(tmp_path, rows(0), rows(5), CLASSES, data="<i>d</i>")
    page = (tmp_path / "report.html").read_text()
    for raw in [*CLASSES[1:], NAMES[0], "<i>d</i>"]:
        assert raw not in page
    assert html.escape(CLASSES[1]) in page and page.count("<script") == 2 and page.count("</script>") == 2
    block = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1)
    data = json.loads(block)
    assert sorted(row[0] for row in data["rows"]) == sorted(NAMES)
    iou = models[0]["results"]["micro"]["per_class"]["iou"][CLASSES[1]]
    card = f'data-model="A" data-figure="iou" data-class="{html.escape(CLASSES[1])}">{iou:.3f}<'
    assert card in page


def test_scans_csv_keeps_names_from_being_read_as_formulas_and_numbers_as_numbers(tmp_path):
    import csv
    import io

    from srforge.evaluate.report import write_scans

    names = ["=1+1", "+SUM(A1)", "-2", "@cmd", "plain", "a=b"]
    table = [{"name": name, "status": "ok", "difference": -0.25 if i else 0.5} for i, name in enumerate(names)]
    write_scans(tmp_path, table, ["name", "status", "difference"])
    read = list(csv.DictReader(io.StringIO((tmp_path / "scans.csv").read_text())))
    assert [r["name"] for r in read] == ["'=1+1", "'+SUM(A1)", "'-2", "'@cmd", "plain", "a=b"]
    assert [r["difference"] for r in read] == ["0.5"] + ["-0.25"] * 5  # a negative number is no formula


def test_a_median_difference_of_zero_is_neither_better_nor_worse():
    from srforge.evaluate.report import verdict

    same = verdict([{"difference": d} for d in (-0.5, 0.0, 0.5)], "mean_iou_without_bg")
    assert '<b id="median" class="">0.000</b>' in same and "1</b> of 3 scans, A on" in same
    worse = verdict([{"difference": d} for d in (-0.5, -0.25, 0.5)], "mean_iou_without_bg")
    assert '<b id="median" class="worse">-0.250</b>' in worse
