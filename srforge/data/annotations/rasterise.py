"""Which pixels a shape covers: polygons, lines of a width, discs and run-length bitmaps, exactly.

Coordinates are in the image's continuous plane: (0, 0) is the top-left corner of the top-left pixel, x to the
right, y down, so pixel (row r, column c) spans [c, c + 1) x [r, r + 1) and its centre is (c + 0.5, r + 0.5). A
shape covers a pixel when it covers the pixel's centre (docs/training.md, "Labels from annotation tools"):

- a polygon (one or more rings) covers a centre inside an odd number of its rings (even-odd: a ring inside another
  is a hole); a centre exactly on an edge is covered when the inside lies to its right (or below, on a horizontal
  edge) -- the top-left rule, under which two polygons sharing an edge never both cover a pixel;
- a line of width w (a polyline is the union of its segments) covers a centre at distance < w / 2 from a segment,
  and a centre at exactly w / 2 when the offset (vx, vy) from the segment's nearest point to it has vx + vy > 0, or
  vx + vy = 0 and vx > 0 (the centre lies below or right of the line) -- a 1-px line along a pixel edge covers one
  row or column, never two; a tie whose partner, the centre's mirror image across the shape, lies outside the image
  goes to the centre inside it, so that a 1-px line along the right or bottom border covers the border's pixels, as
  one along the left or top border does;
- a disc of radius r is a segment of length 0 and width 2r.

Every comparison is made on products of the coordinates (no square roots), so coordinates that are binary
fractions of moderate size (integers, halves, quarters) decide every tie exactly.
"""

from __future__ import annotations

import math

import numpy as np

# Turning what was drawn over the stored pixels into what viewers show (EXIF orientation 1-8), as functions of the
# stored size (W, H): point (x, y) -> displayed point. The transposes of srforge.data.images.TRANSPOSES.
TURNS = {
    1: lambda x, y, w, h: (x, y),
    2: lambda x, y, w, h: (w - x, y),
    3: lambda x, y, w, h: (w - x, h - y),
    4: lambda x, y, w, h: (x, h - y),
    5: lambda x, y, w, h: (y, x),
    6: lambda x, y, w, h: (h - y, x),
    7: lambda x, y, w, h: (h - y, w - x),
    8: lambda x, y, w, h: (y, w - x),
}
# The same turns of a pixel array [H, W] (numpy views).
ARRAY_TURNS = {
    1: lambda a: a,
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1, :],
    5: lambda a: a.T,
    6: lambda a: a.T[:, ::-1],
    7: lambda a: a.T[::-1, ::-1],
    8: lambda a: a.T[::-1, :],
}


def turn_points(points: np.ndarray, turn: int, stored: tuple[int, int]) -> np.ndarray:
    """``points`` [N, 2] (x, y) over the stored pixels of an image of stored size ``stored`` (H, W), as shown under
    EXIF orientation ``turn``: [N, 2]."""
    x, y = TURNS[turn](points[:, 0], points[:, 1], stored[1], stored[0])
    return np.stack([x, y], axis=1)


def turn_array(array: np.ndarray, turn: int) -> np.ndarray:
    """A stored pixel array [H, W] as shown under EXIF orientation ``turn`` (a contiguous copy)."""
    return np.ascontiguousarray(ARRAY_TURNS[turn](array))


# Long shapes are drawn in bands of rows, each band's window only the columns the shape reaches from them: a
# diagonal across a large scan would otherwise make a window (and float64 temporaries) of its whole bounding box.
BAND_PIXELS = 1 << 16  # the most pixels of one band's window (its float64 temporaries: 0.5 MB each)
DRIFT = 2  # a segment's band may drift sideways by at most this many times what one of its rows reaches


def _window(low: float, high: float, limit: int) -> tuple[int, int]:
    """The pixel indices [first, stop) whose centres i + 0.5 lie in [low, high), clipped to [0, limit)."""
    first = math.ceil(min(max(low - 0.5, 0.0), limit))  # Python scalars: this runs once a band (numpy's: 10x slower)
    stop = math.ceil(min(max(high - 0.5, 0.0), limit))
    return first, max(first, stop)


def polygon_cover(rings: list[np.ndarray], size: tuple[int, int]) -> list[tuple[int, int, np.ndarray]]:
    """The pixels of an image of ``size`` (H, W) the polygon ``rings`` (each [N, 2] (x, y), closed implicitly)
    covers by the even-odd and top-left rules: windows (top row, left column, bool [h, w]), one per band of rows with
    a covered pixel (none: an empty list).

    Each edge crosses the rows whose centre line y = r + 0.5 it spans half-open ([y_low, y_high)); a crossing at x
    toggles every pixel whose centre is at or right of it (c + 0.5 >= x), and a pixel is covered by an odd count.
    The rows are drawn in bands of BAND_PIXELS / w rows (w: the bounding box's width), each band's window only the
    columns between its leftmost and rightmost crossing, so a thin slanted polygon costs memory near it, not its box.
    """
    points = np.concatenate(rings)
    r0, r1 = _window(points[:, 1].min(), points[:, 1].max(), size[0])
    c0, c1 = _window(points[:, 0].min(), points[:, 0].max(), size[1])
    if r1 == r0 or c1 == c0:
        return []
    starts = np.concatenate(rings)
    ends = np.concatenate([np.roll(ring, -1, axis=0) for ring in rings])
    slanted = starts[:, 1] != ends[:, 1]
    a, b = starts[slanted], ends[slanted]
    low, high = np.minimum(a[:, 1], b[:, 1]), np.maximum(a[:, 1], b[:, 1])
    first = np.clip(np.ceil(low - 0.5), r0, r1).astype(np.int64)
    stop = np.clip(np.ceil(high - 0.5), r0, r1).astype(np.int64)
    step = max(1, BAND_PIXELS // (c1 - c0 + 1))
    found = []
    for top in range(r0, r1, step):
        near = np.flatnonzero((first < top + step) & (stop > top))  # the edges crossing a row of the band
        band = _polygon_band(a[near], b[near], first[near].clip(min=top), stop[near].clip(max=top + step), (c0, c1))
        if band is not None:
            found.append(band)
    return found


def _polygon_band(
    a: np.ndarray, b: np.ndarray, first: np.ndarray, stop: np.ndarray, columns: tuple[int, int]
) -> tuple[int, int, np.ndarray] | None:
    """The covered pixels of one band of rows, where edge i (from ``a[i]`` to ``b[i]``, each [E, 2] (x, y)) crosses
    the rows [``first[i]``, ``stop[i]``) (each [E]) and ``columns`` are the polygon's [first, stop) columns:
    (top row, left column, bool [h, w] window), or None when the band covers nothing.

    A row's crossings are even in number (a crossing edge joins a vertex at or above the row's centre line to one
    below it, and every ring is closed), so no pixel left of the band's leftmost crossing or at or right of its
    rightmost is covered: the window holds the columns between, cut at the image's right edge."""
    counts = np.maximum(stop - first, 0)
    if not counts.any():
        return None
    top = int(first[counts > 0].min())
    edge = np.repeat(np.arange(len(a)), counts)
    row = np.repeat(first, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    ya, xa, yb, xb = a[edge, 1], a[edge, 0], b[edge, 1], b[edge, 0]
    x = xa + (row + 0.5 - ya) * (xb - xa) / (yb - ya)
    column = np.clip(np.ceil(x - 0.5), *columns).astype(np.int64)  # columns[1]: right of the image
    left, right = int(column.min()), int(column.max())
    if right == left:
        return None
    toggles = np.zeros((int(row.max()) - top + 1, right - left + 1), np.int32)
    np.add.at(toggles, (row - top, column - left), 1)
    cover = (np.cumsum(toggles[:, :-1], axis=1) & 1).astype(bool)
    return (top, left, cover) if cover.any() else None


def _tie_wins(vx: np.ndarray, vy: np.ndarray) -> np.ndarray:
    """Where a centre at exactly the half width is covered: (vx, vy), the offset from the shape's nearest point to
    the centre (or any positive multiple of it), has vx + vy > 0, or vx + vy = 0 and vx > 0 -- the centre lies below
    or right of the shape, so moving it up-left would bring it inside (the top-left rule of polygons)."""
    s = vx + vy
    return (s > 0) | ((s == 0) & (vx > 0))


def _off_image(x: np.ndarray, y: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Where the point (x, y) lies on no pixel of an image of ``size`` (H, W)."""
    return (x < 0) | (x >= size[1]) | (y < 0) | (y >= size[0])


def segment_cover(a: np.ndarray, b: np.ndarray, r2: float, size: tuple[int, int]) -> list[tuple[int, int, np.ndarray]]:
    """The pixels of an image of ``size`` (H, W) within ``sqrt(r2)`` of the segment from ``a`` to ``b`` (each
    (x, y); a == b: a disc), ties by :func:`_tie_wins`: windows (top row, left column, bool [h, w]), one per band of
    rows (:func:`_band_rows`) with a covered pixel, each only the columns the segment reaches from its rows."""
    if r2 <= 0:
        return []
    reach = float(np.sqrt(r2)) + 1.0  # a pixel's margin more than the half width: the tie rule decides the rest
    r0, r1 = _window(min(a[1], b[1]) - reach, max(a[1], b[1]) + reach, size[0])
    c0, c1 = _window(min(a[0], b[0]) - reach, max(a[0], b[0]) + reach, size[1])
    if r1 == r0 or c1 == c0:
        return []
    step = _band_rows(float(b[0] - a[0]), float(b[1] - a[1]), reach, c1 - c0)
    found = []
    for top in range(r0, r1, step):
        bottom = min(top + step, r1)
        left, right = _band_columns(a, b, (top, bottom), reach, size[1])
        left, right = max(left, c0), min(right, c1)
        if right > left:
            cover = _segment_window(a, b, r2, size, (top, bottom), (left, right))
            if cover.any():
                found.append((top, left, cover))
    return found


def _band_rows(dx: float, dy: float, reach: float, width: int) -> int:
    """How many rows a band of a segment of direction (``dx``, ``dy``) holds, ``reach`` its half width plus a pixel
    and ``width`` its window's columns: at least 1, and no more than keep the band's window within BAND_PIXELS
    pixels and its drift sideways (slope x rows) within DRIFT times what one row reaches -- so a band's window is at
    most 1 + DRIFT times the pixels near the segment in its rows, whatever the slope."""
    slope = abs(dx) / abs(dy) if dy else (np.inf if dx else 0.0)  # columns per row
    across = min(2 * reach * (1 + slope) + 1, width)  # the columns one row of the segment reaches, at most
    rows = BAND_PIXELS / ((1 + DRIFT) * across)
    if 0 < slope and across < width:  # a band of several rows drifts; a window already the full width cannot
        rows = min(rows, DRIFT * across / slope)
    return max(1, int(rows))


def _band_columns(a: np.ndarray, b: np.ndarray, rows: tuple[int, int], reach: float, limit: int) -> tuple[int, int]:
    """The columns [first, stop) of an image ``limit`` wide whose pixels in ``rows`` [first, stop) can lie within
    ``reach`` of the segment from ``a`` to ``b``: around its part within ``reach`` of the rows' centre lines.

    A covered centre lies within reach - 1 of its nearest point, so the pixel of margin absorbs any rounding here."""
    (ax, ay), (bx, by) = (float(v) for v in a), (float(v) for v in b)  # Python floats: this runs once a band
    xs = [ax, bx]
    if by != ay:  # the segment's points at y = the rows' centre lines -/+ reach, as far as it goes
        xs = [
            ax + min(max((y - ay) / (by - ay), 0.0), 1.0) * (bx - ax)
            for y in (rows[0] + 0.5 - reach, rows[1] - 0.5 + reach)
        ]
    return _window(min(xs) - reach, max(xs) + reach, limit)


def _segment_window(
    a: np.ndarray, b: np.ndarray, r2: float, size: tuple[int, int], rows: tuple[int, int], columns: tuple[int, int]
) -> np.ndarray:
    """Which pixels in ``rows`` x ``columns`` (each [first, stop)) of an image of ``size`` (H, W) lie within
    ``sqrt(r2)`` of the segment from ``a`` to ``b``, ties by :func:`_tie_wins`: bool [h, w]. Each pixel's answer
    depends on its centre alone, never on the window, so bands drawn apart join into the one shape."""
    py = (np.arange(*rows, dtype=np.float64) + 0.5)[:, None]
    px = (np.arange(*columns, dtype=np.float64) + 0.5)[None, :]
    dx, dy = float(b[0] - a[0]), float(b[1] - a[1])
    length2 = dx * dx + dy * dy
    ax, ay = px - a[0], py - a[1]  # centre - a, [h, w] by broadcasting
    along = ax * dx + ay * dy
    before, after = along <= 0, along >= length2
    # Past an end the nearest point is that end; beside the segment, the foot of the perpendicular.
    vx = np.where(before, ax, px - b[0])
    vy = np.where(before, ay, py - b[1])
    cap = vx * vx + vy * vy
    # A tie's mirror image across the shape (centre - 2 v) off the image: its partner pixel does not exist, so the
    # centre inside wins the tie (a line along the right or bottom border would otherwise paint nothing).
    cover_cap = (cap < r2) | ((cap == r2) & (_tie_wins(vx, vy) | _off_image(px - 2 * vx, py - 2 * vy, size)))
    if length2 == 0:
        return cover_cap
    cross = dx * ay - dy * ax  # (centre - a) = t d + cross / |d|^2 (-dy, dx)
    side = cross * cross
    limit = r2 * length2
    sign = np.sign(cross)
    foot_x, foot_y = a[0] + along * dx / length2, a[1] + along * dy / length2  # the nearest point of the line
    mirrored = _off_image(2 * foot_x - px, 2 * foot_y - py, size)
    cover_side = (side < limit) | ((side == limit) & (_tie_wins(sign * -dy, sign * dx) | mirrored))
    inside = ~before & ~after
    return np.where(inside, cover_side, cover_cap)


def polyline_cover(points: np.ndarray, r2: float, size: tuple[int, int]) -> list[tuple[int, int, np.ndarray]]:
    """The windows (top row, left column, bool [h, w]) a polyline of [N, 2] ``points`` and half width
    ``sqrt(r2)`` covers: a segment's bands (:func:`segment_cover`) after another's (one point: a disc)."""
    if len(points) == 1:
        points = np.concatenate([points, points])
    return [window for i in range(len(points) - 1) for window in segment_cover(points[i], points[i + 1], r2, size)]


def bitmap_cover(bitmap: np.ndarray, left: int, top: int, size: tuple[int, int]) -> tuple[int, int, np.ndarray] | None:
    """A bool [h, w] ``bitmap`` whose top-left pixel is (``top``, ``left``), clipped to an image of ``size``."""
    r0, c0 = max(top, 0), max(left, 0)
    r1, c1 = min(top + bitmap.shape[0], size[0]), min(left + bitmap.shape[1], size[1])
    if r1 <= r0 or c1 <= c0:
        return None
    return r0, c0, bitmap[r0 - top : r1 - top, c0 - left : c1 - left]


def paint(canvas: np.ndarray, windows, value: int) -> None:
    """Set the pixels of ``canvas`` [H, W] that the windows (top row, left column, bool [h, w]) cover to ``value``."""
    for top, left, cover in windows:
        view = canvas[top : top + cover.shape[0], left : left + cover.shape[1]]
        view[cover] = value


def max_pixels() -> int | None:
    """The most pixels srforge accepts an image of from a file: PIL's ``Image.MAX_IMAGE_PIXELS``, which
    :func:`srforge.data.images.open_image` holds every image to (None: the user lifted the limit)."""
    from PIL import Image

    return Image.MAX_IMAGE_PIXELS


def runs_to_bitmap(counts: list[int], height: int, width: int, order: str) -> np.ndarray:
    """Alternating run lengths (0s first) as a bool [height, width] bitmap, the runs along rows (``order`` "C":
    CVAT) or down columns ("F": COCO); a ValueError when the size passes :func:`max_pixels` or the runs are not
    integers in [0, height x width] adding up to height x width.

    Everything is checked on the Python integers before numpy sees them: a count past int64 would otherwise be a bare
    OverflowError, and a size of 50,000 x 50,000 a 2.5 GB bitmap drawn from a few bytes of JSON."""
    limit, total = max_pixels(), height * width
    if height < 0 or width < 0 or (limit is not None and total > limit):
        raise ValueError(
            f"run-length size {height} x {width} (H x W) is no image srforge reads (expected sizes >= 0"
            + (f" and at most {limit:,} pixels, PIL.Image.MAX_IMAGE_PIXELS)" if limit is not None else ")")
        )
    bad = next((c for c in counts if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= total), None)
    if bad is not None:
        raise ValueError(f"run length {str(bad)[:40]} is not an integer in [0, {height} x {width} = {total}]")
    added = sum(counts)
    if added != total:
        raise ValueError(f"run lengths add up to {added} pixels, expected {height} x {width} = {total}")
    runs = np.asarray(counts, dtype=np.int64)
    values = np.arange(len(runs)) % 2 == 1
    flat = np.repeat(values, runs)
    return flat.reshape(width, height).T if order == "F" else flat.reshape(height, width)


MAX_COUNT_CHARACTERS = 13  # 13 groups of 5 bits hold any count up to 2**64: one more is no count of an image


def coco_counts(text: str) -> list[int]:
    """The run lengths of COCO's compressed RLE string: each count in 5-bit groups, least significant first, as
    characters offset by 48 (0x20 set: more groups follow; 0x10 in the last group: negative), and every count from
    the fourth on stored as its difference from the count two before it. A ValueError for a character outside the
    alphabet or a count of more than MAX_COUNT_CHARACTERS characters (which would otherwise cost quadratic time)."""
    counts: list[int] = []
    value, shift = 0, 0
    for at, char in enumerate(text):
        group = ord(char) - 48
        if not 0 <= group < 64:
            raise ValueError(
                f"character {char!r} at position {at} is not in COCO's RLE alphabet ('0' to 'o'); the string is damaged"
            )
        value |= (group & 0x1F) << shift
        shift += 5
        if group & 0x20:
            if shift >= 5 * MAX_COUNT_CHARACTERS:
                raise ValueError(
                    f"count {len(counts)} runs past {MAX_COUNT_CHARACTERS} characters at position {at}; no image "
                    "has a run that long: the string is damaged"
                )
            continue
        if group & 0x10:
            value -= 1 << shift
        if len(counts) > 2:
            value += counts[-2]
        counts.append(value)
        value, shift = 0, 0
    if shift:
        raise ValueError("the RLE string ends inside a count")
    return counts
