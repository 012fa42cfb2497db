"""srforge.train.update's part arithmetic: parts of a batch, and the redo in halves of a part out of memory."""

from srforge.train.update import each_part, parts_of, scans_within


def test_parts_and_the_scans_a_budget_holds():
    assert parts_of(5, 2) == [(0, 2), (2, 4), (4, 5)]
    assert scans_within(None, (5, 3, 10, 10)) == 5
    assert scans_within(250, (5, 3, 10, 10)) == 2 and scans_within(10, (5, 3, 10, 10)) == 1  # at least one


def test_a_part_out_of_memory_is_followed_by_its_halves_and_a_single_scans_failure_by_nothing():
    tried = []

    def run(lo, hi):  # out of memory on any part over 2 scans, and on any part holding scan 5
        tried.append((lo, hi))
        return None if hi - lo > 2 or lo <= 5 < hi else hi - lo

    seen = list(each_part([(0, 4), (4, 8)], run))
    assert tried == [(0, 4), (0, 2), (2, 4), (4, 8), (4, 6), (4, 5), (5, 6), (6, 8)]
    assert seen == [(0, 4, None), (0, 2, 2), (2, 4, 2), (4, 8, None), (4, 6, None), (4, 5, 1), (5, 6, None),
                    (6, 8, 2)]  # fmt: skip
