"""srforge.data.size_policy: one object says a training scan's size; the view applies it, the sampler asks it."""

from test_rescale import Sheets

from srforge.data.field_view import FieldView
from srforge.data.size_policy import SizePolicy
from srforge.train.from_config import Data, training_epoch_sizes


def test_the_view_and_the_sampler_ask_the_same_policy():
    view = FieldView(Sheets(8), indices=[7, 1, 4, 0, 2], seed=11)
    true = view.sizes_of(Sheets(8).sizes())
    view.scale, view.crop = (0.5, 2.0), (16, 32)  # the view's attributes are the policy's
    assert view.sizing == SizePolicy(11, (0.5, 2.0), (16, 32))
    data = Data(view, view, view.sizing.largest(true), true, true)
    sizes_in = training_epoch_sizes(data)
    for epoch in (0, 3):
        view.set_epoch(epoch)
        seen = [tuple(view[i]["image"].shape[-2:]) for i in range(len(view))]
        assert sizes_in(epoch) == seen == view.sizing.epoch_sizes(true, view.indices, epoch)
        assert all(h <= lh and w <= lw for (h, w), (lh, lw) in zip(seen, data.train_sizes))  # within the largest
    view.sizing.crop = (8, 16)  # one object: the sampler sees a change at once
    assert all(h <= 8 and w <= 16 for h, w in sizes_in(0))


def test_without_rescaling_sizes_do_not_vary_and_the_crop_bounds_them():
    policy = SizePolicy(0, None, (12, 20))
    assert not policy.varies and SizePolicy(0, (1.0, 1.0)).varies
    assert policy.largest([(10, 40), (30, 8)]) == [(10, 20), (12, 8)]
    assert policy.epoch_sizes([(10, 40), (30, 8)], [0, 1], epoch=5) == [(10, 20), (12, 8)]
