"""Tiled inference: a scan larger than the pixel budget, predicted tile by tile in bounded memory.

Tiles are at most ``tile`` = (th, tw) pixels, multiples of the model's size divisor d, and start on
multiples of d, so each tile sees the same stride-2 grid as the whole scan. Neighbours overlap by about
``overlap`` pixels and each keeps only its half of every overlap (the centre region): a kept pixel lies at
least ~overlap / 2 from any tile border that is not a scan border, where zero padding would change the
convolutions. What tiling cannot keep is the whole-scan GroupNorm statistics: each tile normalises
over itself. benchmarks/bench_predict.py and tests/test_predict.py measure how many pixels change.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from srforge.geometry import round_up


def _floor_to(n: int, d: int) -> int:
    return n // d * d


def tile_spans(length: int, tile: int, overlap: int, divisor: int) -> list[tuple[int, int, int, int]]:
    """Tiles along one axis of ``length`` px: [(start, stop, keep_start, keep_stop)].

    Starts are multiples of ``divisor``; every tile spans at most ``tile`` px; the kept ranges partition
    [0, length). ``tile`` must be a multiple of ``divisor`` and ``overlap`` < ``tile``.
    """
    if length <= tile:
        return [(0, length, 0, length)]
    step = max(divisor, _floor_to(tile - overlap, divisor))
    starts = list(range(0, length - tile, step))
    last = round_up(length - tile, divisor)  # the last tile ends at the scan's edge
    if last > starts[-1]:
        starts.append(last)
    stops = [min(s + tile, length) for s in starts]
    cuts = [0] + [(starts[k + 1] + stops[k]) // 2 for k in range(len(starts) - 1)] + [length]
    return [(s, e, cuts[k], cuts[k + 1]) for k, (s, e) in enumerate(zip(starts, stops))]


def tile_shape(height: int, width: int, max_pixels: int, divisor: int) -> tuple[int, int]:
    """(th, tw), multiples of ``divisor``, with th * tw <= max_pixels (at least 2d x 2d).

    Full-height strips when a strip 4d wide fits: well logs are wide, and a tile that spans the whole
    height has no horizontal seams.
    """
    full = round_up(height, divisor)
    if full * 4 * divisor <= max_pixels:
        return full, _floor_to(max_pixels // full, divisor)
    side = max(2 * divisor, _floor_to(int(max_pixels**0.5), divisor))
    return side, side


def tile_grid(
    height: int, width: int, tile: tuple[int, int], overlap: int, divisor: int
) -> tuple[list[tuple[int, int, int, int]], list[tuple[int, int, int, int]]]:
    """(row spans, column spans) of the tiles of an (H, W) scan (:func:`tile_spans` along each axis): the tiles are
    every pair, ``len(rows) * len(columns)`` of them."""
    ys = tile_spans(height, tile[0], min(overlap, tile[0] - divisor), divisor)
    xs = tile_spans(width, tile[1], min(overlap, tile[1] - divisor), divisor)
    return ys, xs


def predict_tiled(
    run_batch: Callable[[list[torch.Tensor]], list[tuple[torch.Tensor | None, ...]]],
    image: torch.Tensor,
    tile: tuple[int, int],
    overlap: int,
    divisor: int,
    tiles_per_batch: int = 1,
) -> tuple[torch.Tensor | None, ...]:
    """Per-pixel outputs of ``image`` [C, H, W], stitched from tiles: a tuple of [..., H, W] tensors.

    ``run_batch`` maps a list of tiles [C, h, w] to one tuple of outputs per tile, each [..., h, w] or None
    (e.g. a class map [h, w] and probabilities [K, h, w]); it pads, runs the model and crops back, and gets
    ``tiles_per_batch`` tiles at a time. Every output is per pixel, so a class map stitched from tiles equals
    the class map of the stitched scores.
    """
    height, width = image.shape[-2:]
    ys, xs = tile_grid(height, width, tile, overlap, divisor)
    tiles = [(y, x) for y in ys for x in xs]
    out: list[torch.Tensor | None] | None = None
    for first in range(0, len(tiles), tiles_per_batch):
        chunk = tiles[first : first + tiles_per_batch]
        results = run_batch([image[:, y[0] : y[1], x[0] : x[1]] for y, x in chunk])
        for ((y0, _, ky0, ky1), (x0, _, kx0, kx1)), result in zip(chunk, results):
            if out is None:
                out = [None if r is None else r.new_empty((*r.shape[:-2], height, width)) for r in result]
            for whole, part in zip(out, result):
                if part is not None:
                    whole[..., ky0:ky1, kx0:kx1] = part[..., ky0 - y0 : ky1 - y0, kx0 - x0 : kx1 - x0]
    return tuple(out)
