"""What an evaluation writes: metrics.json (every aggregate), scans.csv (one row a scan) and report.html, one page
that works offline from the file system (CSS and script inline, srforge.evaluate.report_assets), beside the
full-size pictures in pictures/. The page, top to bottom:

    headline       the figures that matter, micro, three decimals, the definition on hover: IoU and tolerance F1
                   of each foreground class, pixel accuracy; with --compare B beside A, both over the scans both
                   scored (metrics.json's "both_scored", said in words where A or B scored others too, so that
                   neither looks better by failing on hard scans), and on how many scans B is better than A, with
                   the median per-scan difference
    plots          the primary figure per scan against width and against height, its histogram, precision and
                   recall per class; with --compare the primary figure of A against B, one mark per scan
    tables         per class and per width third, micro and macro side by side, each model over all it scored
                   (said under them where that differs from the headline's scans); the confusion matrix
    scans          one row a scan, failed scans first, then worst first; sorted by a header click, filtered by
                   name, status and a threshold on a figure; a row opens the scan's picture
    worst N        the N scans of lowest primary figure (srforge.evaluate.metrics.primary): the scan and its
                   errors as a strip at the page's width, a click opens it at full resolution to zoom and pan

The scan table, the plots and the viewer are drawn by the page's script from one JSON block, so that the page of
10,000 scans stays small and quick to open; every name is put into the page as text, never as markup.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any
from urllib.parse import quote

from srforge.atomic import atomic_write_text
from srforge.evaluate.aggregate import json_safe, scored_apart
from srforge.evaluate.pictures import LEGEND
from srforge.evaluate.report_assets import SCRIPT, STYLE
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


# A text cell starting with one of these is a formula to Excel, LibreOffice and Google Sheets (a scan named
# "=HYPERLINK(...)" would run when scans.csv is opened): such cells are written behind a single quote, which the
# spreadsheet shows as text. Numbers are left alone: "-0.25" is a number to every spreadsheet, never a formula.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value) -> str:
    """One cell of scans.csv: a number as :func:`_cell` writes it, text made printable and kept from being read as a
    formula."""
    text = printable(_cell(value))
    return "'" + text if isinstance(value, str) and text.startswith(FORMULA_STARTS) else text


def write_scans(out_dir: Path, table: list[dict], columns: list[str]) -> None:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns, extrasaction="ignore")
    writer.writeheader()
    for row in table:
        writer.writerow({key: csv_cell(row.get(key)) for key in columns})
    atomic_write_text(out_dir / "scans.csv", buffer.getvalue())


def png_data_uri(data: bytes) -> str:
    """A PNG's bytes as a data: URI, for a picture inline in the page."""
    return "data:image/png;base64," + base64.b64encode(data).decode()


# -- the page ---------------------------------------------------------------------------------------------
LABELS = {
    "pixel_accuracy": "pixel accuracy",
    "mean_iou_with_bg": "mean IoU",
    "mean_iou_without_bg": "mean IoU (foreground)",
    "mean_dice_without_bg": "mean Dice (foreground)",
    "mean_precision_without_bg": "mean precision (foreground)",
    "mean_recall_without_bg": "mean recall (foreground)",
    "mean_tol_f1_with_bg": "mean tolerance F1",
    "mean_tol_f1_without_bg": "mean tolerance F1 (foreground)",
    "false_positive_px": "false positive px",
    "false_negative_px": "false negative px",
    "iou": "IoU",
    "dice": "Dice",
    "precision": "precision",
    "recall": "recall",
    "tol_f1": "tolerance F1",
    "difference": "B \u2212 A",
}
# What each figure is, shown on hover: a reader should never have to guess which IoU this is.
DEFINITIONS = {
    "pixel_accuracy": "labelled pixels given their true class / all labelled pixels (ignored pixels left out)",
    "iou": "intersection over union: pixels predicted C and truly C / pixels predicted C or truly C",
    "dice": "2 x pixels predicted C and truly C / (pixels predicted C + pixels truly C)",
    "precision": "pixels predicted C that are truly C / pixels predicted C",
    "recall": "pixels truly C that are predicted C / pixels truly C",
    "tol_f1": "F1 of tolerance precision (predicted C pixels within {t} px of a true C pixel / predicted C pixels) "
    "and tolerance recall (true C pixels within {t} px of a predicted C pixel / true C pixels)",
    "false_positive_px": "pixels predicted a foreground class that truly are another class",
    "false_negative_px": "true foreground pixels given another class",
    "difference": "B's figure minus A's on this scan: above 0, B is better",
    "micro": "micro: pixels pooled over all scans, so wide scans weigh most",
    "macro": "macro: the mean over scans of each scan's figure (a scan where the class is absent from both masks "
    "left out), every scan weighing alike",
}
TABLE_FIGURES = ("pixel_accuracy", "mean_iou_without_bg", "mean_dice_without_bg", "mean_tol_f1_without_bg")


def label(key: str) -> str:
    """A figure's name for people (``mean_iou_without_bg`` -> ``mean IoU (foreground)``)."""
    return LABELS.get(key, key.replace("_", " "))


def definition(key: str, tolerance: int) -> str:
    """What figure ``key`` is, for a hover: a mean names what it averages ('' for a key without a definition)."""
    base, mean, which = key, "", ""
    if key.startswith("mean_"):
        base, mean = key[len("mean_") :], "the mean over classes of "
    for end, note in (("_without_bg", " (class 0, the background, left out)"), ("_with_bg", "")):
        if base.endswith(end):
            base, which = base[: -len(end)], note
            break
    found = DEFINITIONS.get(base)
    return (mean + found + which).format(t=tolerance) if found else ""


def three(value) -> str:
    """A figure as the page shows it: three decimals, an undefined one (None, NaN) as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "\u2013"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def text(value) -> str:
    """Any text for the page, escaped (names that are not UTF-8 shown with \\xNN escapes)."""
    return html.escape(printable(str(value)))


def foreground(class_names) -> list[str]:
    """The classes whose figures the headline shows: all but the background (class 0), or the only one."""
    return list(class_names[1:]) if len(class_names) > 1 else list(class_names)


def card(title: str, hover: str, figure: str, name: str, values: list) -> str:
    """One headline figure: A's value large (three decimals), then B's with the difference B - A when given.
    ``figure`` and ``name`` (the class, or '') mark it for a reader of the page's markup (and its tests)."""
    a = values[0]
    marks = f'data-figure="{text(figure)}" data-class="{text(name)}"'
    out = f'<div class="card"><span class="label" title="{text(hover)}">{text(title)}</span>'
    out += f'<span class="num" data-model="A" {marks}>{three(a)}</span>'
    if len(values) > 1:
        b = values[1]
        diff = b - a if isinstance(a, float) and isinstance(b, float) else math.nan
        kind = "better" if diff > 0 else "worse" if diff < 0 else ""
        out += f'<span class="b">B <span data-model="B" {marks}>{three(b)}</span> '
        out += f'<span class="{kind}">{"+" if diff > 0 else ""}{three(diff)}</span></span>'
    return out + "</div>"


def verdict(table: list[dict], primary: str) -> str:
    """With two models: on how many scans B's primary figure beats A's, and the median difference B - A."""
    diffs = [row["difference"] for row in table if not math.isnan(row.get("difference", math.nan))]
    if not diffs:
        return '<p class="verdict" id="verdict">No scan was scored for both models.</p>'
    better, worse = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    median = statistics.median(diffs)
    kind = "better" if median > 0 else "worse" if median < 0 else ""  # no difference is neither
    return (
        f'<p class="verdict" id="verdict">B is better on <b id="b-better">{better}</b> of {len(diffs)} scans, A on '
        f'<b id="a-better">{worse}</b>, {len(diffs) - better - worse} equal; the median difference of '
        f'{text(label(primary))} (B \u2212 A) is <b id="median" class="{kind}">'
        f"{'+' if median > 0 else ''}{median:.3f}</b>.</p>"
    )


def headline_html(document: dict, table: list[dict]) -> str:
    """The cards of the figures that matter (micro) and, with two models, the verdict. Two models' figures are
    those over the scans both scored (``document["both_scored"]``, srforge.evaluate.aggregate.both_scored): each
    one's own micro would let a model that fails on the hard scans look better for it."""
    models, tolerance = document["models"], document["options"]["tolerance"]
    both = both_of(document)
    found = [both["micro_a"], both["micro_b"]] if both else [model["results"]["micro"] for model in models]
    scope = f"; here only the {plural(both['scans'], 'scan')} both models scored" if scored_apart(both) else ""
    cards = []
    for name in foreground(document["classes"]):
        for figure in ("iou", "tol_f1"):
            hover = f"{definition(figure, tolerance)}; {DEFINITIONS['micro']}{scope}"
            values = [f["per_class"][figure][name] if f.get("per_class") else None for f in found]
            cards.append(card(f"{label(figure)} \u00b7 {name}", hover, figure, name, values))
    hover = f"{definition('pixel_accuracy', tolerance)}; {DEFINITIONS['micro']}{scope}"
    cards.append(card("pixel accuracy", hover, "pixel_accuracy", "", [f.get("pixel_accuracy") for f in found]))
    counts = " \u00b7 ".join(
        f"{m['name']}: {m['results']['scored']} scans scored, {m['results']['failed']} failed" for m in models
    )
    out = f'{same_scans_html(document)}<div class="headline">{"".join(cards)}</div><p>{text(counts)}</p>'
    return out + (verdict(table, document["primary"]) if len(models) > 1 else "")


def both_of(document: dict) -> dict | None:
    """metrics.json's "both_scored" of two models (srforge.evaluate.aggregate.both_scored); None with one."""
    return document["both_scored"] if len(document["models"]) > 1 else None


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def others(n: int) -> str:
    """How many scans a model scored besides those both scored, in words ("none", "1 other", "2 others")."""
    return plural(n, "other") if n else "none"


def same_scans_html(document: dict) -> str:
    """Above the headline, where A and B scored different scans: that its figures are over the scans both scored,
    and how many each scored besides ('' where they scored the same scans, or with one model)."""
    both = both_of(document)
    if not scored_apart(both):
        return ""
    a, b = (model["name"] for model in document["models"])
    if both["scans"]:
        words = (
            f"{a} and {b} on the {plural(both['scans'], 'scan')} both scored; {a} also scored "
            f"{others(both['a_only'])}, {b} {others(both['b_only'])}, left out here so that both are measured on the "
            "same scans (the tables below pool each model's own)."
        )
    else:
        words = (
            f"No scan was scored by both {a} and {b} ({a} scored {plural(both['a_only'], 'scan')}, {b} "
            f"{plural(both['b_only'], 'scan')}), so the headline has no figures to compare them by (the tables below "
            "pool each model's own)."
        )
    return f'<p class="verdict" id="same-scans">{text(words)}</p>'


def own_scans_html(document: dict) -> str:
    """Under a table of each model's own aggregate, where A and B scored different scans: which scans those are
    ('' otherwise: then they are the headline's)."""
    both = both_of(document)
    if not scored_apart(both):
        return ""
    each = ", ".join(f"{m['name']} {m['results']['scored']}" for m in document["models"])
    words = f"Each model over all the scans it scored: {each} (the headline: the {both['scans']} both scored)."
    return f"<p class=about>{text(words)}</p>"


def figure_table(header: list[tuple[str, str]], groups: list[str], rows: list[list]) -> str:
    """A <table> whose figures are each given micro and macro (two header rows): ``header`` (label, hover) of
    the first columns, then of each figure in ``groups``; cells escaped, figures with three decimals."""
    first = "".join(f'<th rowspan=2 title="{text(hover)}">{text(name)}</th>' for name, hover in header)
    spans = "".join(f'<th colspan=2 title="{text(hover)}">{text(name)}</th>' for name, hover in groups)
    kinds = "".join(f'<th title="{text(DEFINITIONS[k])}">{k}</th>' for _ in groups for k in ("micro", "macro"))
    body = "".join("<tr>" + "".join(f"<td>{text(three(v))}</td>" for v in row) + "</tr>\n" for row in rows)
    return f"<table><thead><tr>{first}{spans}</tr><tr>{kinds}</tr></thead><tbody>\n{body}</tbody></table>"


def classes_html(models: list[dict], class_names, tolerance: int) -> str:
    """One row a class (and model), its figures micro and macro side by side."""
    prefix = [("class", "")] + ([("model", "")] if len(models) > 1 else [])
    groups = [(label(f), definition(f, tolerance)) for f in CLASS_COLUMNS]
    rows = []
    for name in class_names:
        for model in models:
            found = [model["results"][kind].get("per_class", {}) for kind in ("micro", "macro")]
            values = [r.get(f, {}).get(name) for f in CLASS_COLUMNS for r in found]
            rows.append([name, *([model["name"]] if len(models) > 1 else []), *values])
    return figure_table(prefix, groups, rows)


def thirds_html(models: list[dict], tolerance: int) -> str:
    """One row a width third (and model): scans, widths, and the summary figures micro and macro."""
    prefix = [("width third", ""), *([("model", "")] if len(models) > 1 else []), ("scans", ""), ("widths", "px")]
    groups = [(label(f), definition(f, tolerance)) for f in TABLE_FIGURES]
    rows = []
    for t in range(3):
        for model in models:
            third = model["results"]["by_width_third"][t]
            widths = "\u2013".join(map(str, third["widths"])) if third["widths"] else ""
            values = [third[kind].get(f) for f in TABLE_FIGURES for kind in ("micro", "macro")]
            which = [model["name"]] if len(models) > 1 else []
            rows.append([third["third"], *which, third["scans"], widths, *values])
    return figure_table(prefix, groups, rows)


def confusion_html(model: dict, class_names) -> str:
    """Pooled pixel counts, rows the true class, columns the predicted one."""
    matrix = model["results"]["micro"]["confusion_matrix"]
    heads = "".join(f"<th>predicted {text(name)}</th>" for name in class_names)
    body = "".join(
        f"<tr><th>true {text(name)}</th>" + "".join(f"<td>{n}</td>" for n in counts) + "</tr>"
        for name, counts in zip(class_names, matrix)
    )
    return f"<table><thead><tr><th></th>{heads}</tr></thead><tbody>{body}</tbody></table>"


def page_columns(class_names, primary: str, compare: bool, tolerance: int) -> list[dict[str, Any]]:
    """The scan table's columns on the page (scans.csv has them all): the primary figure first, each foreground
    class's IoU when there are several, then the rest of what tells a good scan from a bad one."""
    keys = ["name", "status", "height", "width", primary]
    fg = foreground(class_names)
    keys += [f"iou_{name}" for name in fg] if len(fg) > 1 else []
    keys += [primary.replace("iou", "tol_f1"), "pixel_accuracy", "false_positive_px", "false_negative_px"]
    keys += [f"{SUMMARY[2]}_b", "difference"] if compare else []
    columns = []
    for key in [*keys, "error"]:
        if key.startswith("iou_"):
            name, title = f"IoU {key[4:]}", definition("iou", tolerance)
        elif key.endswith("_b"):
            name, title = f"B: {label(primary)}", definition(primary, tolerance)
        else:
            name, title = label(key), definition(key, tolerance)
        columns.append({"key": key, "label": name, "title": title, "num": key not in ("name", "status", "error")})
    return columns


def page_order(table: list[dict], primary: str) -> list[dict]:
    """The scan table as the page first shows it: failed scans first, then worst first (by B - A with two
    models), undefined figures last, ties by name."""
    key = "difference" if table and "difference" in table[0] else primary

    def rank(row):
        value = row.get(key)
        undefined = not isinstance(value, (int, float)) or math.isnan(value)
        return (row["status"] == "ok", undefined, 0.0 if undefined else value, printable(row["name"]))

    return sorted(table, key=rank)


def cell(value):
    """A table value for the page's JSON: figures to 6 decimals (the page shows 3), NaN as null, names printable."""
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    return printable(value) if isinstance(value, str) else value


def page_data(document: dict, table: list[dict], pictures: list[dict], sources: dict) -> dict[str, Any]:
    """What the page's script draws from: columns, rows, the pictures and source files by scan, precision and
    recall per class."""
    primary, tolerance = document["primary"], document["options"]["tolerance"]
    models = document["models"]
    columns = page_columns(document["classes"], primary, len(models) > 1, tolerance)
    rows = [[cell(row.get(c["key"])) for c in columns] for row in page_order(table, primary)]
    shots: dict[str, list] = {}
    for shot in pictures:
        if "note" not in shot:
            entry = {key: shot[key] for key in ("model", "width", "height")}
            entry["file"] = link(shot["file"])
            shots.setdefault(printable(shot["name"]), []).append(entry)
    pr = [
        {"label": name + (f" ({m['name']})" if len(models) > 1 else ""), **{f: cell(found[f][name]) for f in PR}}
        for name in document["classes"]
        for m in models
        if (found := m["results"]["micro"].get("per_class"))
    ]
    return {
        "primary": primary,
        "compare": len(models) > 1,
        "bkey": f"{SUMMARY[2]}_b",
        "labels": {key: label(key) for key in SUMMARY},
        "columns": columns,
        "rows": rows,
        "pictures": shots,
        "sources": {printable(name): {k: link(v) for k, v in files.items()} for name, files in sources.items()},
        "pr": pr,
    }


PR = ("precision", "recall")


def link(path: str) -> str:
    """A relative path as a URL: its bytes percent-encoded, whatever they are (a name need not be UTF-8); a
    file: URI as it is."""
    return path if path.startswith("file:") else quote(os.fsencode(path), safe="/")


def json_block(data: dict) -> str:
    """``data`` as JSON that cannot end its <script> block: every <, > and & escaped as \\uXXXX."""
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def worst_html(pictures: list[dict], page_width: int) -> str:
    """Figures of the worst scans: each strip (the scan above, its errors below) at an integer zoom that fills
    at most ``page_width`` px, so that every picture pixel, and so every error, covers one page pixel at least;
    a click opens the full-size picture in the page's viewer, and a link opens its file."""
    key = "".join(f'<span style="background:rgb{c}"></span>{text(n)}' for n, c in LEGEND.items())
    parts = [f'<p class="key">Above each scan, below its errors:{key}</p>']
    for shot in pictures:
        caption = text(shot["caption"])
        if "note" in shot:
            parts.append(f"<figure><figcaption>{caption}: {text(shot['note'])}</figcaption></figure>")
            continue
        width, height = shot["shown"]
        zoom = max(1, min(page_width // width, 320 // height))  # thin strips grow, tall ones stay on screen
        parts.append(
            f'<figure><figcaption>{caption} &middot; <a class="full" href="{html.escape(link(shot["file"]))}">'
            f'full size</a> ({shot["width"]} \u00d7 {shot["height"]} px)</figcaption><img src="{shot["uri"]}" '
            f'alt="{caption}" data-name="{text(shot["name"])}" width="{width * zoom}" height="{height * zoom}">'
            "</figure>"
        )
    return "\n".join(parts)


# Class colours of the masks in the viewer (truth and predictions of scans without a picture): background light,
# then distinct hues; the ignore index grey.
CLASS_COLOURS = [(245, 245, 245), (31, 111, 209), (224, 123, 0), (44, 160, 44), (200, 40, 40), (148, 103, 189)]


def class_filter(class_count: int, ignore_index: int) -> str:
    """An SVG filter that shows a mask of class ids (8-bit, one channel) in class colours: each channel's value
    v / 255 falls in the v-th of 256 equal steps of a discrete transfer table. The browser applies it without
    any script reading the image's pixels, which a page opened from the file system may not do."""
    table = [(128, 128, 128)] * 256  # values that are no class: mid grey
    for k in range(min(class_count, 255)):
        table[k] = CLASS_COLOURS[k % len(CLASS_COLOURS)]
    if 0 <= ignore_index < 256:
        table[ignore_index] = (190, 190, 190)
    funcs = "".join(
        f'<feFunc{channel} type="discrete" tableValues="{" ".join(f"{c[i] / 255:.4f}" for c in table)}"/>'
        for i, channel in enumerate("RGB")
    )
    return (
        '<svg width="0" height="0" style="position:absolute"><filter id="class-colours" '
        f'color-interpolation-filters="sRGB"><feComponentTransfer>{funcs}</feComponentTransfer></filter></svg>'
    )


VIEWER = (
    '<div id="viewer" role="dialog"><div class="bar"><span class="title" id="viewer-title"></span>'
    '<span id="zoom"></span><button id="out">\u2212</button><button id="in">+</button><button id="one">1:1</button>'
    '<button id="fit">fit</button><button id="close">close (Esc)</button></div>'
    '<div id="stage"><div id="content"></div></div></div>'
)


def filters_html(columns: list[dict]) -> str:
    """The scan table's filters: a name's part, the status, and a threshold on any figure."""
    figures = "".join(f'<option value="{text(c["key"])}">{text(c["label"])}</option>' for c in columns if c["num"])
    return (
        '<div class="filters"><label>name <input id="f-name" type="search" placeholder="part of a name"></label>'
        '<label>status <select id="f-status"><option value="">any</option><option>ok</option>'
        '<option>failed</option></select></label><label><select id="f-metric"><option value="">figure</option>'
        f'{figures}</select> <select id="f-op"><option value="below">at most</option><option value="above">at least'
        '</option></select> <input id="f-limit" type="number" step="0.05"></label><span id="count"></span>'
        '<button id="more">show more</button></div>'
    )


def write_html(out_dir: Path, document: dict, table: list[dict], pictures: list[dict], **view) -> None:
    """report.html: every section of the module docstring, one page. ``view``: ``sources`` ({scan: {"scan",
    "truth", "A", "B": path relative to ``out_dir``}}, for the viewer of scans without a picture) and
    ``page_width`` (px the worst scans' strips fill at most)."""
    names, models, tolerance = document["classes"], document["models"], document["options"]["tolerance"]
    data = page_data(document, table, pictures, view.get("sources", {}))
    about = " \u00b7 ".join(
        [f"data {document['data']}", f"{len(table)} scans", f"tolerance {tolerance} px"]
        + [f"{m['name']}: {m['source']} (model {m['fingerprint'] or '-'})" for m in models]
    )
    sections = [
        f"<h1>srforge-evaluate</h1><p class=about>{text(about)}</p>",
        headline_html(document, table),
        '<h2>Per scan</h2><div class="plots" id="plots"></div><p class=about id="tip">Hover a mark for its scan, '
        "click it to see the scan.</p>",
        f"<h2>Per class</h2>{classes_html(models, names, tolerance)}{own_scans_html(document)}",
        f"<h2>By width third</h2>{thirds_html(models, tolerance)}{own_scans_html(document)}",
        *(f"<h2>Confusion matrix ({text(m['name'])}, pixels)</h2>{confusion_html(m, names)}" for m in models),
        f"<h2>Scans ({len(table)})</h2>{filters_html(data['columns'])}"
        '<div class="boxed"><table id="scans"><thead></thead></table></div>',
        f"<h2>The {len({shot['name'] for shot in pictures})} worst scans</h2>",
        worst_html(pictures, view.get("page_width", 1200)),
    ]
    page = (
        f"{STARTS['report.html'].decode()}\n<html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width"><title>srforge-evaluate</title>'
        f"<style>{STYLE}</style></head><body>\n"
        + "\n".join(sections)
        + f"\n{VIEWER}{class_filter(len(names), document['ignore_index'])}"
        + f'\n<script type="application/json" id="report-data">{json_block(data)}</script>'
        + f"\n<script>{SCRIPT}</script></body></html>\n"
    )
    atomic_write_text(out_dir / "report.html", page)
