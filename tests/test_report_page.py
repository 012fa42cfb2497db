"""report.html's markup without a browser: names and class names with HTML in them reach the page only escaped
(in markup) or as JSON that cannot end its script block; the headline's figures are metrics' to three decimals, and
with two models those over the scans both scored, said in words where the models scored different scans."""

import html
import json
import re

import pytest

from srforge.evaluate.aggregate import both_scored, results
from srforge.evaluate.report import headline_html, scan_table, write_html

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
    document.update(primary="mean_iou_without_bg", models=models, both_scored=both_scored(rows_a, rows_b, classes))
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


def scan(name: str, confusion: list[list[int]] | None) -> dict:
    """One row of two classes (bg, ink) with ``confusion`` counts (rows true, columns predicted), or failed (None);
    tolerance counts that make each class's tolerance F1 its Dice."""
    if confusion is None:
        return {"name": name, "status": "failed", "error": "no prediction", "height": None, "width": None}
    tolerance = [
        [confusion[c][c], confusion[0][c] + confusion[1][c], confusion[c][c], sum(confusion[c])] for c in (0, 1)
    ]
    return {"name": name, "status": "ok", "height": 2, "width": 5, "confusion": confusion, "tolerance": tolerance}


def headline_of(page: str) -> str:
    return page[page.index("<h1>") : page.index("<h2>")]


def test_the_headline_compares_a_and_b_on_the_scans_both_scored(tmp_path):
    # hard: A's worst scan, which B failed on; lost: A failed on it, B scored it perfectly. Pooled over what each
    # scored, B would lead (ink IoU 7/8 against A's 5/9); over s1 and s3, the scans both scored, A leads.
    rows_a = [
        scan("hard", [[4, 2], [2, 2]]),
        scan("lost", None),
        scan("s1", [[8, 0], [0, 2]]),
        scan("s3", [[9, 0], [0, 1]]),
    ]
    rows_b = [
        scan("hard", None),
        scan("lost", [[5, 0], [0, 5]]),
        scan("s1", [[8, 0], [1, 1]]),
        scan("s3", [[9, 0], [0, 1]]),
    ]
    models = write_report(tmp_path, rows_a, rows_b, ["bg", "ink"])
    assert models[0]["results"]["micro"]["per_class"]["iou"]["ink"] == pytest.approx(5 / 9)  # [[21, 2], [2, 5]]
    assert models[1]["results"]["micro"]["per_class"]["iou"]["ink"] == pytest.approx(7 / 8)  # [[22, 0], [1, 7]]
    both = both_scored(rows_a, rows_b, ["bg", "ink"])
    assert (both["scans"], both["a_only"], both["b_only"]) == (2, 1, 1)
    # over s1 + s3: A pools [[17, 0], [0, 3]], B [[17, 0], [1, 2]]
    assert both["micro_a"]["per_class"]["iou"]["ink"] == 1.0 and both["micro_a"]["pixel_accuracy"] == 1.0
    assert both["micro_b"]["per_class"]["iou"]["ink"] == pytest.approx(2 / 3)
    assert both["micro_b"]["per_class"]["tol_f1"]["ink"] == pytest.approx(0.8)  # precision 1, recall 2/3
    assert both["micro_b"]["pixel_accuracy"] == pytest.approx(19 / 20)
    assert both["difference_b_minus_a"]["pixel_accuracy"] == pytest.approx(-0.05)
    page = (tmp_path / "report.html").read_text()
    top = headline_of(page)
    for model, figure, value in [("A", "iou", "1.000"), ("B", "iou", "0.667"), ("B", "tol_f1", "0.800")]:
        assert f'data-model="{model}" data-figure="{figure}" data-class="ink">{value}<' in top
    assert 'data-model="B" data-figure="pixel_accuracy" data-class="">0.950</span> <span class="worse">-0.050<' in top
    assert '<span class="worse">-0.333</span>' in top  # ink IoU, B - A
    words = (
        "A and B on the 2 scans both scored; A also scored 1 other, B 1 other, left out here so that both are "
        "measured on the same scans (the tables below pool each model&#x27;s own)."
    )
    assert f'<p class="verdict" id="same-scans">{words}</p>' in top
    assert "here only the 2 scans both models scored" in top  # on each card's hover
    assert "A: 3 scans scored, 1 failed \u00b7 B: 3 scans scored, 1 failed" in top
    assert page.count("Each model over all the scans it scored: A 3, B 3 (the headline: the 2 both scored).") == 2


def test_a_headline_where_only_one_model_scored_some_scans_says_none_for_the_other():
    rows_a = [scan("s1", [[8, 0], [0, 2]]), scan("s2", [[4, 2], [2, 2]])]
    rows_b = [scan("s1", [[8, 0], [1, 1]]), scan("s2", None)]
    document = {"options": {"tolerance": 2}, "classes": ["bg", "ink"], "primary": "mean_iou_without_bg"}
    document["models"] = [{"name": n, "results": results(r, ["bg", "ink"])} for n, r in (("A", rows_a), ("B", rows_b))]
    document["both_scored"] = both_scored(rows_a, rows_b, ["bg", "ink"])
    top = headline_html(document, scan_table(rows_a, rows_b, "mean_iou_without_bg"))
    assert "A and B on the 1 scan both scored; A also scored 1 other, B none, left out here" in top
    document["both_scored"] = both_scored(rows_a, [scan("s1", None), scan("s2", None)], ["bg", "ink"])
    top = headline_html(document, [])
    assert "No scan was scored by both A and B (A scored 2 scans, B 0 scans), so the headline has no figures" in top
    assert 'data-model="A" data-figure="iou" data-class="ink">\u2013<' in top  # no scan to pool: a dash


def test_with_the_same_scans_scored_the_headline_is_each_models_own_and_says_nothing_more(tmp_path):
    rows_a = [scan("s1", [[8, 0], [0, 2]]), scan("s2", [[4, 2], [2, 2]]), scan("gone", None)]
    rows_b = [scan("s1", [[8, 0], [1, 1]]), scan("s2", [[5, 1], [0, 4]]), scan("gone", None)]
    models = write_report(tmp_path, rows_a, rows_b, ["bg", "ink"])
    both = both_scored(rows_a, rows_b, ["bg", "ink"])
    assert (both["scans"], both["a_only"], both["b_only"]) == (2, 0, 0)
    assert both["micro_a"] == models[0]["results"]["micro"] and both["micro_b"] == models[1]["results"]["micro"]
    page = (tmp_path / "report.html").read_text()
    top = headline_of(page)
    for model in models:
        value = model["results"]["micro"]["per_class"]["iou"]["ink"]
        assert f'data-model="{model["name"]}" data-figure="iou" data-class="ink">{value:.3f}<' in top
    assert "both scored" not in page and "same-scans" not in page and "Each model over all" not in page
