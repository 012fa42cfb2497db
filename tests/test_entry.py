"""Entry: every example and rule of SR-Forge's batch convention ("Collation and the Batch Convention") and the
container's contract."""

import copy
import pickle

import numpy as np
import pytest
import torch
from helpers import same
from hypothesis import given, settings
from hypothesis import strategies as st

import srforge
from srforge.data import Entry as EntryFromData


def test_entry_is_importable_from_the_package_and_from_data():
    assert srforge.Entry is EntryFromData


# -- SR-Forge, "What is Collation?" and "How Collation Works" ------------------------------------
def test_tensors_of_one_shape_are_stacked_along_a_new_batch_dim():
    e1 = srforge.Entry(image=torch.randn(3, 64, 64))
    e2 = srforge.Entry(image=torch.randn(3, 64, 64))
    batch = srforge.Entry.collate([e1, e2])
    assert batch.image.shape == (2, 3, 64, 64)
    assert torch.equal(batch.image[1], e2.image)
    assert batch.is_batched and batch.batch_size == 2


def test_attribute_and_key_access_are_the_same_field():
    e = srforge.Entry(name="scene_042")
    assert e.name == e["name"] == "scene_042"
    e.scale = 4
    assert e["scale"] == 4
    e["bands"] = ["b2"]
    assert e.bands == ["b2"]
    del e.scale
    assert "scale" not in e
    with pytest.raises(AttributeError, match="no field 'missing'"):
        e.missing


def test_natural_shape_sample_from_the_dataset_example():
    e = srforge.Entry(
        name="scene_042", image=torch.zeros(3, 8, 8), target=torch.zeros(3, 8, 8), bands=["b2", "b8"], scale=4
    )
    assert not e.is_batched
    batch = srforge.Entry.collate([e, e, e, e])
    assert batch.image.shape == (4, 3, 8, 8)
    assert batch.name == ["scene_042"] * 4
    assert batch.bands == [["b2", "b8"]] * 4
    assert torch.equal(batch.scale, torch.tensor([4, 4, 4, 4]))


# -- the collation rules table, row by row --------------------------------------------------------
def test_rule_tensors_of_different_shapes_are_kept_as_a_list():
    a, b = torch.zeros(3, 4, 5), torch.zeros(3, 6, 5)
    batch = srforge.Entry.collate([srforge.Entry(image=a), srforge.Entry(image=b)])
    assert isinstance(batch.image, list) and batch.image[0] is a and batch.image[1] is b


def test_rule_tensors_of_different_dtypes_are_kept_as_a_list():
    batch = srforge.Entry.collate([srforge.Entry(x=torch.zeros(2)), srforge.Entry(x=torch.zeros(2, dtype=torch.int64))])
    assert isinstance(batch.x, list)


def test_rule_strings_are_collected():
    batch = srforge.Entry.collate([srforge.Entry(name="scene_042"), srforge.Entry(name="scene_043")])
    assert batch.name == ["scene_042", "scene_043"]


def test_rule_ints_become_an_int64_tensor_and_floats_a_float32_tensor():
    batch = srforge.Entry.collate([srforge.Entry(scale=2, w=0.5), srforge.Entry(scale=4, w=1.5)])
    assert torch.equal(batch.scale, torch.tensor([2, 4])) and batch.scale.dtype == torch.int64
    # Never the float64 that default_collate gives Python floats.
    assert batch.w.dtype == torch.float32 and torch.equal(batch.w, torch.tensor([0.5, 1.5]))


def test_rule_bools_become_a_bool_tensor():
    batch = srforge.Entry.collate([srforge.Entry(flag=True), srforge.Entry(flag=False)])
    assert batch.flag.dtype == torch.bool and batch.flag.tolist() == [True, False]


def test_rule_lists_are_collected_not_concatenated():
    e1, e2 = srforge.Entry(bands=["b2", "b8"]), srforge.Entry(bands=["b2", "b8"])
    assert srforge.Entry.collate([e1, e2]).bands == [["b2", "b8"], ["b2", "b8"]]


def test_rule_multi_temporal_lists_keep_their_own_lengths():
    t = [torch.full((1, 2, 2), float(i)) for i in range(5)]
    batch = srforge.Entry.collate([srforge.Entry(lrs=[t[0], t[1]]), srforge.Entry(lrs=[t[2], t[3], t[4]])])
    assert len(batch.lrs) == 2 and len(batch.lrs[0]) == 2 and len(batch.lrs[1]) == 3
    assert batch.lrs[1][2] is t[4]


def test_rule_tuples_are_collected():
    t = [torch.zeros(1) for _ in range(4)]
    batch = srforge.Entry.collate([srforge.Entry(pair=(t[0], t[1])), srforge.Entry(pair=(t[2], t[3]))])
    assert batch.pair == [(t[0], t[1]), (t[2], t[3])]


def test_rule_dicts_are_collated_key_by_key():
    mk = lambda: srforge.Entry(bands={"rgb": torch.randn(3, 8, 8), "nir": torch.randn(2, 8, 8)})  # noqa: E731
    batch = srforge.Entry.collate([mk(), mk()])
    assert batch.bands["rgb"].shape == (2, 3, 8, 8)
    assert batch.bands["nir"].shape == (2, 2, 8, 8)


def test_rule_all_none_is_a_list_of_none():
    batch = srforge.Entry.collate([srforge.Entry(mask=None), srforge.Entry(mask=None)])
    assert batch.mask == [None, None]


def test_rule_none_mixed_with_values_keeps_the_raw_values():
    m = torch.randn(1, 64, 64)
    batch = srforge.Entry.collate([srforge.Entry(mask=None), srforge.Entry(mask=m)])
    assert batch.mask[0] is None and batch.mask[1] is m
    assert batch[0].mask is None and batch[1].mask is m


def test_rule_mixed_types_raise_type_error_naming_field_and_types():
    with pytest.raises(TypeError, match=r"field 'scale'.*int, str"):
        srforge.Entry.collate([srforge.Entry(scale="x"), srforge.Entry(scale=2)])
    with pytest.raises(TypeError, match=r"field 'meta.k'.*bool, int"):
        srforge.Entry.collate([srforge.Entry(meta={"k": True}), srforge.Entry(meta={"k": 1})])
    with pytest.raises(TypeError, match="field 'mask'"):
        srforge.Entry.collate([srforge.Entry(mask=None), srforge.Entry(mask="a"), srforge.Entry(mask=1.0)])


def test_numpy_arrays_and_scalars_collate_like_tensors_and_numbers():
    batch = srforge.Entry.collate(
        [
            srforge.Entry(a=np.ones((2, 3), np.uint8), i=np.int32(3), f=np.float64(0.25), b=np.bool_(True))
            for _ in range(2)
        ]
    )
    assert batch.a.dtype == torch.uint8 and batch.a.shape == (2, 2, 3)
    assert batch.i.dtype == torch.int64 and batch.i.tolist() == [3, 3]
    assert batch.f.dtype == torch.float32 and batch.f.tolist() == [0.25, 0.25]
    assert batch.b.dtype == torch.bool


def test_stacking_keeps_autograd():
    a, b = torch.ones(2, requires_grad=True), torch.zeros(2, requires_grad=True)
    batch = srforge.Entry.collate([srforge.Entry(x=a), srforge.Entry(x=b)])
    batch.x.sum().backward()
    assert a.grad.tolist() == [1.0, 1.0]


def test_other_objects_are_collected():
    o1, o2 = object(), object()
    assert srforge.Entry.collate([srforge.Entry(o=o1), srforge.Entry(o=o2)]).o == [o1, o2]


# -- errors of collate ------------------------------------------------------------------------------
def test_collate_of_nothing_is_a_value_error():
    with pytest.raises(ValueError, match="empty list"):
        srforge.Entry.collate([])


def test_samples_with_different_keys_name_the_missing_and_extra_keys():
    with pytest.raises(ValueError, match=r"sample 1 .*missing \['mask'\], extra \['labels'\]"):
        srforge.Entry.collate([srforge.Entry(image=1, mask=2), srforge.Entry(image=1, labels=2)])
    with pytest.raises(ValueError, match=r"field 'meta' of sample 1.*missing \['b'\]"):
        srforge.Entry.collate([srforge.Entry(meta={"a": 1, "b": 2}), srforge.Entry(meta={"a": 1})])


def test_collate_rejects_non_mapping_samples():
    with pytest.raises(TypeError, match="sample 1.*list"):
        srforge.Entry.collate([srforge.Entry(a=1), [1]])


def test_plain_dict_samples_give_a_batched_entry():
    batch = srforge.Entry.collate([{"a": 1}, {"a": 2}])
    assert isinstance(batch, srforge.Entry) and batch.is_batched and batch.a.tolist() == [1, 2]


# -- is_batched, batch_size, len -----------------------------------------------------------------
def test_len_of_a_batch_is_its_size_and_of_a_sample_a_type_error():
    batch = srforge.Entry.collate([srforge.Entry(x=1)] * 3)
    assert len(batch) == 3
    with pytest.raises(TypeError, match="unbatched Entry"):
        len(batch[0])
    assert bool(batch[0])  # truth does not go through len()


def test_batch_size_of_a_hand_built_entry_is_inferred_from_its_first_tensor_or_list():
    assert srforge.Entry(name="x", image=torch.zeros(5, 3, 2, 2)).batch_size == 5
    assert srforge.Entry(scale=3, names=["a", "b"]).batch_size == 2
    assert srforge.Entry(meta={"t": torch.zeros(7)}).batch_size == 7
    with pytest.raises(ValueError, match="Cannot infer batch size"):
        srforge.Entry(name="x", scale=3).batch_size


def test_hand_built_batch_can_be_indexed_and_flagged():
    e = srforge.Entry(image=torch.arange(6).view(3, 2), scale=4, gain=torch.tensor(0.5))
    assert torch.equal(e[1].image, torch.tensor([2, 3])) and e[1].scale == 4
    assert e[2].gain.item() == 0.5  # 0-dim values have no batch dim: every sample shares them
    e.is_batched = True
    assert "is_batched" not in e and len(e) == 3


# -- indexing: integers remove the batch dim, slices keep it -----------------------------------------
def _three():
    return srforge.Entry.collate(
        [srforge.Entry(name=f"scene_04{i}", image=torch.full((3, 4, 4), float(i)), meta={"k": i}) for i in range(3)]
    )


def test_integer_index_removes_the_batch_dimension_and_clears_is_batched():
    sample = _three()[0]
    assert sample.image.shape == (3, 4, 4)
    assert sample.name == "scene_040"
    assert not sample.is_batched
    assert sample.meta["k"].item() == 0  # nested dicts are indexed too


def test_negative_indices_count_from_the_end():
    assert _three()[-1].name == "scene_042"
    assert _three()[-3].name == "scene_040"


def test_out_of_range_index_is_an_index_error_with_the_batch_size():
    with pytest.raises(IndexError, match="Index 3 is out of range for a batch of size 3"):
        _three()[3]
    with pytest.raises(IndexError, match="-4 is out of range"):
        _three()[-4]


def test_slice_keeps_the_batch_dimension_and_is_batched():
    sub = _three()[0:1]
    assert sub.image.shape == (1, 3, 4, 4)
    assert sub.name == ["scene_040"]
    assert sub.is_batched and sub.batch_size == 1
    assert sub.meta["k"].tolist() == [0]


def test_slices_with_steps():
    sub = _three()[::2]
    assert sub.name == ["scene_040", "scene_042"] and sub.batch_size == 2
    assert sub.image[:, 0, 0, 0].tolist() == [0.0, 2.0]
    rev = _three()[::-1]
    assert rev.name == ["scene_042", "scene_041", "scene_040"]
    assert _three()[5:].batch_size == 0


def test_string_keys_still_reach_fields():
    assert _three()["name"] == ["scene_040", "scene_041", "scene_042"]


def test_unbatch_gives_the_samples():
    samples = _three().unbatch()
    assert [s.name for s in samples] == ["scene_040", "scene_041", "scene_042"]
    assert all(not s.is_batched for s in samples)


def test_round_trip_invariant_of_the_seed():
    t1, t2 = torch.randn(3, 5, 5), torch.randn(3, 5, 5)
    e1, e2 = srforge.Entry(name="s1", image=t1), srforge.Entry(name="s2", image=t2)
    batch = srforge.Entry.collate([e1, e2])
    r1 = batch[0]
    assert r1.name == "s1" and torch.equal(r1.image, e1.image)
    assert same(srforge.Entry.collate(batch.unbatch()), batch)


def test_subclasses_survive_collate_and_indexing():
    class Scan(srforge.Entry):
        pass

    batch = srforge.Entry.collate([Scan(a=1), Scan(a=2)])
    assert type(batch) is Scan and type(batch[0]) is Scan and type(batch[:1]) is Scan


# -- devices, pickling, repr -----------------------------------------------------------------------
def test_to_returns_a_new_entry_with_moved_tensors_and_the_same_state():
    batch = _three()
    moved = batch.to("cpu", non_blocking=False)
    assert moved is not batch and same(moved, batch)
    as_double = batch.to(torch.float64)
    assert as_double.image.dtype == torch.float64 and batch.image.dtype == torch.float32
    assert as_double.is_batched and as_double.batch_size == 3
    assert as_double.meta["k"].dtype == torch.float64


def test_pin_memory_returns_a_new_entry_and_keeps_the_structure(monkeypatch):
    # Page-locked memory needs an accelerator; the structure is what Entry owns, so stand one in.
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self, device=None: pinned.append(1) or self.clone())
    batch = _three()
    out = batch.pin_memory()
    assert out is not batch and same(out, batch) and len(pinned) == 2
    from torch.utils.data._utils.pin_memory import pin_memory as loader_pin

    via_loader = loader_pin(batch)
    assert same(via_loader, batch) and via_loader.is_batched


@pytest.mark.skipif(not torch.cuda.is_available(), reason="page-locked memory needs CUDA")
def test_pin_memory_pins_for_real():
    assert _three().pin_memory().image.is_pinned()


def test_pickle_and_copy_keep_the_batch_state():
    batch = _three()
    for clone in (pickle.loads(pickle.dumps(batch)), copy.copy(batch), copy.deepcopy(batch), batch.copy()):
        assert same(clone, batch) and clone.batch_size == 3


def test_repr_shows_shapes_and_state():
    text = repr(_three())
    assert "batched, B=3" in text and "image=Tensor[3, 3, 4, 4] float32" in text and "scene_040" in text
    assert repr(_three()[0]).startswith("Entry(sample:")


# -- property: random nested samples survive collate -> unbatch -> collate ---------------------------
_shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)
_tensors = st.builds(
    lambda shape, seed: torch.randn(shape, generator=torch.Generator().manual_seed(seed)), _shapes, st.integers(0, 99)
)
_leaf_kinds = {
    "tensor": _tensors,
    "str": st.text(max_size=5),
    "int": st.integers(-(2**40), 2**40),
    "float": st.floats(-1e6, 1e6, allow_nan=False, width=32),
    "bool": st.booleans(),
    "list": st.lists(st.integers(0, 9), max_size=3),
}


@st.composite
def _samples(draw):
    """B samples sharing one random nested schema; each field may be None in some samples."""
    b = draw(st.integers(1, 4))
    schema = draw(
        st.dictionaries(
            st.sampled_from("abcdef"), st.sampled_from(sorted(_leaf_kinds) + ["dict"]), min_size=1, max_size=4
        )
    )
    inner = draw(st.dictionaries(st.sampled_from("xyz"), st.sampled_from(sorted(_leaf_kinds)), min_size=1, max_size=2))
    nullable = draw(st.sets(st.sampled_from(sorted(schema))))
    samples = []
    for _ in range(b):
        fields = {}
        for key, kind in schema.items():
            if key in nullable and draw(st.booleans()):
                fields[key] = None
            elif kind == "dict":
                fields[key] = {k: draw(_leaf_kinds[v]) for k, v in inner.items()}
            else:
                fields[key] = draw(_leaf_kinds[kind])
        samples.append(srforge.Entry(fields))
    return samples


@settings(max_examples=100, deadline=None)
@given(_samples())
def test_property_collate_unbatch_collate_is_unchanged(samples):
    batch = srforge.Entry.collate(samples)
    assert batch.batch_size == len(samples)
    again = srforge.Entry.collate(batch.unbatch())
    assert same(again, batch)
    # And each sample comes back with its values (numbers as 0-dim tensors of the collated dtype).
    for original, recovered in zip(samples, batch.unbatch()):
        for key, value in original.items():
            got = recovered[key]
            if isinstance(value, (bool, int, float)):  # a 0-dim tensor, or raw where the field had None
                assert torch.as_tensor(got).item() == pytest.approx(value)
            elif isinstance(value, dict):  # numbers inside come back as 0-dim tensors, like at the top level
                assert set(got) == set(value)
                for k, v in value.items():
                    inner = got[k]
                    if isinstance(v, (bool, int, float)):
                        assert torch.as_tensor(inner).item() == pytest.approx(v)
                    elif isinstance(v, torch.Tensor):
                        assert torch.equal(inner, v)
                    else:
                        assert inner == v
            elif isinstance(value, torch.Tensor):
                assert torch.equal(got, value)
            else:
                assert got == value
