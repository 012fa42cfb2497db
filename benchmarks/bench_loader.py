"""How fast does the host feed the GPU: decoding, the decoded-scan cache, the training loader, prediction's writes?

On full-size synthetic well-log scans (scan 1 of seed 0 at scale 1: 564 x 11,742 px; RGB and L, PNG as
``make_welllog_scans`` writes it and JPEG quality 90), one thread, it measures per scan (median of interleaved
repeats):

- today's ``read_image`` (PIL, its two copies after decoding: ``read_image_pil(...).contiguous()``), the new
  ``read_image`` (libjpeg-turbo for JPEG, pyspng or PIL without the copies for PNG), a cache hit (mapping the entry
  plus the collate's copy into a [C, H, W] batch slot) and the floor: copying the decoded bytes into that slot;
- the training loader (SegmentationFolder through FieldView with the mask check, SizeGroupedBatchSampler,
  AlignedCollate; in the main process, 1 and 2 workers) in scans/s: today's code (both copies, ``torch.unique``
  mask checks), epoch 1 filling ``data.cache``, then epochs that read the cached folder ``--passes`` times: each
  batch collated into a fresh buffer (shared memory inside a worker, as ``default_collate`` does), once with the
  default [C, H, W] cache and collate and once with a channels-last cache and collate (``train.channels_last``);
- prediction's host cost per scan: decoding plus the mask PNG, today's (PIL, level 6) against srforge's mask writer
  (:func:`srforge.predict.mask_png.gray_png`), and the bytes and milliseconds of every zlib level of PIL's writer
  on the scan's mask;
- labels from an annotation tool (``--annotations``): the same scans as a COCO export (each class one uncompressed
  RLE) read by ``CocoExport``, epoch 1 filling ``data.cache`` (the masks rasterised once) and epoch 2 from it,
  against the scans with mask PNGs (SegmentationFolder) through the same cache: epoch 2's time ratio (goal <= 1.2x);
- a projection for a 16-core machine (14 workers, each at one worker's best epoch-2 rate) against an estimated GPU
  step per scan.

    python benchmarks/bench_loader.py [--scans 10] [--repeats 5] [--passes 4] [--out FILE.json]
    python benchmarks/bench_loader.py --annotations [--scans 10] [--passes 4]     (the annotation row alone)
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import srforge.data.cache as cache_module  # noqa: E402
import srforge.data.datasets as datasets  # noqa: E402
import srforge.data.field_view as adapter  # noqa: E402
from srforge.data.cache import DecodedCache  # noqa: E402
from srforge.data.collate import AlignedCollate  # noqa: E402
from srforge.data.images import read_image, read_image_pil  # noqa: E402
from srforge.data.sampling import SizeGroupedBatchSampler  # noqa: E402
from srforge.predict.mask_png import gray_png  # noqa: E402
from srforge.synthetic import make_welllog_scans, welllog_scan  # noqa: E402

# An estimate, not a measurement: FLOPs of one padded pixel fwd+bwd for the base-32 UNet (docs/performance.md
# measured 342.1 k for base 16; channels double, FLOPs about 4x), at a sustained bf16 rate of an H200-class GPU.
FLOPS_PER_PIXEL = 4 * 342.1e3
GPU_FLOPS = 300e12  # about 30% of an H200's dense bf16 peak
MEAN_PIXELS = 560 * 8_000  # the mean full-size scan (heights 480-640, widths 3,200-12,800)


def today_read_image(path, mode="RGB"):
    """read_image as it was: PIL, then a copy and a transposing copy to a contiguous [C, H, W]."""
    return read_image_pil(path, mode).contiguous()


def today_invalid_mask_values(mask, num_classes, ignore_index):
    values = torch.unique(mask)
    bad = values[((values < 0) | (values >= num_classes)) & (values != ignore_index)]
    return [int(v) for v in bad.tolist()]


def timed(jobs: dict, repeats: int) -> dict:
    """{name: median ms} of each job, the jobs run in turn ``repeats`` times (after one warm-up each)."""
    times = {name: [] for name in jobs}
    for job in jobs.values():
        job()
    for _ in range(repeats):
        for name, job in jobs.items():
            start = time.perf_counter()
            job()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(ts) for name, ts in times.items()}


def scan_files(folder: Path) -> tuple[dict, np.ndarray]:
    """The full-size scan as RGB and L, PNG and JPEG files; {label: path} and its mask."""
    image, mask = welllog_scan(1, seed=0, scale=1.0)
    files = {}
    for mode in ("RGB", "L"):
        picture = Image.fromarray(image).convert(mode)
        for fmt, options in (("png", {"compress_level": 1}), ("jpg", {"quality": 90})):
            files[f"{mode} {fmt}"] = folder / f"scan_{mode}.{fmt}"
            picture.save(files[f"{mode} {fmt}"], **options)
    return files, mask


def decode_rows(files: dict, root: Path, repeats: int) -> list[dict]:
    rows = []
    cache = DecodedCache(root / "decode-cache")
    for label, path in files.items():
        mode = label.split()[0]
        cache.read_image(path, mode)
        decoded = read_image(path, mode)
        slot = torch.empty(decoded.shape, dtype=torch.uint8)  # a batch slot, as AlignedCollate's default makes it
        source = decoded.contiguous()  # decoded bytes in memory, in the cache's default layout
        ms = timed(
            {
                "today": lambda: today_read_image(path, mode),
                "new": lambda: read_image(path, mode),
                "hit": lambda: slot.copy_(cache.read_image(path, mode)),
                "floor": lambda: slot.copy_(source),
            },
            repeats,
        )
        ms["speedup"], ms["hit_over_floor"] = ms["today"] / ms["new"], ms["hit"] / ms["floor"]
        rows.append({"scan": label, **ms})
    return rows


def loader_rate(
    root: Path, workers: int, cache, today: bool = False, channels_last: bool = False, passes: int = 1
) -> float:
    """Scans per second of one training epoch (batches of 2; the folder read ``passes`` times), from the first batch
    to the last."""
    saved = (cache_module.read_image, datasets.invalid_mask_values, adapter.invalid_mask_values)
    if today:
        cache_module.read_image = today_read_image  # SegmentationFolder's reads go through cache_module
        datasets.invalid_mask_values = adapter.invalid_mask_values = today_invalid_mask_values
    try:
        folder = datasets.SegmentationFolder(root, num_classes=2)
        view = adapter.FieldView(folder, num_classes=2, cache=cache)
        sampler = SizeGroupedBatchSampler(folder.sizes(), batch_size=2, shuffle=True, seed=0)
        collate = AlignedCollate(32, channels_last=channels_last)
        loader = DataLoader(view, batch_sampler=list(sampler) * passes, collate_fn=collate, num_workers=workers)
        iterator = iter(loader)
        first = next(iterator)
        start, count = time.perf_counter(), 0
        for batch in iterator:
            count += batch.image.shape[0]
        del first
        return count / (time.perf_counter() - start)
    finally:
        cache_module.read_image, datasets.invalid_mask_values, adapter.invalid_mask_values = saved


def dataset_rate(dataset, workers: int, cache, passes: int = 1) -> float:
    """Scans per second of one epoch over any dataset with sizes(), as :func:`loader_rate` measures a folder."""
    view = adapter.FieldView(dataset, num_classes=2, cache=cache)
    sampler = SizeGroupedBatchSampler(dataset.sizes(), batch_size=2, shuffle=True, seed=0)
    loader = DataLoader(view, batch_sampler=list(sampler) * passes, collate_fn=AlignedCollate(32), num_workers=workers)
    iterator = iter(loader)
    next(iterator)
    start, count = time.perf_counter(), 0
    for batch in iterator:
        count += batch.image.shape[0]
    return count / (time.perf_counter() - start)


def coco_of(folder: Path) -> Path:
    """The mask folder ``folder`` as a COCO export beside it: each class of each mask one uncompressed RLE."""
    images, annotations = [], []
    for i, path in enumerate(sorted((folder / "masks").glob("*.png"))):
        mask = np.asarray(Image.open(path))
        images.append({"id": i, "file_name": path.name, "height": mask.shape[0], "width": mask.shape[1]})
        for c in range(1, int(mask.max()) + 1):
            flat = (mask == c).T.ravel()
            edges = np.flatnonzero(np.diff(flat.astype(np.int8))) + 1
            bounds = np.concatenate([[0], edges, [flat.size]])
            counts = ([0] if flat[0] else []) + np.diff(bounds).tolist()
            rle = {"counts": counts, "size": list(mask.shape)}
            annotations.append({"id": len(annotations), "image_id": i, "category_id": c, "segmentation": rle})
    document = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "curve"}]}
    out = folder / "instances.json"
    out.write_text(json.dumps(document))
    return out


def annotation_rows(root: Path, scans: int, passes: int) -> list[dict]:
    """Epoch 1 (filling data.cache) and epoch 2 (from it) of the same scans with mask PNGs and as a COCO export,
    in the main process; epoch 2's time ratio, export / PNG."""
    from srforge.data.annotations import CocoExport

    folder = root / "train"
    if not (folder / "masks").is_dir():
        make_welllog_scans(folder, scans, scale=1.0, workers=1)
    export = CocoExport(coco_of(folder), ["background", "curve"], images=folder / "images")
    rows = []
    for label, dataset in (("mask PNGs", datasets.SegmentationFolder(folder)), ("COCO export", export)):
        cache = DecodedCache(root / f"annotation-cache-{len(rows)}")
        row = {"labels": label, "epoch1": dataset_rate(dataset, 0, cache)}
        row["epoch2"] = dataset_rate(dataset, 0, cache, passes)
        rows.append(row)
    ratio = rows[0]["epoch2"] / rows[1]["epoch2"]
    print("\n| labels | epoch 1 scans/s (cache filling) | epoch 2 scans/s (data.cache) |\n| --- | --- | --- |")
    for r in rows:
        print(f"| {r['labels']} | {r['epoch1']:.2f} | {r['epoch2']:.1f} |")
    print(f"\nepoch 2 time, COCO export / mask PNGs: {ratio:.2f}x (goal <= 1.2x)")
    return [*rows, {"epoch2_time_ratio": ratio}]


def loader_rows(root: Path, scans: int, passes: int) -> list[dict]:
    """Per worker count: today's epoch, epoch 1 filling the cache (one pass), then epochs of ``passes`` passes over
    the cached folder: fresh batch buffers, with the default cache and collate and with channels-last ones."""
    make_welllog_scans(root / "train", scans, scale=1.0, workers=1)
    rows = []
    for workers in (0, 1, 2):
        cache = DecodedCache(root / f"loader-cache-{workers}")
        row = {"workers": workers, "today": loader_rate(root / "train", workers, None, today=True)}
        row["epoch1"] = loader_rate(root / "train", workers, cache)
        row["epoch2"] = loader_rate(root / "train", workers, cache, passes=passes)
        pixels = DecodedCache(root / f"loader-cache-{workers}-cl", channels_last=True)
        loader_rate(root / "train", workers, pixels, channels_last=True)  # fills the channels-last entries
        row["epoch2_channels_last"] = loader_rate(root / "train", workers, pixels, channels_last=True, passes=passes)
        rows.append(row)
    return rows


def encode_mask(mask: np.ndarray, **options) -> int:
    buffer = io.BytesIO()
    Image.fromarray(mask, "L").save(buffer, format="PNG", **options)
    return len(buffer.getvalue())


def prediction_rows(files: dict, mask: np.ndarray, repeats: int) -> tuple[list[dict], list[dict]]:
    levels = {f"level {n}": {"compress_level": n} for n in range(1, 10)}
    levels["level 1, Z_RLE"] = {"compress_level": 1, "compress_type": zlib.Z_RLE}
    jobs = {name: lambda o=o: encode_mask(mask, **o) for name, o in levels.items()}
    ours = "srforge's gray_png (no row filter, level 1, Z_RLE)"
    jobs[ours] = lambda: len(gray_png(mask))
    ms = timed(jobs, repeats)
    table = [{"setting": name, "bytes": job(), "ms": ms[name]} for name, job in jobs.items()]
    rows = []
    for label in ("RGB png", "RGB jpg"):
        path = files[label]
        cost = timed(
            {
                "today": lambda: (today_read_image(path), encode_mask(mask, compress_level=6)),
                "new": lambda: (read_image(path), gray_png(mask)),
            },
            repeats,
        )
        rows.append({"scan": label, **cost, "ratio": cost["new"] / cost["today"]})
    return table, rows


def report(decode: list, loader: list, levels: list, predict: list) -> dict:
    print("| scan | today's read_image ms | new decode ms | speedup | cache hit ms | memcpy floor ms | hit / floor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in decode:
        print(f"| {r['scan']} | {r['today']:.1f} | {r['new']:.1f} | {r['speedup']:.2f}x | {r['hit']:.2f} | "
              f"{r['floor']:.2f} | {r['hit_over_floor']:.2f}x |")  # fmt: skip
    print("\n| workers | today scans/s | epoch 1 (cache filling) | epoch 2 (cache) | epoch 2, channels-last |")
    print("| --- | --- | --- | --- | --- |")
    for r in loader:
        print(f"| {r['workers']} | {r['today']:.2f} | {r['epoch1']:.2f} | {r['epoch2']:.1f} "
              f"({r['epoch2'] / r['today']:.1f}x) | {r['epoch2_channels_last']:.1f} "
              f"({r['epoch2_channels_last'] / r['today']:.1f}x) |")  # fmt: skip
    print("\n| mask PNG setting | bytes | ms |\n| --- | --- | --- |")
    for r in levels:
        print(f"| {r['setting']} | {r['bytes']:,} | {r['ms']:.1f} |")
    print("\n| prediction host cost (decode + mask PNG) | today ms | new ms | new / today |\n| --- | --- | --- | --- |")
    for r in predict:
        print(f"| {r['scan']} | {r['today']:.1f} | {r['new']:.1f} | {r['ratio']:.2f}x |")
    one = next(r for r in loader if r["workers"] == 1)
    per_worker = max(one["epoch2"], one["epoch2_channels_last"])
    gpu_ms = FLOPS_PER_PIXEL * MEAN_PIXELS / GPU_FLOPS * 1e3
    projection = {"scans_per_s_14_workers": 14 * per_worker, "gpu_ms_per_scan_estimate": gpu_ms}
    print(f"\nProjection (an estimate): 14 workers at epoch 2 deliver about {14 * per_worker:,.0f} scans/s (today "
          f"{14 * one['today']:.0f}); a base-32 UNet step is about {gpu_ms:.0f} ms a mean full-size scan on an "
          f"H200-class GPU ({FLOPS_PER_PIXEL / 1e6:.2f} MFLOP per padded pixel at {GPU_FLOPS / 1e12:.0f} TFLOP/s), "
          f"so the GPU takes about {1e3 / gpu_ms:.0f} scans/s.")  # fmt: skip
    return projection


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scans", type=int, default=10, help="full-size scans in the training folder")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--passes", type=int, default=4, help="reads of the folder in a cached epoch (a longer "
                        "epoch measures the loader past its workers' start)")  # fmt: skip
    parser.add_argument("--out", default="benchmarks/results/bench_loader.json")
    parser.add_argument("--annotations", action="store_true", help="measure the annotation-export row alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.annotations:
        with tempfile.TemporaryDirectory() as tmp:
            annotation_rows(Path(tmp), args.scans, args.passes)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        files, mask = scan_files(root)
        decode = decode_rows(files, root, args.repeats)
        levels, predict = prediction_rows(files, mask, args.repeats)
        loader = loader_rows(root, args.scans, args.passes)
    projection = report(decode, loader, levels, predict)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"decode": decode, "loader": loader, "mask_png": levels, "predict": predict,
                               "projection": projection}, indent=2))  # fmt: skip
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
