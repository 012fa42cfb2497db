"""Batched inference and crop-back: scans of any size in, class maps of exactly their size out.

    scans -> sizes from headers -> size-grouped batches under a pixel budget -> AlignedCollate(size_divisor)
        -> UNet(image, sizes) -> softmax -> crop_to_sizes -> class maps [H, W]

A scan whose aligned size alone exceeds the budget goes through tiled inference (srforge.engine.tiling).
:func:`predict_archive` runs a Predictor over a ScanArchive and writes, under the output folder::

    masks/<rel>.png           class ids, uint8 PNG mode 'L', exactly the scan's (H, W)
    overlays/<rel>.png        the scan with every non-background class drawn over it     (overlay=True)
    probabilities/<rel>.npy   float16 [K, H, W] softmax probabilities (np.load)           (probabilities=True)
    report.json, report.csv   per scan: name, status, size, error, class pixel fractions, milliseconds

<rel> is the member's relative path without its suffix. Every file is written to a hidden temporary name
in its folder and renamed over the final name (os.replace), so a kill never leaves a truncated output; a
rerun treats a scan as done when each of its outputs decodes and has the scan's size, and removes the
temporaries a killed run left behind.
"""

from __future__ import annotations

import csv
import io
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.utils import draw_segmentation_masks
from tqdm import tqdm

from srforge.atomic import atomic_write, atomic_write_text, remove_stale_temporaries
from srforge.data.archive import ScanArchive
from srforge.data.collate import AlignedCollate
from srforge.data.images import DataError
from srforge.data.naming import scan_stem
from srforge.data.sampling import SizeGroupedBatchSampler
from srforge.defaults import PRECISIONS
from srforge.engine.checkpoint import (
    class_names_or_default,
    load_checkpoint,
    model_from_checkpoint,
)
from srforge.engine.device import autocast, resolve_device
from srforge.engine.metrics import class_map
from srforge.engine.tiling import predict_tiled, tile_shape
from srforge.geometry import crop_to_sizes, round_up

# Pixels per batch (n * Hp * Wp); a scan over it alone is tiled. On a GPU batching fills the device (a full-scale
# 640 x 12,800 scan fits). On CPU batches are slower per scan than one scan at a time (benchmarks/bench_predict.py,
# 40 scans at 1/8 scale on 2 cores: 0.53x the batch-1 loop at a 4 Mpx budget, 0.82x at 1 Mpx): there the default
# batch is one scan and the budget only bounds memory (a full-scale 640 x 6,400 scan fits; wider ones are tiled).
DEFAULT_MAX_PIXELS = {"cpu": 2**22, "cuda": 2**24}
DEFAULT_MAX_BATCH = {"cpu": 1, "cuda": None}
POOL = 32  # scans read ahead together from an archive without random access (.tar.gz)
_COLORS = [
    (230, 25, 75),
    (60, 180, 75),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
    (240, 50, 230),
    (210, 245, 60),
    (250, 190, 212),
    (0, 128, 128),
]
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


# -- outputs ---------------------------------------------------------------------------------------
def read_complete(path: Path, size: tuple[int, int], mode: str) -> np.ndarray | None:
    """The image at path as an array if it decodes fully, in PIL ``mode``, at ``size`` (H, W); else None."""
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode != mode or image.size != (size[1], size[0]):
                return None
            return np.asarray(image)
    except (OSError, ValueError, SyntaxError):
        return None


def _npy_complete(path: Path, shape: tuple[int, ...]) -> bool:
    try:
        return np.load(path, mmap_mode="r").shape == shape
    except (OSError, ValueError):
        return False


def class_fractions(mask: torch.Tensor, num_classes: int) -> list[float]:
    """Fraction of the pixels of ``mask`` [H, W] in each class, [K] summing to 1."""
    counts = torch.bincount(mask.flatten(), minlength=num_classes)[:num_classes]
    return [round(float(c) / mask.numel(), 6) for c in counts]


def draw_overlay(image: torch.Tensor, mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """The scan [C, H, W] uint8 as RGB with classes 1..K-1 of ``mask`` [H, W] drawn at half opacity -> [3, H, W]."""
    rgb = image[:3] if image.shape[0] >= 3 else image[:1].expand(3, -1, -1)
    if image.is_floating_point():
        rgb = (rgb.clamp(0, 1) * 255).round().to(torch.uint8)
    classes = torch.arange(1, num_classes)[:, None, None]
    colors = [_COLORS[(c - 1) % len(_COLORS)] for c in range(1, num_classes)]
    return draw_segmentation_masks(rgb, mask[None] == classes, alpha=0.5, colors=colors)


def _save_png(array: np.ndarray, mode: str) -> Callable[[Any], None]:
    return lambda f: Image.fromarray(array, mode).save(f, format="PNG")


def output_paths(out_dir: Path, name: str) -> dict[str, Path]:
    """Where scan ``name`` (a safe relative path) writes each output."""
    stem = scan_stem(name)  # the key ScanArchive checks for clashes: scan.v1.tif and scan.v2.tif stay apart
    return {
        "mask": out_dir / "masks" / f"{stem}.png",
        "overlay": out_dir / "overlays" / f"{stem}.png",
        "probabilities": out_dir / "probabilities" / f"{stem}.npy",
    }


def write_report(out_dir: Path, rows: list[dict], summary: dict, class_names: Sequence[str]) -> None:
    """report.json ({"summary", "scans"}) and report.csv (one row a scan, ``frac_<class>`` columns)."""
    text = json.dumps({"summary": summary, "scans": rows}, indent=1)
    atomic_write_text(out_dir / "report.json", text)
    buffer = io.StringIO()
    fields = ["name", "status", "height", "width", "ms", "error"] + [f"frac_{c}" for c in class_names]
    writer = csv.DictWriter(buffer, fields)
    writer.writeheader()
    for row in rows:
        fractions = dict(zip(fields[6:], row["fractions"] or []))
        writer.writerow({**{k: row[k] for k in fields[:6]}, **fractions})
    atomic_write_text(out_dir / "report.csv", buffer.getvalue())


def _row(name, status, size=None, error=None, fractions=None, ms=None) -> dict:
    height, width = size if size is not None else (None, None)
    return {
        "name": name,
        "status": status,
        "height": height,
        "width": width,
        "error": error,
        "fractions": fractions,
        "ms": None if ms is None else round(ms, 2),
    }


def _done(paths: dict[str, Path], size: tuple[int, int], k: int, wanted: Sequence[str]) -> torch.Tensor | None:
    """The finished mask int64 [H, W] when every wanted output of a scan is complete, else None."""
    mask = read_complete(paths["mask"], size, "L")
    if mask is None or ("overlay" in wanted and read_complete(paths["overlay"], size, "RGB") is None):
        return None
    if "probabilities" in wanted and not _npy_complete(paths["probabilities"], (k, *size)):
        return None
    return torch.from_numpy(mask.astype(np.int64))


def predict_archive(
    predictor: Predictor,
    archive: ScanArchive,
    out_dir,
    overlay: bool = False,
    probabilities: bool = False,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Predict every scan of ``archive`` into ``out_dir`` (layout in the module docstring); returns the summary.

    Statuses: ok (predicted now), skipped (complete outputs found, ``overwrite=False``), failed (unreadable
    scan or a failed batch; the error says which), rejected (a member ScanArchive refused). Each bad scan is
    reported and the rest still run; ``strict`` stops at the first failed or rejected scan.
    """
    out_dir = Path(out_dir)
    start = time.perf_counter()
    remove_stale_temporaries(out_dir)
    k, wanted = predictor.num_classes, ["mask"] + ["overlay"] * overlay + ["probabilities"] * probabilities
    rows = [_row(name, "rejected", error=reason) for name, reason in archive.rejected]
    stop = strict and bool(rows)
    todo, sizes = [], {}
    bar = tqdm(total=len(archive), unit="scan", desc="predict", disable=not progress, dynamic_ncols=True)
    for i in [] if stop else archive.in_archive_order(range(len(archive))):
        name = archive.names[i]
        try:
            size = archive.size(i)
        except DataError as error:
            rows.append(_row(name, "failed", error=str(error)))
            bar.update()
            if stop := strict:
                break
            continue
        mask = None if overwrite else _done(output_paths(out_dir, name), size, k, wanted)
        if mask is None:
            todo.append(i)
            sizes[i] = size
        else:
            rows.append(_row(name, "skipped", size, fractions=class_fractions(mask, k)))
            bar.update()

    pools = [todo[j : j + POOL] for j in range(0, len(todo), POOL)] if archive.sequential else [todo]
    for pool in [] if stop or not todo else pools:
        data = archive.read_bytes(pool) if archive.sequential else {}
        for batch in predictor.plan([sizes[i] for i in pool]):
            batch_start = time.perf_counter()
            images, ready = [], []
            for i in (pool[j] for j in batch):
                try:
                    images.append(archive.read(i, predictor.image_mode, data.pop(i, None)))
                    ready.append(i)
                except DataError as error:
                    rows.append(_row(archive.names[i], "failed", sizes[i], error=str(error)))
                    stop = stop or strict
            try:
                outputs = predictor.outputs(images) if images and not stop else []
            except (RuntimeError, ValueError) as error:  # e.g. out of memory: name the scans, go on
                rows += [_row(archive.names[i], "failed", sizes[i], error=f"inference failed: {error}") for i in ready]
                outputs, stop = [], strict
            ms = (time.perf_counter() - batch_start) * 1000 / max(1, len(batch))
            for i, image, probs in zip(ready, images, outputs):
                mask = class_map(probs, dim=0)
                paths = output_paths(out_dir, archive.names[i])
                atomic_write(paths["mask"], _save_png(mask.to(torch.uint8).numpy(), "L"))
                if overlay:
                    drawn = draw_overlay(image, mask, k).permute(1, 2, 0).contiguous().numpy()
                    atomic_write(paths["overlay"], _save_png(drawn, "RGB"))
                if probabilities:
                    atomic_write(paths["probabilities"], lambda f, p=probs: np.save(f, p.to(torch.float16).numpy()))
                rows.append(_row(archive.names[i], "ok", sizes[i], fractions=class_fractions(mask, k), ms=ms))
            bar.update(len(batch))
            if stop:
                break
        if stop:
            break
    bar.close()

    seconds = time.perf_counter() - start
    counts = {s: sum(r["status"] == s for r in rows) for s in ("ok", "skipped", "failed", "rejected")}
    summary = {
        "scans": len(rows),
        **counts,
        "stopped_early": stop,
        "seconds": round(seconds, 3),
        "scans_per_second": round(counts["ok"] / seconds, 3) if seconds > 0 else None,
        "classes": list(predictor.class_names),
        "input": str(archive.path),
        "output": str(out_dir),
    }
    write_report(out_dir, sorted(rows, key=lambda r: r["name"]), summary, predictor.class_names)
    return summary


class Predictor:
    """A trained UNet ready for inference on scans of any size.

    ``predict(images)`` -> class maps; ``probabilities(images)`` -> softmax maps; both take a list of scans
    [C, H, W] (uint8 0..255, or float 0..1) and return one result a scan at its exact (H, W), computed in
    size-grouped batches of at most ``max_pixels`` padded pixels (default by device: DEFAULT_MAX_PIXELS).
    A scan whose aligned size alone exceeds the budget is tiled, tiles overlapping by ``overlap`` px
    (default 4 * size_divisor). ``max_batch`` caps scans per batch: "auto" (the default) takes the device's
    DEFAULT_MAX_BATCH (1 on CPU, where batching measured slower; no cap on CUDA), None means no cap.
    ``precision``: fp32, bf16 or fp16 (autocast).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        class_names: Sequence[str] | None = None,
        device="cpu",
        precision: str = "fp32",
        max_pixels: int | None = None,
        overlap: int | None = None,
        image_mode: str | None = None,
        max_batch: int | str | None = "auto",
    ):
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}, got {precision!r}")
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()
        self.divisor, self.num_classes = model.size_divisor, model.num_classes
        self.class_names = class_names_or_default(class_names, self.num_classes)
        self.precision = precision
        self.max_pixels = int(max_pixels or DEFAULT_MAX_PIXELS.get(self.device.type, DEFAULT_MAX_PIXELS["cpu"]))
        if self.max_pixels < 4 * self.divisor**2:
            raise ValueError(
                f"max_pixels={self.max_pixels} is below one {2 * self.divisor}x{2 * self.divisor} tile "
                f"(size_divisor {self.divisor}); raise it"
            )
        self.max_batch = DEFAULT_MAX_BATCH.get(self.device.type) if max_batch == "auto" else max_batch
        self.overlap = 4 * self.divisor if overlap is None else int(overlap)
        if self.overlap < 0:
            raise ValueError(f"Tile overlap must be >= 0 px, found {self.overlap}.")
        self.image_mode = image_mode or _MODES.get(model.in_channels)
        if self.image_mode is None:
            raise ValueError(f"no PIL mode for a {model.in_channels}-channel model; pass image_mode")
        self.collate = AlignedCollate(self.divisor, pad={"image": 0})

    @classmethod
    def from_checkpoint(
        cls,
        path,
        device="auto",
        precision: str = "fp32",
        max_pixels: int | None = None,
        overlap: int | None = None,
        max_batch: int | str | None = "auto",
    ) -> Predictor:
        """The Predictor a checkpoint describes: weights, divisor, classes, normalisation, image mode."""
        ckpt = load_checkpoint(path)
        dataset_args = (ckpt.get("config") or {}).get("data", {}).get("dataset", {}).get("args", {})
        return cls(
            model_from_checkpoint(ckpt, path),
            ckpt["class_names"],
            device,
            precision,
            max_pixels,
            overlap,
            dataset_args.get("image_mode"),
            max_batch,
        )

    def plan(self, sizes: Sequence[tuple[int, int]]) -> list[list[int]]:
        """Indices into ``sizes`` grouped into batches under the pixel budget (an oversized scan alone)."""
        if not sizes:
            return []
        batches = SizeGroupedBatchSampler(sizes, max_pixels=self.max_pixels, divisor=self.divisor, shuffle=False)
        step = self.max_batch or len(sizes)
        return [batch[j : j + step] for batch in batches for j in range(0, len(batch), step)]

    def _aligned_area(self, image: torch.Tensor) -> int:
        return int(np.prod([round_up(n, self.divisor) for n in image.shape[-2:]]))

    @torch.inference_mode()
    def run_batch(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        """One padded batch, no budget check: scans [C, H_i, W_i] -> probabilities float32 [K, H_i, W_i] (CPU)."""
        batch = self.collate([{"image": image} for image in images])
        image, sizes = batch["image"].to(self.device), batch["sizes"].to(self.device)
        with autocast(self.device, self.precision):
            logits = self.model(image, sizes)
        probs = logits.float().softmax(1).cpu()
        return crop_to_sizes(probs, sizes.cpu())

    def outputs(self, images: list[torch.Tensor]) -> list[torch.Tensor]:
        """Probabilities of one planned batch: padded together, or one scan over the budget, tiled."""
        if len(images) == 1 and self._aligned_area(images[0]) > self.max_pixels:
            image = images[0]
            tile = tile_shape(*image.shape[-2:], self.max_pixels, self.divisor)
            return [
                predict_tiled(
                    self.run_batch,
                    image,
                    tile,
                    self.overlap,
                    self.divisor,
                    max(1, self.max_pixels // (tile[0] * tile[1])),
                )
            ]
        return self.run_batch(images)

    def _check(self, images: Sequence[torch.Tensor]) -> None:
        for i, image in enumerate(images):
            channels = self.model.in_channels
            if not isinstance(image, torch.Tensor) or image.ndim != 3 or image.shape[0] != channels:
                found = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
                raise ValueError(f"Predictor: image {i} must be a tensor [{channels}, H, W], found {found}")
            if image.dtype != torch.uint8 and not image.is_floating_point():
                raise TypeError(f"Predictor: image {i} is {image.dtype}; give uint8 (0..255) or float (0..1)")

    def probabilities(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Softmax probabilities float32 [K, H_i, W_i] for scans [C, H_i, W_i], in the order given."""
        self._check(images)
        out: list[torch.Tensor | None] = [None] * len(images)
        for batch in self.plan([tuple(image.shape[-2:]) for image in images]):
            for i, probs in zip(batch, self.outputs([images[i] for i in batch])):
                out[i] = probs
        return out

    def predict(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Class maps int64 [H_i, W_i] for scans [C, H_i, W_i] (uint8, or float in [0, 1])."""
        return [class_map(probs, dim=0) for probs in self.probabilities(images)]
