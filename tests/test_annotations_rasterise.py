"""srforge.data.annotations.rasterise: the pixels a polygon, a line and a disc cover, by hand; the EXIF turns of
points and arrays against PIL's; COCO's RLE string decoded exactly (against an independent encoder, and pycocotools
where it is installed)."""

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


def drawn(windows, size=(6, 7)) -> np.ndarray:
    canvas = np.zeros(size, np.uint8)
    paint(canvas, [w for w in windows if w is not None], 1)
    return canvas


def ring(*points) -> np.ndarray:
    return np.array(points, dtype=np.float64)


def test_a_polygon_covers_the_pixels_whose_centres_are_inside_with_holes_and_the_top_left_rule():
    expected = np.zeros((6, 7), np.uint8)
    expected[1:4, 1:5] = 1  # centres x 1.5..4.5, y 1.5..3.5 inside (1, 1)-(5, 4)
    assert np.array_equal(drawn([polygon_cover([ring([1, 1], [5, 1], [5, 4], [1, 4])], (6, 7))]), expected)
    holed = drawn([polygon_cover([ring([0, 0], [6, 0], [6, 6], [0, 6]), ring([2, 2], [4, 2], [4, 4], [2, 4])], (6, 7))])
    expected = np.zeros((6, 7), np.uint8)
    expected[0:6, 0:6] = 1
    expected[2:4, 2:4] = 0
    assert np.array_equal(holed, expected)
    # The hypotenuse x + y = 6 passes through the centres (5.5, 0.5), (4.5, 1.5), ...: the inside lies to their left,
    # so they are not covered (top-left rule); a triangle sharing that edge covers exactly them.
    left = drawn([polygon_cover([ring([0, 0], [6, 0], [0, 6])], (6, 7))])
    right = drawn([polygon_cover([ring([6, 0], [6, 6], [0, 6])], (6, 7))])
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
    disc = drawn([segment_cover(ring(3.5, 3.5), ring(3.5, 3.5), 1.0, (6, 7))])
    expected = np.zeros((6, 7), np.uint8)
    expected[3, 3] = expected[3, 4] = expected[4, 3] = 1
    assert np.array_equal(disc, expected)
    assert np.array_equal(
        drawn([segment_cover(ring(3, 3), ring(3, 3), 1.0, (6, 7))]), np.pad(np.ones((2, 2), np.uint8), ((2, 2), (2, 3)))
    )


def test_shapes_outside_the_image_are_clipped_and_nothing_drawn_out_of_it():
    assert polygon_cover([ring([-9, -9], [-1, -9], [-1, -1])], (6, 7)) is None
    clipped = drawn([polygon_cover([ring([-5, -5], [3, -5], [3, 2], [-5, 2])], (6, 7))])
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
