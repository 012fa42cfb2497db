"""Pictures of the batching: the first batches as the trainer forms them, and the size distribution.

Padding waste is a percentage until one sees it. :func:`batch_layout` splits the sizes and batches the training
side with the trainer's own functions (``train_val_indices``, then ``training_sampler`` at epoch 0, same
seed), and measures every batch in pixels. :func:`draw_batch_layout` draws it with Pillow:

- left, the first batches: each a column of slots ``Hp x Wp`` (the batch maximum of aligned sizes), every scan
  at its true extent in the top-left corner of its slot (blue), its alignment gutter up to the next multiple of
  the divisor (amber), the batch padding up to the batch maximum (red), and a label with the batch's waste;
- right, a 2-D histogram of W against H with the train / validation split coloured (a cell's hue is its
  validation share, its depth its count), lines where sizes cross a multiple of the divisor, the legend and
  the totals: waste of the drawn batches and of the whole epoch, the alignment floor (each scan alone), and
  random batches of the same lengths.

Waste = padded pixels / real pixels - 1. One drawn pixel stands for ``scale x scale`` scan pixels, and every
extent is drawn as ``ceil(extent / scale)``: at scale 1 the colour counts in a batch are its pixel counts, and
at any scale dividing the divisor the slots and gutters end exactly where AlignedCollate's do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from srforge.atomic import atomic_write
from srforge.data.sampling import aligned_sizes, train_val_indices, training_sampler
from srforge.geometry import divisor_pair, round_up

COLORS = {
    "scan": (68, 114, 176),
    "gutter": (243, 168, 59),
    "padding": (214, 64, 64),
    "train": (38, 150, 110),
    "val": (150, 72, 190),
    "empty": (242, 242, 242),
    "line": (150, 150, 150),
    "background": (255, 255, 255),
    "text": (25, 25, 25),
}
# Canvas geometry in drawn pixels; the picture's size follows from these and the batches' drawn extents.
MARGIN, LINE, PANEL_GAP, SLOT_GAP, BATCH_GAP = 16, 16, 28, 2, 10
HEADER = 2 * LINE + 4  # two lines of settings above both panels
MIN_BATCHES_WIDTH = 460  # room for the batch labels
HIST_WIDTH, HIST_HEIGHT, HIST_AXIS = 360, 240, 44  # plot area, and the room left of it for H tick labels
LEGEND_LINES = 11  # below the histogram: axis labels, legend, totals
MAX_BINS = (24, 40)  # histogram bins along H, W
# The largest picture drawn (about 190 MB as RGB): a huge divisor at a small scale, or thousands of batches, would
# otherwise ask for gigabytes before a pixel is drawn.
MAX_CANVAS_PIXELS = 64_000_000


@dataclass(frozen=True)
class BatchPixels:
    """One batch measured in pixels: real (the scans), alignment (gutters), padding (up to the batch maximum).

    ``indices`` index the training sizes; ``sizes`` and ``aligned`` are [n, 2] (H, W); ``shape`` is (Hp, Wp).
    """

    indices: tuple[int, ...]
    sizes: np.ndarray
    aligned: np.ndarray
    shape: tuple[int, int]

    @property
    def real(self) -> int:
        return int(self.sizes.prod(axis=1).sum())

    @property
    def alignment(self) -> int:
        return int(self.aligned.prod(axis=1).sum()) - self.real

    @property
    def padding(self) -> int:
        return len(self.indices) * self.shape[0] * self.shape[1] - int(self.aligned.prod(axis=1).sum())

    @property
    def waste(self) -> float:
        return (self.alignment + self.padding) / self.real


@dataclass
class BatchLayout:
    """What :func:`batch_layout` measured: the split, the epoch's batches, and the waste figures."""

    sizes: np.ndarray  # [N, 2] every scan's (H, W)
    train: list[int]  # indices into sizes
    val: list[int]
    divisor: tuple[int, int]
    batches: list[BatchPixels]  # epoch 0, in the sampler's order
    settings: dict = field(default_factory=dict)
    random_waste: float = float("nan")  # random batches of the same lengths, mean over shuffles

    @property
    def floor(self) -> float:
        """Waste of alignment alone: each training scan padded to its own multiple of the divisor."""
        return waste([measure(self.sizes[self.train][i : i + 1], self.divisor) for i in range(len(self.train))])


def measure(sizes, divisor, indices=None) -> BatchPixels:
    """A batch of scans of true ``sizes`` [n, 2], padded as AlignedCollate(divisor) pads it."""
    sizes = np.asarray(sizes, dtype=np.int64).reshape(-1, 2)
    aligned = aligned_sizes(sizes, divisor)
    shape = (int(aligned[:, 0].max()), int(aligned[:, 1].max()))
    return BatchPixels(tuple(range(len(sizes))) if indices is None else tuple(indices), sizes, aligned, shape)


def waste(batches: list[BatchPixels]) -> float:
    """Padded pixels / real pixels - 1 over several batches."""
    real = sum(b.real for b in batches)
    return sum(b.alignment + b.padding for b in batches) / real


def batch_layout(
    sizes,
    *,
    batch_size: int | None = None,
    max_pixels: int | None = None,
    divisor=32,
    val_fraction: float | None = 0.2,
    seed: int = 0,
    shuffles: int = 16,
    **sampler_options,
) -> BatchLayout:
    """Split and batch ``sizes`` [(H, W), ...] as the trainer would, and measure every batch.

    ``val_fraction`` (None: every scan trains, as with a separate validation set) and ``seed`` are the config's
    ``data.val_fraction`` and ``run.seed``; ``batch_size`` or ``max_pixels`` and ``divisor`` (the model's
    ``size_divisor``) and any ``sampler_options`` (pool_size, jitter) go to SizeGroupedBatchSampler.
    ``shuffles`` random batchings of the same batch lengths give the random-batching comparison.
    """
    array = np.asarray(list(sizes), dtype=np.int64).reshape(-1, 2)
    train, val = train_val_indices(array.tolist(), val_fraction, seed)
    train_sizes = array[train]
    grouping = {"batch_size": batch_size, "max_pixels": max_pixels, "divisor": divisor}
    sampler = training_sampler(train_sizes.tolist(), seed=seed, **grouping, **sampler_options)
    sampler.set_epoch(0)
    batches = [measure(train_sizes[b], divisor, b) for b in sampler]
    lengths = np.cumsum([len(b.indices) for b in batches])[:-1]
    rng = np.random.default_rng(seed)
    random_waste = float(
        np.mean(
            [
                waste([measure(train_sizes[part], divisor) for part in np.split(rng.permutation(len(train)), lengths)])
                for _ in range(shuffles)
            ]
        )
    )
    settings = {"batch_size": batch_size, "max_pixels": max_pixels, "val_fraction": val_fraction, "seed": seed}
    return BatchLayout(array, train, val, divisor_pair(divisor), batches, {**settings, **sampler_options}, random_waste)


def totals(layout: BatchLayout, num_batches: int = 4) -> list[str]:
    """The figures the picture prints under its legend, one line each."""
    shown = layout.batches[:num_batches]
    return [
        f"waste of these {len(shown)} batches: {waste(shown):.1%}, of the whole epoch ({len(layout.batches)} "
        f"batches): {waste(layout.batches):.1%}",
        f"alignment floor (each scan alone): {layout.floor:.1%}",
        f"random batches of the same lengths: {layout.random_waste:.1%}",
    ]


# -- drawing ---------------------------------------------------------------------------------------
def _ceil(n: int, k: int) -> int:
    return -(-int(n) // k)


def _batch_height(batch: BatchPixels, scale: int) -> int:
    n = len(batch.indices)
    return n * _ceil(batch.shape[0], scale) + (n - 1) * SLOT_GAP


def choose_scale(layout: BatchLayout, num_batches: int = 4, max_width: int = 640, max_height: int = 1200) -> int:
    """The smallest power of two k such that the first batches, drawn 1:k, fit max_width x max_height."""
    shown = layout.batches[:num_batches]
    k = 1
    while True:
        width = max(_ceil(b.shape[1], k) for b in shown)
        height = sum(LINE + _batch_height(b, k) + BATCH_GAP for b in shown)
        if (width <= max_width and height <= max_height) or k >= 2**20:
            return k
        k *= 2


def canvas_size(layout: BatchLayout, scale: int, num_batches: int = 4) -> tuple[int, int]:
    """(width, height) of the picture :func:`draw_batch_layout` makes."""
    shown = layout.batches[:num_batches]
    left_w = max(MIN_BATCHES_WIDTH, *(_ceil(b.shape[1], scale) for b in shown))
    left_h = sum(LINE + _batch_height(b, scale) + BATCH_GAP for b in shown)
    right_h = LINE + HIST_HEIGHT + LEGEND_LINES * LINE
    width = MARGIN + left_w + PANEL_GAP + HIST_AXIS + HIST_WIDTH + MARGIN
    return width, MARGIN + HEADER + max(left_h, right_h) + MARGIN


def _font():
    try:
        return ImageFont.load_default(size=12)
    except TypeError:  # Pillow < 10.1: only the fixed bitmap font
        return ImageFont.load_default()


def _draw_batch(draw: ImageDraw.ImageDraw, batch: BatchPixels, x: int, y: int, k: int) -> tuple[int, int, int, int]:
    """Draw the slots of one batch with their top-left at (x, y); returns the box (left, top, right, bottom)."""
    slot_h, slot_w = _ceil(batch.shape[0], k), _ceil(batch.shape[1], k)
    top = y
    for (h, w), (ah, aw) in zip(batch.sizes, batch.aligned):
        # Nested rectangles from the outside in: the slot, the aligned extent, the scan.
        draw.rectangle([x, y, x + slot_w - 1, y + slot_h - 1], fill=COLORS["padding"])
        draw.rectangle([x, y, x + _ceil(aw, k) - 1, y + _ceil(ah, k) - 1], fill=COLORS["gutter"])
        draw.rectangle([x, y, x + _ceil(w, k) - 1, y + _ceil(h, k) - 1], fill=COLORS["scan"])
        y += slot_h + SLOT_GAP
    return x, top, x + slot_w, y - SLOT_GAP


def _histogram(draw: ImageDraw.ImageDraw, layout: BatchLayout, x: int, y: int, font) -> None:
    """W against H: cell colour = train/val mix, depth = count; lines where sizes cross a multiple of the divisor."""
    sizes = layout.sizes
    lo, hi = sizes.min(axis=0), sizes.max(axis=0)
    bins = [min(MAX_BINS[a], int(hi[a] - lo[a]) + 1) for a in (0, 1)]
    edges = [np.linspace(lo[a], hi[a] + 1, bins[a] + 1) for a in (0, 1)]
    counts = {}
    for name, idx in (("train", layout.train), ("val", layout.val)):
        part = sizes[idx].reshape(-1, 2)
        counts[name] = np.histogram2d(part[:, 0], part[:, 1], bins=edges)[0] if len(part) else np.zeros(bins)
    total = counts["train"] + counts["val"]
    cell_h, cell_w = HIST_HEIGHT // bins[0], HIST_WIDTH // bins[1]
    plot_h, plot_w = cell_h * bins[0], cell_w * bins[1]
    white, train, val = (np.array(COLORS[c], dtype=np.float64) for c in ("background", "train", "val"))
    for i in range(bins[0]):
        for j in range(bins[1]):
            n = total[i, j]
            if n:
                mix = (counts["train"][i, j] * train + counts["val"][i, j] * val) / n
                depth = 0.35 + 0.65 * n / total.max()
                color = tuple(int(round(c)) for c in white + depth * (mix - white))
            else:
                color = COLORS["empty"]
            top = y + plot_h - (i + 1) * cell_h  # H grows upwards
            draw.rectangle([x + j * cell_w, top, x + (j + 1) * cell_w - 1, top + cell_h - 1], fill=color)

    def pos(value: float, axis: int) -> float:
        extent = plot_h if axis == 0 else plot_w
        return (value - edges[axis][0]) / (edges[axis][-1] - edges[axis][0]) * extent

    d = layout.divisor
    for axis in (0, 1):
        crossings = np.arange(round_up(int(lo[axis]), d[axis]), int(hi[axis]), d[axis])
        if len(crossings) > 24:  # a line every few pixels says nothing
            continue
        for m in crossings:  # scans of size m and m + 1 align to different multiples
            p = pos(m + 1, axis)
            if axis == 0:
                draw.line([x, y + plot_h - p, x + plot_w - 1, y + plot_h - p], fill=COLORS["line"])
            else:
                draw.line([x + p, y, x + p, y + plot_h - 1], fill=COLORS["line"])
    draw.text((x - HIST_AXIS, y), f"{hi[0]}", fill=COLORS["text"], font=font)
    draw.text((x - HIST_AXIS, y + plot_h - LINE), f"{lo[0]}", fill=COLORS["text"], font=font)
    draw.text((x - HIST_AXIS, y + plot_h // 2 - LINE), "H (px)", fill=COLORS["text"], font=font)
    draw.text((x, y + plot_h + 2), f"{lo[1]}", fill=COLORS["text"], font=font)
    # Placed by measured width, not by anchor: Pillow's bitmap fallback font takes no anchor.
    right = f"{hi[1]}"
    draw.text((x + plot_w - draw.textlength(right, font=font), y + plot_h + 2), right, fill=COLORS["text"], font=font)
    middle = x + (plot_w - draw.textlength("W (px)", font=font)) / 2
    draw.text((middle, y + plot_h + 2), "W (px)", fill=COLORS["text"], font=font)


def _draw_batches(draw: ImageDraw.ImageDraw, shown: list[BatchPixels], k: int, font) -> list[tuple[int, int, int, int]]:
    """The left panel: each batch's label and slots, top to bottom; returns each batch's box."""
    x, y = MARGIN, MARGIN + HEADER
    boxes = []
    for number, batch in enumerate(shown, start=1):
        label = (
            f"batch {number}: {len(batch.indices)} scans, {batch.shape[0]} x {batch.shape[1]}, waste "
            f"{batch.waste:.1%} (gutters {batch.alignment / batch.real:.1%}, padding {batch.padding / batch.real:.1%})"
        )
        draw.text((x, y), label, fill=COLORS["text"], font=font)
        boxes.append(_draw_batch(draw, batch, x, y + LINE, k))
        y = boxes[-1][3] + BATCH_GAP
    return boxes


def _draw_sizes_panel(draw: ImageDraw.ImageDraw, layout: BatchLayout, width: int, divisor: str, num_batches: int, font):
    """The right panel: the size histogram, the legend and the totals."""
    left_w = width - 2 * MARGIN - PANEL_GAP - HIST_AXIS - HIST_WIDTH
    hx, hy = MARGIN + left_w + PANEL_GAP + HIST_AXIS, MARGIN + HEADER
    draw.text((hx - HIST_AXIS, hy), "sizes: W against H, train / validation", fill=COLORS["text"], font=font)
    _histogram(draw, layout, hx, hy + LINE, font)
    legend = [
        ("scan", "scan: real pixels"),
        ("gutter", f"alignment gutter: up to a multiple of {divisor}"),
        ("padding", "batch padding: up to the batch maximum"),
        ("train", "train sizes (histogram; lines: multiples of the divisor)"),
        ("val", "validation sizes (a cell holding both mixes the two colours)"),
    ]
    ly = hy + LINE + HIST_HEIGHT + 2 * LINE
    for color, text in legend:
        draw.rectangle([hx - HIST_AXIS, ly + 2, hx - HIST_AXIS + 9, ly + 11], fill=COLORS[color])
        draw.text((hx - HIST_AXIS + 16, ly), text, fill=COLORS["text"], font=font)
        ly += LINE
    for text in ["waste = padded pixels / real pixels - 1", *totals(layout, num_batches)]:
        draw.text((hx - HIST_AXIS, ly), text, fill=COLORS["text"], font=font)
        ly += LINE


def draw_batch_layout(
    layout: BatchLayout, num_batches: int = 4, scale: int | None = None
) -> tuple[Image.Image, list[tuple[int, int, int, int]]]:
    """The picture (RGB, :func:`canvas_size`) and each drawn batch's box (left, top, right, bottom), right/bottom
    exclusive: inside a box only the scan, gutter and padding colours and the white gaps between slots appear.

    ``scale`` k draws one pixel per k x k scan pixels (default :func:`choose_scale`).
    """
    if num_batches < 1 or (scale is not None and scale < 1):
        raise ValueError(f"draw_batch_layout needs num_batches >= 1 and scale >= 1; got {num_batches} and {scale}.")
    k = scale or choose_scale(layout, num_batches)
    shown = layout.batches[:num_batches]
    width, height = canvas_size(layout, k, num_batches)
    if width * height > MAX_CANVAS_PIXELS:
        raise ValueError(
            f"draw_batch_layout: the picture of {len(shown)} batches at 1:{k} would be {width:,} x {height:,} px, "
            f"more than {MAX_CANVAS_PIXELS:,} pixels; draw fewer batches, or pass a larger scale or a smaller divisor."
        )
    image = Image.new("RGB", (width, height), COLORS["background"])
    draw, font = ImageDraw.Draw(image), _font()
    s, (dh, dw) = layout.settings, layout.divisor
    divisor = f"{dh}" if dh == dw else f"{dh} x {dw}"
    batching = f"batch_size {s['batch_size']}" if s["batch_size"] else f"max_pixels {s['max_pixels']:,}"
    extra = "".join(f", {key} {value}" for key, value in s.items() if key not in ("batch_size", "max_pixels"))
    draw.text(
        (MARGIN, MARGIN),
        f"{len(layout.sizes)} scans ({len(layout.train)} train, {len(layout.val)} validation); {batching}, "
        f"divisor {divisor}{extra}",
        fill=COLORS["text"],
        font=font,
    )
    draw.text(
        (MARGIN, MARGIN + LINE),
        f"the first {len(shown)} of {len(layout.batches)} training batches of epoch 0, drawn 1:{k}",
        fill=COLORS["text"],
        font=font,
    )
    boxes = _draw_batches(draw, shown, k, font)
    _draw_sizes_panel(draw, layout, width, divisor, num_batches, font)
    return image, boxes


def save_batch_layout(
    layout: BatchLayout, path: str | os.PathLike, num_batches: int = 4, scale: int | None = None
) -> Path:
    """Draw the layout and write it to ``path`` atomically (format from the suffix; PNG keeps colours exact)."""
    path = Path(path)
    image, _ = draw_batch_layout(layout, num_batches, scale)
    fmt = Image.registered_extensions().get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path}: unknown picture suffix {path.suffix!r}; use .png (or another Pillow format).")
    return atomic_write(
        path, lambda f: image.save(f, format=fmt, optimize=True) if fmt == "PNG" else image.save(f, format=fmt)
    )


def plot_batch_layout(
    sizes, path: str | os.PathLike, num_batches: int = 4, scale: int | None = None, **options
) -> BatchLayout:
    """:func:`batch_layout` of ``sizes`` with ``options``, drawn and written to ``path``; returns the layout."""
    layout = batch_layout(sizes, **options)
    save_batch_layout(layout, path, num_batches, scale)
    return layout
