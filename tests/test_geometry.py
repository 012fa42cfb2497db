"""Size rules (srforge.geometry): the deepest sensible model for a set of scans, and the message for a deeper one."""

import torch

from srforge.constants import MAX_DEPTH
from srforge.geometry import depth_problem, largest_sensible_depth

QUICKSTART_SIZES = [(30 + i % 11, 200 + 60 * i) for i in range(11)]


def test_the_quickstart_depth_is_sensible_and_a_deeper_one_is_named():
    assert largest_sensible_depth(QUICKSTART_SIZES) == 6  # 2**5 = 32 < 40: the 6th stage still halves 2 rows
    assert depth_problem(QUICKSTART_SIZES, 5) is None and depth_problem(QUICKSTART_SIZES, 6) is None
    problem = depth_problem(QUICKSTART_SIZES, 12)
    assert "depth 12 (size divisor 2**12)" in problem and "largest scan height is 40 px" in problem
    assert "use depth 6 or less (size divisor 64)" in problem


def test_the_depth_rule_looks_at_the_narrower_side_and_takes_tensors():
    problem = depth_problem(torch.tensor([[500, 20], [300, 12]]), 6)
    assert "largest scan width is 20 px" in problem and "single column" in problem
    assert "use depth 5 or less (size divisor 32)" in problem
    assert "too small for any depth" in depth_problem([(1, 50)], 1)
    assert depth_problem([], 12) is None
    assert largest_sensible_depth([(10**6, 10**6)]) == MAX_DEPTH
