"""srforge.data.annotations.rasterise: the pixels a polygon, a line and a disc cover, by hand; the EXIF turns of
points and arrays against PIL's; COCO's RLE string decoded exactly (against an independent encoder, and pycocotools
where it is installed); the row bands a long shape is drawn in, against a brute-force reference and in memory."""

import importlib
import tracemalloc
from fractions import Fraction
from functools import cache

import numpy as np
import pytest
from annotation_exports import coco_string, runs
from PIL import Image

from srforge.data.annotations.rasterise import (
    coco_counts,
    paint,
    polygon_cover,
    polyline_cover,
    runs_to_bitmap,
    segment_cover,
    turn_array,
    turn_points,
)
from srforge.data.images import TRANSPOSES

# The module itself (its BAND_PIXELS), not the package's attribute of that name, which is the function shapes.rasterise.
rasterise_module = importlib.import_module("srforge.data.annotations.rasterise")


def drawn(windows, size=(6, 7)) -> np.ndarray:
    canvas = np.zeros(size, np.uint8)
    paint(canvas, windows, 1)
    return canvas


def ring(*points) -> np.ndarray:
    return np.array(points, dtype=np.float64)


def test_a_polygon_covers_the_pixels_whose_centres_are_inside_with_holes_and_the_top_left_rule():
    expected = np.zeros((6, 7), np.uint8)
    expected[1:4, 1:5] = 1  # centres x 1.5..4.5, y 1.5..3.5 inside (1, 1)-(5, 4)
    assert np.array_equal(drawn(polygon_cover([ring([1, 1], [5, 1], [5, 4], [1, 4])], (6, 7))), expected)
    holed = drawn(polygon_cover([ring([0, 0], [6, 0], [6, 6], [0, 6]), ring([2, 2], [4, 2], [4, 4], [2, 4])], (6, 7)))
    expected = np.zeros((6, 7), np.uint8)
    expected[0:6, 0:6] = 1
    expected[2:4, 2:4] = 0
    assert np.array_equal(holed, expected)
    # The hypotenuse x + y = 6 passes through the centres (5.5, 0.5), (4.5, 1.5), ...: the inside lies to their left,
    # so they are not covered (top-left rule); a triangle sharing that edge covers exactly them.
    left = drawn(polygon_cover([ring([0, 0], [6, 0], [0, 6])], (6, 7)))
    right = drawn(polygon_cover([ring([6, 0], [6, 6], [0, 6])], (6, 7)))
    assert [int(v) for v in left.sum(axis=1)] == [5, 4, 3, 2, 1, 0] and not (left & right).any()
    assert np.array_equal(left | right, np.pad(np.ones((6, 6), np.uint8), ((0, 0), (0, 1))))


def test_a_line_along_a_pixel_edge_covers_one_row_and_a_disc_breaks_its_ties_down_and_right():
    on_edge = drawn(polyline_cover(ring([0, 3], [7, 3]), 0.25, (6, 7)))
    assert np.array_equal(np.flatnonzero(on_edge.any(axis=1)), [3]) and on_edge[3].all()  # row below the edge
    diagonal = drawn(polyline_cover(ring([0.5, 0.5], [5.5, 5.5]), 0.25, (6, 7)))
    assert np.array_equal(diagonal, np.pad(np.eye(6, dtype=np.uint8), ((0, 0), (0, 1))))
    wide = drawn(polyline_cover(ring([1.5, 2.5], [4.5, 2.5]), 1.0, (6, 7)))  # width 2, round caps
    expected = np.zeros((6, 7), np.uint8)
    expected[2, 1:5] = 1  # on the line
    expected[3, 1:5] = 1  # row 3's centres are exactly 1 below it: ties below, covered (row 1's, above, are not)
    expected[2, 5] = 1  # (5.5, 2.5) is 1 right of the end (4.5, 2.5): covered ((0.5, 2.5), left of (1.5, 2.5), not)
    assert np.array_equal(wide, expected)
    disc = drawn(segment_cover(ring(3.5, 3.5), ring(3.5, 3.5), 1.0, (6, 7)))
    expected = np.zeros((6, 7), np.uint8)
    expected[3, 3] = expected[3, 4] = expected[4, 3] = 1
    assert np.array_equal(disc, expected)
    assert np.array_equal(
        drawn(segment_cover(ring(3, 3), ring(3, 3), 1.0, (6, 7))), np.pad(np.ones((2, 2), np.uint8), ((2, 2), (2, 3)))
    )


def test_shapes_outside_the_image_are_clipped_and_nothing_drawn_out_of_it():
    assert polygon_cover([ring([-9, -9], [-1, -9], [-1, -1])], (6, 7)) == []
    clipped = drawn(polygon_cover([ring([-5, -5], [3, -5], [3, 2], [-5, 2])], (6, 7)))
    assert clipped.sum() == 6 and clipped[0:2, 0:3].all()


@pytest.mark.parametrize("turn", range(1, 9))
def test_turns_of_points_and_arrays_match_pils_transposes(turn):
    stored = np.arange(12 * 5, dtype=np.uint8).reshape(5, 12)
    pil = np.asarray(Image.fromarray(stored).transpose(TRANSPOSES[turn])) if turn > 1 else stored
    assert np.array_equal(turn_array(stored, turn), pil)
    # Pixel (r, c)'s centre goes where PIL puts that pixel.
    centre = np.array([[7.5, 3.5]])
    x, y = turn_points(centre, turn, (5, 12))[0]
    assert pil[int(y), int(x)] == stored[3, 7]


def test_run_lengths_fill_rows_or_columns_and_must_add_up():
    assert np.array_equal(runs_to_bitmap([1, 2, 3], 2, 3, "C"), [[0, 1, 1], [0, 0, 0]])
    assert np.array_equal(runs_to_bitmap([1, 2, 3], 2, 3, "F"), [[0, 1, 0], [1, 0, 0]])
    with pytest.raises(ValueError, match="add up to 5 pixels, expected 2 x 3"):
        runs_to_bitmap([1, 4], 2, 3, "C")


def test_coco_strings_decode_exactly():
    rng = np.random.default_rng(0)
    for _ in range(50):
        h, w = rng.integers(1, 30, 2)
        mask = rng.random((h, w)) < rng.random()
        counts = runs(mask.T.ravel())
        assert coco_counts(coco_string(counts)) == counts
        assert np.array_equal(runs_to_bitmap(coco_counts(coco_string(counts)), h, w, "F"), mask)
    with pytest.raises(ValueError, match="not in COCO's RLE alphabet"):
        coco_counts("ab~")


def test_coco_strings_decode_as_pycocotools_encodes():
    mask_utils = pytest.importorskip("pycocotools.mask", reason="pycocotools is not installed (optional)")
    rng = np.random.default_rng(1)
    for _ in range(50):
        h, w = rng.integers(1, 40, 2)
        mask = (rng.random((h, w)) < rng.random()).astype(np.uint8)
        rle = mask_utils.encode(np.asfortranarray(mask))
        assert np.array_equal(runs_to_bitmap(coco_counts(rle["counts"].decode()), h, w, "F"), mask.astype(bool))


def test_a_1px_line_along_the_right_or_bottom_border_covers_the_border_pixels():
    # The line x = 7 on a 7-wide image: column 6's centres (6.5) are exactly half its width away, on its left; their
    # partners on its right (7.5) are off the image, so the tie goes to the inside (as x = 0 covers column 0).
    right = drawn(polyline_cover(ring([7, 0], [7, 6]), 0.25, (6, 7)))
    expected = np.zeros((6, 7), np.uint8)
    expected[:, 6] = 1
    assert np.array_equal(right, expected)
    bottom = drawn(polyline_cover(ring([0, 6], [7, 6]), 0.25, (6, 7)))  # y = 6 on a 6-high image: row 5
    expected = np.zeros((6, 7), np.uint8)
    expected[5, :] = 1
    assert np.array_equal(bottom, expected)
    left = drawn(polyline_cover(ring([0, 0], [0, 6]), 0.25, (6, 7)))
    assert np.array_equal(np.flatnonzero(left.any(axis=0)), [0]) and left[:, 0].all()
    inside = drawn(polyline_cover(ring([3, 0], [3, 6]), 0.25, (6, 7)))  # an inner edge still covers one column
    assert np.array_equal(np.flatnonzero(inside.any(axis=0)), [3])


def exact_line(points, r2, size) -> np.ndarray:
    """Brute force over every pixel, in exact fractions: a centre is covered when its distance to a segment of the
    polyline is below the half width, or equal to it and the offset v from the segment's nearest point points down or
    right (vx + vy > 0, or = 0 with vx > 0) or the centre's mirror image (centre - 2 v) lies off the image."""
    points = [(Fraction(x), Fraction(y)) for x, y in points.tolist()]
    segments = list(zip(points, points[1:])) or [(points[0], points[0])]
    out = np.zeros(size, np.uint8)
    for row, col in np.ndindex(*size):
        px, py = Fraction(2 * col + 1, 2), Fraction(2 * row + 1, 2)
        for (ax, ay), (bx, by) in segments:
            dx, dy = bx - ax, by - ay
            length2 = dx * dx + dy * dy
            t = min(max(((px - ax) * dx + (py - ay) * dy) / length2, 0), 1) if length2 else 0
            vx, vy = px - ax - t * dx, py - ay - t * dy
            distance2 = vx * vx + vy * vy
            wins = (
                vx + vy > 0
                or (vx + vy == 0 and vx > 0)
                or not (0 <= px - 2 * vx < size[1] and 0 <= py - 2 * vy < size[0])
            )
            if distance2 < r2 or (distance2 == r2 and wins):
                out[row, col] = 1
                break
    return out


def exact_polygon(rings, size) -> np.ndarray:
    """Brute force over every pixel, in exact fractions: a centre is covered when an odd number of edges cross its
    row's centre line (each spanning y half-open, [low, high)) at or left of it -- even-odd and the top-left rule."""
    edges = [
        (a, b)
        for r in rings
        for a, b in zip(
            [tuple(map(Fraction, p)) for p in r.tolist()], [tuple(map(Fraction, p)) for p in np.roll(r, -1, 0).tolist()]
        )
        if a[1] != b[1]
    ]
    out = np.zeros(size, np.uint8)
    for row, col in np.ndindex(*size):
        px, py = Fraction(2 * col + 1, 2), Fraction(2 * row + 1, 2)
        crossings = sum(
            min(ay, by) <= py < max(ay, by) and ax + (py - ay) * (bx - ax) / (by - ay) <= px
            for (ax, ay), (bx, by) in edges
        )
        out[row, col] = crossings % 2
    return out


BRUTE_SIZE = (9, 11)  # (H, W)


@cache
def brute_cases() -> tuple[list, list]:
    """Polylines (points, r2, exact pixels) and polygons (rings, exact pixels) over BRUTE_SIZE: diagonals, zigzags, a
    disc, random ones partly off the image. Coordinates and half widths are quarters, so the rasteriser's floating
    point decides every tie exactly and must match the fractions pixel for pixel."""
    h, w = BRUTE_SIZE
    rng = np.random.default_rng(7)
    lines = [
        (ring([0, 0], [w, h]), 0.25),  # a 1-px diagonal corner to corner
        (ring([w, 0], [0, h]), 1.0),  # the other diagonal, 2 px wide
        (ring([-2, 1], [3.5, 8], [6, 0.5], [8.25, 8.75], [13, -1]), 0.5625),  # a zigzag leaving the image
        (ring([0.5, -1], [10.5, 9.5]), 2.25),  # steep-ish, wide, past the bottom and the top
        (ring([-3, 4], [14, 4]), 0.25),  # along a pixel edge
        (ring([4.5, 4.5]), 4.0),  # a disc
    ]
    for _ in range(10):
        points = rng.integers(-12, 4 * w + 12, (int(rng.integers(1, 5)), 2)) / 4
        lines.append((points, float(rng.integers(1, 9)) ** 2 / 16))
    polygons = [
        [ring([0, 0], [w, h - 1], [w, h], [0, 1])],  # a thin diagonal sliver
        [ring([-2, -2], [w + 2, 3], [1, 5], [w + 1, h + 2])],  # a self-crossing zigzag, partly off the image
        [ring([0, 0], [w, 0], [w, h], [0, h]), ring([2, 2], [8.5, 3], [3, 7])],  # a hole
    ]
    for _ in range(8):
        count = int(rng.integers(1, 3))
        polygons.append([rng.integers(-12, 4 * w + 12, (int(rng.integers(3, 7)), 2)) / 4 for _ in range(count)])
    return (
        [(points, r2, exact_line(points, r2, BRUTE_SIZE)) for points, r2 in lines],
        [(rings, exact_polygon(rings, BRUTE_SIZE)) for rings in polygons],
    )


@pytest.mark.parametrize("band_pixels", [None, 1, 100], ids=["default", "one-row-bands", "small-bands"])
def test_shapes_drawn_in_row_bands_match_a_brute_force_reference_pixel_for_pixel(band_pixels, monkeypatch):
    if band_pixels is not None:  # bands of one or a few rows: every shape crosses band boundaries
        monkeypatch.setattr(rasterise_module, "BAND_PIXELS", band_pixels)
    lines, polygons = brute_cases()
    for points, r2, expected in lines:
        assert np.array_equal(drawn(polyline_cover(points, r2, BRUTE_SIZE), BRUTE_SIZE), expected), (points, r2)
    for rings, expected in polygons:
        assert np.array_equal(drawn(polygon_cover(rings, BRUTE_SIZE), BRUTE_SIZE), expected), rings


def peak_bytes(draw) -> tuple[int, list]:
    """The peak of Python's (and numpy's) traced allocations while ``draw()`` runs, and what it returned."""
    tracemalloc.start()
    try:
        found = draw()
        return tracemalloc.get_traced_memory()[1], found
    finally:
        tracemalloc.stop()


def test_a_long_thin_shape_costs_memory_near_it_not_its_bounding_box():
    # Across 2000 x 2000 a window over the bounding box holds 4 million pixels (~400 MB of float64 temporaries);
    # drawn in row bands, a 1-px diagonal and a 3-px sliver stay near their few thousand pixels.
    size = (2000, 2000)
    limit = size[0] * size[1] // 20
    peak, line = peak_bytes(lambda: polyline_cover(ring([0, 0], [2000, 2000]), 0.25, size))
    assert peak < limit, f"the diagonal line peaked at {peak:,} bytes, expected < {limit:,}"
    assert sum(int(cover.sum()) for *_, cover in line) == 2000
    peak, sliver = peak_bytes(lambda: polygon_cover([ring([0, 0], [2000, 1997], [2000, 2000], [0, 3])], size))
    assert peak < limit, f"the sliver polygon peaked at {peak:,} bytes, expected < {limit:,}"
    assert sum(int(cover.sum()) for *_, cover in sliver) == 6000
