"""An evaluation run: predict (checkpoint mode) or take predictions, score every scan, write metrics.json,
scans.csv, report.html and the worst scans' pictures.

Under the output folder::

    predictions/     checkpoint mode: srforge-predict's output for the model (masks/, report.json); a rerun
                     skips the scans this model has predicted already
    predictions-b/   the same for --compare CKPT_B
    metrics.json     every aggregate, each model's fingerprint, the data, the options; with --compare also
                     "both_scored" (srforge.evaluate.aggregate.both_scored): A's and B's micro figures and B - A
                     over the scans both scored, which the page's headline shows, and how many each scored besides
                     (each model's own "results" and "difference_b_minus_a" pool the scans each one scored)
    scans.csv        one row a scan
    report.html      the page to look at (srforge.evaluate.report); pictures/ its full-size pictures

Checkpoint mode predicts through srforge.predict.pipeline.predict_archive, the code srforge-predict runs
(size-grouped batches under the pixel budget, tiling, decoding workers, torchrun sharding, one merged report), so
a score is the score of what srforge-predict writes. The output folder holds nothing else: a folder with other
files is refused (OutputError), as are files of those names srforge-evaluate did not write.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from srforge.atomic import NAME_MAX, TEMP_SUFFIX, atomic_write
from srforge.data.naming import scan_stem
from srforge.evaluate.aggregate import both_scored, results, scored
from srforge.evaluate.inputs import LabelledArchive, MaskFolder, Predictions
from srforge.evaluate.metrics import primary
from srforge.evaluate.pictures import picture, png_bytes
from srforge.evaluate.report import (
    STARTS,
    label,
    png_data_uri,
    scan_columns,
    scan_table,
    write_html,
    write_metrics,
    write_scans,
)
from srforge.evaluate.scoring import Scorer, failed_row, one_host_thread, score_scans
from srforge.locks import LOCK_NAME
from srforge.predict.folders import OutputError, check_output, check_reports, hold_output, prepare_output
from srforge.predict.pipeline import predict_archive
from srforge.runtime import distributed

MODEL_FOLDERS = ("predictions", "predictions-b")
OWN = {*STARTS, "pictures", *MODEL_FOLDERS, LOCK_NAME}
PAGE_WIDTH = 1200  # px: wider pictures are shrunk for the page, linked at full size
PICTURE_THREADS = 2


def check_evaluation_output(out_dir: Path, inputs: list[Path]) -> None:
    """OutputError when ``out_dir`` overlaps an input (srforge.predict.folders.check_output), holds anything but
    what srforge-evaluate writes, or holds a metrics.json / scans.csv / report.html srforge-evaluate did not write."""
    for source in inputs:
        check_output(out_dir, source)
    if not out_dir.is_dir():
        return
    others = sorted(p.name for p in out_dir.iterdir() if p.name not in OWN and not p.name.endswith(TEMP_SUFFIX))
    if others:
        raise OutputError(
            f"--output {out_dir} holds files srforge-evaluate did not write ({', '.join(others[:5])}"
            f"{', ...' if len(others) > 5 else ''}); it writes only {', '.join(sorted(OWN - {LOCK_NAME}))} there. "
            "Choose an empty or new folder"
        )
    check_reports(out_dir, STARTS)


def predict_for(predictor, truths: LabelledArchive, out_dir: Path, workers: int, progress: bool) -> Predictions:
    """Predict the scans of ``truths`` into ``out_dir`` as srforge-predict does; their Predictions, each scan it
    could not predict with its report's error."""
    predict_archive(predictor, truths.images, out_dir, progress=progress, workers=workers)
    rows = json.loads((out_dir / "report.json").read_text())["scans"]
    failed = {
        scan_stem(row["name"]): f"{truths.images.path}: images/{row['name']} was not predicted ({row['status']}): "
        f"{row['error']}"
        for row in rows
        if row["status"] not in ("ok", "skipped")
    }
    return Predictions(out_dir, failed)


def worst_rows(rows: list[dict], key: str, n: int) -> list[dict]:
    """The ``n`` scored rows of lowest ``key`` figure (undefined: last), ties by name."""
    ranked = sorted(scored(rows), key=lambda r: (math.isnan(r["figures"][key]), r["figures"][key], r["name"]))
    return ranked[:n]


def draw_pictures(out_dir: Path, worst: list[dict], truths, models: list[dict], ignore_index: int) -> list[dict]:
    """pictures/<rank>-<name>[-<model>].png for the worst scans of each model's predictions, full size; returns
    what the page shows of each (caption, file, name, model, the inline strip and the sizes, see _shown).

    The masks and scans are read here, one after another (an archive's reader is not shared between threads);
    colouring, shrinking, encoding and writing run in PICTURE_THREADS threads meanwhile (torch and zlib let go of
    the GIL), so a picture is drawn while the next scan is read; torch's own threads are left out (one_host_thread).
    """
    folder = out_dir / "pictures"
    for old in folder.glob("*.png") if folder.is_dir() else []:
        old.unlink()
    pending = []
    with one_host_thread(), ThreadPoolExecutor(PICTURE_THREADS) as pool:
        for rank, row in enumerate(worst, 1):
            name = row["name"]
            truth = truths.read([name], _Inline())[name]
            image = truths.image(name)
            for model in models:
                pred = model["predictions"].read(name)
                if isinstance(truth, Exception) or isinstance(pred, Exception) or pred.shape != truth.shape:
                    continue
                file = picture_file(rank, name, model["name"])
                figure = model["rows"][name]["figures"] if name in model["rows"] else {}
                value = figure.get(model["primary"], math.nan)
                caption = f"{rank}. {name} ({model['name']}): {label(model['primary'])} {value:.3f}"
                job = (truth, pred, image, ignore_index, out_dir / file)
                shot = {"caption": caption, "file": file, "name": name, "model": model["name"]}
                pending.append((shot, pool.submit(_draw, *job)))
        return [_shown(shot, future) for shot, future in pending]


def picture_file(rank: int, name: str, model: str) -> str:
    """``pictures/<rank>-<name>-<model>.png`` (a scan's folders joined by ``__``); a name too long for that is
    replaced by its digest, so that no scan's name can keep its picture from being written."""
    stem = f"{rank:03d}-{name.replace('/', '__')}-{model}"
    if len(os.fsencode(stem)) + 4 > NAME_MAX:  # a scan's name may come close to the file system's limit
        digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:16]
        stem = f"{rank:03d}-{digest}-{model}"
    return f"pictures/{stem}.png"


def _shown(shot: dict, future) -> dict:
    """What the page shows of one picture: the strip inline (``uri``, its size ``shown`` (w, h)) and the size of
    the full one (``width``, ``height``), or a note saying why it could not be written (the scores and the other
    pictures are kept)."""
    try:
        data, (height, width), (shown_h, shown_w) = future.result()
    except OSError as error:
        return {**shot, "note": f"the picture could not be written ({error.strerror or error})"}
    return {**shot, "uri": png_data_uri(data), "width": width, "height": height, "shown": (shown_w, shown_h)}


def _draw(truth, pred, image, ignore_index: int, path: Path) -> tuple[bytes, tuple, tuple]:
    """Write the full-size picture at ``path``; (the PNG the page shows inline: the shrunk one, or the same; the
    full picture's (H, W); the inline one's (H, W))."""
    full, small = picture(truth, pred, image, ignore_index, PAGE_WIDTH)
    data = png_bytes(full)
    atomic_write(path, lambda f: f.write(data))
    if small is None:
        return data, full.shape, full.shape
    return png_bytes(small), full.shape, small.shape


def source_files(out_dir: Path, truths, models: list[dict]) -> dict[str, dict[str, str]]:
    """{scan: {"scan", "truth", model name: path relative to ``out_dir``}} of the scored scans whose files lie in
    folders (an archive's members cannot be linked), so that the page can show any scan from its files."""
    if isinstance(truths, LabelledArchive):
        if truths.base.kind != "folder":
            return {}
    elif not isinstance(truths, MaskFolder):  # an annotation export: its masks exist only once rasterised
        return {}
    found = {}
    for name in truths.names:
        files = {"truth": truths.label(name)}
        if isinstance(truths, LabelledArchive):
            files["scan"] = truths.images.label(truths.view_index[name])
        elif name in getattr(truths, "scans", {}):
            files["scan"] = str(truths.scans[name])
        for model in models:
            if name in model["predictions"].files and model["rows"].get(name, {}).get("status") == "ok":
                files[model["name"]] = str(model["predictions"].files[name])
        found[name] = {key: _relative(path, out_dir) for key, path in files.items()}
    return found


def _relative(path: str, start: Path) -> str:
    """``path`` relative to ``start`` (the page's folder), or absolute where there is no relative way."""
    try:
        return Path(os.path.relpath(Path(path).absolute(), start.absolute())).as_posix()
    except ValueError:  # another drive
        return Path(path).absolute().as_uri()


class _Inline:
    """An executor's ``map`` run in the calling thread (one mask read for one picture)."""

    @staticmethod
    def map(function, items):
        return map(function, items)


def score_models(truths, models: list[dict], scorer: Scorer, threads: int) -> None:
    """Add ``rows`` (by name) and ``results`` to each model: every scan of ``truths``, and a failed row for each
    unpaired image or mask."""
    for model in models:
        start = time.perf_counter()
        rows = score_scans(truths.names, truths, model["predictions"], scorer, threads)
        rows += [failed_row(name, error) for name, error in truths.unpaired.items()]
        rows.sort(key=lambda row: row["name"])
        model["results"] = results(rows, scorer.class_names)
        model["rows"] = {row["name"]: row for row in rows}
        model["seconds_score"] = round(time.perf_counter() - start, 3)


def write_outputs(out_dir: Path, document: dict, truths, models: list[dict], worst: int) -> None:
    """metrics.json, scans.csv, pictures/ and report.html of scored ``models`` (rank 0)."""
    key = models[0]["primary"]
    rows_a = list(models[0]["rows"].values())
    rows_b = list(models[1]["rows"].values()) if len(models) > 1 else None
    table = scan_table(rows_a, rows_b, key)
    columns = scan_columns(document["classes"], rows_b is not None)
    start = time.perf_counter()
    shots = draw_pictures(out_dir, worst_rows(rows_a, key, worst), truths, models, document["ignore_index"])
    document["run"]["seconds_pictures"] = round(time.perf_counter() - start, 3)
    write_metrics(out_dir, document)
    write_scans(out_dir, table, columns)
    sources = source_files(out_dir, truths, models)
    write_html(out_dir, document, table, shots, sources=sources, page_width=PAGE_WIDTH)


def describe(models: list[dict], data, options: dict[str, Any], scorer: Scorer, seconds: float) -> dict[str, Any]:
    """metrics.json's content: the data, options, classes, each model's source, fingerprint and results, and with
    two models the difference B - A of every summary figure and both models' figures over the scans both scored."""
    document: dict[str, Any] = {
        "data": str(data),
        "options": options,
        "classes": list(scorer.class_names),
        "ignore_index": scorer.ignore,
        "primary": models[0]["primary"],
        "models": [{key: model[key] for key in ("name", "source", "fingerprint", "results")} for model in models],
    }
    if len(models) == 2:
        a, b = (model["results"] for model in models)
        document["difference_b_minus_a"] = {
            kind: {key: b[kind][key] - a[kind][key] for key in a[kind] if isinstance(a[kind][key], float)}
            for kind in ("micro", "macro")
            if a[kind] and b[kind]
        }
        rows_a, rows_b = (list(model["rows"].values()) for model in models)
        document["both_scored"] = both_scored(rows_a, rows_b, scorer.class_names)
    timing = {f"{model['name']}_{k}": model[k] for model in models for k in ("seconds_predict", "seconds_score")}
    document["run"] = {"processes": distributed.environment().world, "seconds": round(seconds, 3), **timing}
    return document


def evaluate(truths, models: list[dict], out_dir: Path, scorer: Scorer, settings: dict[str, Any]) -> dict[str, Any]:
    """Score ``models`` (each {"name", "source", "fingerprint", "predictions"}, or with a "predictor" to predict
    first) on ``truths`` and write the outputs into ``out_dir``; returns metrics.json's content.

    ``settings``: ``worst`` (pictured scans), ``workers`` (decoding processes when predicting, threads when
    reading masks), ``progress``, ``data`` (the input, for the record) and ``options`` (recorded as given). Rank 0
    holds ``out_dir`` for the run; under torchrun every process predicts and scores its share.
    """
    start = time.perf_counter()
    rank = distributed.environment().rank
    with contextlib.ExitStack() as held:
        if rank == 0:
            prepare_output(out_dir)
            held.enter_context(hold_output(out_dir))
        for model, folder in zip(models, MODEL_FOLDERS):
            began = time.perf_counter()
            if model.get("predictor") is not None:
                workers = settings["workers"]
                model["predictions"] = predict_for(
                    model["predictor"], truths, out_dir / folder, workers, settings["progress"]
                )
            model["seconds_predict"] = round(time.perf_counter() - began, 3)
            model["primary"] = primary(len(scorer.class_names))
        score_models(truths, models, scorer, max(2, settings["workers"]))
        document = describe(models, settings["data"], settings["options"], scorer, time.perf_counter() - start)
        if rank == 0:
            write_outputs(out_dir, document, truths, models, settings["worst"])
        distributed.barrier()
    return document
