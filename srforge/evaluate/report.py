"""What an evaluation writes: metrics.json (every aggregate), scans.csv (one row a scan) and report.html, one page
that works offline from the file system: CSS and script inline, the worst scans' pictures inline (shrunk to the
page when wider), each beside a link to its full-size picture in pictures/.

    summary        micro and macro figures of each model (and the difference with --compare)
    per class      IoU, Dice, precision, recall, tolerance F1 per class, micro
    confusion      pooled counts, rows true, columns predicted
    width thirds   micro and macro by the narrowest, middle and widest third of the scans
    scans          one row a scan, sorted by clicking any column header (again: the other way)
    worst N        the N scans of lowest primary figure (srforge.evaluate.metrics.primary), pictured
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from srforge.atomic import atomic_write_text
from srforge.evaluate.aggregate import json_safe
from srforge.evaluate.pictures import LEGEND
from srforge.predict.report import printable

# The first bytes of each file srforge-evaluate writes: how a rerun tells its own files from someone else's.
STARTS = {
    "metrics.json": b'{\n "srforge_evaluate": ',
    "scans.csv": b"name,status,",
    "report.html": b"<!DOCTYPE html>\n<!-- srforge-evaluate -->",
}
SUMMARY = [
    "pixel_accuracy",
    "mean_iou_with_bg",
    "mean_iou_without_bg",
    "mean_dice_without_bg",
    "mean_precision_without_bg",
    "mean_recall_without_bg",
    "mean_tol_f1_without_bg",
]
CLASS_COLUMNS = ("iou", "dice", "precision", "recall", "tol_f1")


def write_metrics(out_dir: Path, document: dict[str, Any]) -> None:
    atomic_write_text(out_dir / "metrics.json", json.dumps({"srforge_evaluate": 1, **json_safe(document)}, indent=1))


def scan_columns(class_names, compare: bool) -> list[str]:
    """The columns of scans.csv and of the page's scan table."""
    columns = ["name", "status", "height", "width", *SUMMARY, "false_positive_px", "false_negative_px"]
    columns += [f"{figure}_{name}" for name in class_names for figure in CLASS_COLUMNS]
    if compare:
        columns += [f"{SUMMARY[2]}_b", "difference"]
    return [*columns, "error"]


def scan_table(rows: list[dict], rows_b: list[dict] | None, primary: str) -> list[dict[str, Any]]:
    """One flat dict a scan (``rows`` need ``figures``); with ``rows_b``, B's primary figure and B - A, the table
    sorted by that difference (largest loss first, undefined last)."""
    table = []
    by_name = {row["name"]: row for row in rows_b or []}
    for row in rows:
        flat = {key: row.get(key) for key in ("name", "status", "height", "width", "error")}
        found = row.get("figures", {})
        flat.update({key: value for key, value in found.items() if key != "per_class"})
        for figure, values in found.get("per_class", {}).items():
            flat.update({f"{figure}_{name}": value for name, value in values.items()})
        if rows_b is not None:
            b = by_name.get(row["name"], {}).get("figures", {}).get(primary, math.nan)
            flat[f"{SUMMARY[2]}_b"] = b
            flat["difference"] = b - flat.get(primary, math.nan)
        table.append(flat)
    if rows_b is not None:
        table.sort(key=lambda r: (math.isnan(r["difference"]), r["difference"]))
    return table


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def write_scans(out_dir: Path, table: list[dict], columns: list[str]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore")
    writer.writeheader()
    for row in table:
        writer.writerow({key: printable(_cell(row.get(key))) for key in columns})
    atomic_write_text(out_dir / "scans.csv", buffer.getvalue())


def png_data_uri(data: bytes) -> str:
    """A PNG's bytes as a data: URI, for a picture inline in the page."""
    return "data:image/png;base64," + base64.b64encode(data).decode()


# -- the page ---------------------------------------------------------------------------------------------
STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1250px}
table{border-collapse:collapse;margin:.5em 0 1.5em}th,td{border:1px solid #ccc;padding:2px 6px;text-align:right}
th{background:#eee}td:first-child,th:first-child{text-align:left}
table.sortable th{cursor:pointer;user-select:none}table.sortable th[data-order=asc]::after{content:" \\25B2"}
table.sortable th[data-order=desc]::after{content:" \\25BC"}.scroll{overflow-x:auto}
figure{margin:0 0 1.5em}img{max-width:100%;image-rendering:pixelated;border:1px solid #ccc}
.key span{display:inline-block;width:1em;height:1em;margin:0 .3em 0 1em;vertical-align:middle}
"""
SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.dataset.order !== "asc", num = th.dataset.type === "num", body = table.tBodies[0];
      table.querySelectorAll("th").forEach(function (h) { delete h.dataset.order; });
      th.dataset.order = asc ? "asc" : "desc";
      function key(tr) { var t = tr.cells[col].textContent; return num ? (t === "" ? NaN : parseFloat(t)) : t; }
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (num) {
          if (isNaN(x) || isNaN(y)) { return isNaN(x) - isNaN(y); }
          return asc ? x - y : y - x;
        }
        return asc ? x.localeCompare(y) : y.localeCompare(x);
      });
      rows.forEach(function (tr) { body.appendChild(tr); });
    });
  });
});
"""


def table_html(header: list[str], rows: list[list], sortable: bool = False, numeric: set[str] = frozenset()) -> str:
    """A <table>: ``header`` cells, then one <tr> per row (values formatted by _cell, text escaped)."""
    heads = "".join(f"<th{' data-type=num' if h in numeric else ''}>{html.escape(printable(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(printable(_cell(v)))}</td>" for v in row) + "</tr>\n" for row in rows
    )
    kind = ' class="sortable" id="scans"' if sortable else ""
    return f'<div class="scroll"><table{kind}><thead><tr>{heads}</tr></thead><tbody>\n{body}</tbody></table></div>'


def summary_html(models: list[dict]) -> str:
    rows = []
    for model in models:
        for kind in ("micro", "macro"):
            rows.append([f"{model['name']} {kind}", *(model["results"][kind].get(key) for key in SUMMARY)])
    return table_html(["", *SUMMARY], rows)


def classes_html(model: dict, class_names) -> str:
    found = model["results"]["micro"]["per_class"]
    rows = [[name, *(found[figure][name] for figure in CLASS_COLUMNS)] for name in class_names]
    return table_html(["class", *CLASS_COLUMNS], rows)


def confusion_html(model: dict, class_names) -> str:
    matrix = model["results"]["micro"]["confusion_matrix"]
    rows = [[f"true {name}", *counts] for name, counts in zip(class_names, matrix)]
    return table_html(["", *(f"predicted {name}" for name in class_names)], rows)


def thirds_html(model: dict) -> str:
    rows = []
    for third in model["results"]["by_width_third"]:
        widths = "-".join(map(str, third["widths"])) if third["widths"] else ""
        for kind in ("micro", "macro"):
            rows.append([f"{third['third']} {kind}", third["scans"], widths, *(third[kind].get(k) for k in SUMMARY)])
    return table_html(["", "scans", "widths (px)", *SUMMARY], rows)


def worst_html(pictures: list[dict]) -> str:
    """Figures of the worst scans: each picture shown (inline) beside a link to its full-size file."""
    key = "".join(f'<span style="background:rgb{c}"></span>{html.escape(n)}' for n, c in LEGEND.items())
    parts = [f'<p class="key">{key}</p>']
    for shot in pictures:
        caption = html.escape(printable(shot["caption"]))
        if "note" in shot:
            parts.append(f"<figure><figcaption>{caption}: {html.escape(printable(shot['note']))}</figcaption></figure>")
            continue
        link = html.escape(quote(os.fsencode(shot["file"]), safe="/"))  # the file's bytes, whatever they are
        parts.append(
            f'<figure><figcaption>{caption} &middot; <a class="full" href="{link}">full size</a></figcaption>'
            f'<img src="{shot["uri"]}" alt="{caption}"></figure>'
        )
    return "\n".join(parts)


def write_html(out_dir: Path, document: dict, table: list[dict], columns: list[str], pictures: list[dict]) -> None:
    """report.html: every section of the module docstring, one self-contained page."""
    names, models = document["classes"], document["models"]
    numeric = {c for c in columns if c not in ("name", "status", "error")}
    about = " \u00b7 ".join(
        [f"data {document['data']}", f"{len(table)} scans", f"tolerance {document['options']['tolerance']} px"]
        + [f"{m['name']}: {m['source']} (model {m['fingerprint'] or '-'})" for m in models]
    )
    sections = [
        "<h2>Summary</h2>",
        summary_html(models),
        "<p>micro: pixels pooled over the scans; macro: the mean over scans of each scan's figure. tol_f1: F1 with "
        f"a tolerance of {document['options']['tolerance']} px.</p>",
    ]
    for model in models:
        sections += [f"<h2>Per class ({html.escape(model['name'])}, micro)</h2>", classes_html(model, names)]
        sections += [f"<h2>Confusion matrix ({html.escape(model['name'])})</h2>", confusion_html(model, names)]
        sections += [f"<h2>By width third ({html.escape(model['name'])})</h2>", thirds_html(model)]
    rows = [[row.get(c) for c in columns] for row in table]
    sections += [f"<h2>Scans ({len(table)})</h2>", table_html(columns, rows, sortable=True, numeric=numeric)]
    sections += [f"<h2>The {len(pictures)} worst scans</h2>", worst_html(pictures)]
    page = (
        f"{STARTS['report.html'].decode()}\n<html lang=en><head><meta charset=utf-8><title>srforge-evaluate</title>"
        f"<style>{STYLE}</style></head><body><h1>srforge-evaluate</h1><p>{html.escape(printable(about))}</p>\n"
        + "\n".join(sections)
        + f"\n<script>{SCRIPT}</script></body></html>\n"
    )
    atomic_write_text(out_dir / "report.html", page)
