"""From rows to results: micro (pixels pooled over the scans), macro (the mean over scans of each scan's figure),
and both again for each width third (the narrowest, middle and widest third of the scored scans); with two models,
the micro figures of each over the scans both scored (both_scored), so that they are compared on the same scans.

Micro weighs every pixel alike, so wide scans count most; macro weighs every scan alike. A figure undefined for a
scan (NaN: a class absent from both its masks) is left out of that figure's macro mean.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from srforge.evaluate.metrics import figures, nanmean

THIRDS = ("narrowest", "middle", "widest")


def scored(rows: list[dict]) -> list[dict]:
    return [row for row in rows if row["status"] == "ok"]


def with_figures(rows: list[dict], class_names) -> list[dict]:
    """``rows`` with each scored row's ``figures`` (srforge.evaluate.metrics.figures of its own counts)."""
    for row in scored(rows):
        if "figures" not in row:
            row["figures"] = figures(torch.tensor(row["confusion"]), torch.tensor(row["tolerance"]), class_names)
    return rows


def micro(rows: list[dict], class_names) -> dict[str, Any]:
    """Figures of the counts of ``rows`` pooled (NaN figures where no row is scored)."""
    k = len(class_names)
    confusion, tolerance = torch.zeros(k, k, dtype=torch.int64), torch.zeros(k, 4, dtype=torch.int64)
    for row in scored(rows):
        confusion += torch.tensor(row["confusion"])
        tolerance += torch.tensor(row["tolerance"])
    return {**figures(confusion, tolerance, class_names), "confusion_matrix": confusion.tolist()}


def macro(rows: list[dict], class_names) -> dict[str, Any]:
    """The mean over scored ``rows`` of each figure, per class too (rows need ``figures``)."""
    rows = scored(rows)
    if not rows:
        return {}
    first = rows[0]["figures"]
    out: dict[str, Any] = {key: nanmean(row["figures"][key] for row in rows) for key in first if key != "per_class"}
    out["per_class"] = {
        figure: {name: nanmean(row["figures"]["per_class"][figure][name] for row in rows) for name in class_names}
        for figure in first["per_class"]
    }
    return out


def width_thirds(rows: list[dict]) -> list[list[dict]]:
    """The scored rows in three groups by width (ties by name), sizes differing by one at most."""
    ordered = sorted(scored(rows), key=lambda row: (row["width"], row["name"]))
    n = len(ordered)
    cuts = [0, n // 3 + (n % 3 > 0), 2 * (n // 3) + (n % 3 > 0) + (n % 3 > 1), n]
    return [ordered[cuts[t] : cuts[t + 1]] for t in range(3)]


def results(rows: list[dict], class_names) -> dict[str, Any]:
    """Every aggregate of ``rows``: counts of scans, micro, macro, and both by width third."""
    rows = with_figures(rows, class_names)
    thirds = []
    for name, group in zip(THIRDS, width_thirds(rows)):
        widths = [row["width"] for row in group]
        thirds.append(
            {
                "third": name,
                "scans": len(group),
                "widths": [min(widths), max(widths)] if widths else None,
                "micro": micro(group, class_names),
                "macro": macro(group, class_names),
            }
        )
    return {
        "scans": len(rows),
        "scored": len(scored(rows)),
        "failed": len(rows) - len(scored(rows)),
        "micro": micro(rows, class_names),
        "macro": macro(rows, class_names),
        "by_width_third": thirds,
    }


def both_scored(rows_a: list[dict], rows_b: list[dict], class_names) -> dict[str, Any]:
    """Two models measured on the same scans: the micro figures of A (``micro_a``) and of B (``micro_b``) over the
    scans both scored, B - A of each (``difference_b_minus_a``), how many those are (``scans``) and how many each
    scored besides (``a_only``, ``b_only``). Each model's own micro pools only the scans it scored, so a model that
    fails on the hard scans would look better for it; these pool the same per-scan counts over the same scans."""
    ok_a = {row["name"]: row for row in scored(rows_a)}
    ok_b = {row["name"]: row for row in scored(rows_b)}
    both = [name for name in ok_a if name in ok_b]
    a = micro([ok_a[name] for name in both], class_names)
    b = micro([ok_b[name] for name in both], class_names)
    return {
        "scans": len(both),
        "a_only": len(ok_a) - len(both),
        "b_only": len(ok_b) - len(both),
        "micro_a": a,
        "micro_b": b,
        "difference_b_minus_a": {key: b[key] - a[key] for key in a if isinstance(a[key], float)},
    }


def scored_apart(both: dict[str, Any] | None) -> bool:
    """Whether two models scored different scans (``both``: :func:`both_scored`'s, or None with one model)."""
    return bool(both) and (both["a_only"] > 0 or both["b_only"] > 0)


def json_safe(value):
    """``value`` with every NaN float as None (JSON has no NaN), recursively."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value
