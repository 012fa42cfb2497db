"""ONNX export of a trained model: dynamic batch, height and width, and the padding-aware ``sizes`` input.

Any model that meets srforge.models.contract exports; the exported graph takes what the PyTorch model takes::

    image   uint8 [B, C, H, W]   H and W any multiples of the size divisor (pad each scan bottom-right)
    sizes   int64 [B, 2]         true (H, W) of each scan: only for a padding-aware model (:func:`takes_sizes`)
    logits  float32 [B, K, H, W] (crop each scan back to its true size)

and records ``size_divisor``, ``class_names``, ``padding_aware`` and ``in_channels`` in the model's metadata
(``onnxruntime.InferenceSession(...).get_modelmeta().custom_metadata_map``), so a deployment needs no srforge.

Export goes through ``torch.onnx.export(..., dynamo=True)``, which needs ``onnx`` and ``onnxscript``: the
optional extra ``pip install -e ".[export]"`` (which also installs ``onnxruntime``, used by :func:`check_onnx`).
H and W are declared as multiples of the divisor (``Dim("h_blocks") * d``), which lets the exporter prove the
model's own divisibility check true for every size instead of fixing one.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from srforge.atomic import atomic_write
from srforge.data.collate import AlignedCollate
from srforge.extras import MissingExtraError
from srforge.geometry import crop_to_sizes

EXTRA = 'pip install -e ".[export]"'
# The check runs the model on three scans of these sizes, in units of the divisor d plus an offset, so that
# each needs its own alignment gutter and the batch pads them to different extents.
CHECK_SIZES = ((1, 3, 2, 5), (2, -7, 1, -4), (0, 17, 3, -1))  # (H = a*d + b, W = c*d + e)
TOLERANCE = 1e-4


def takes_sizes(model: torch.nn.Module) -> bool:
    """Whether the exported graph takes ``sizes``: exactly when the model says its logits depend on them with
    ``padding_aware = True`` (srforge.models.contract); without the attribute the graph takes the image alone and
    the model is traced with ``sizes=None``."""
    return bool(getattr(model, "padding_aware", False))


class OnnxCheckError(RuntimeError):
    """onnxruntime's logits differ from PyTorch's by more than the tolerance."""


def require(*modules: str) -> None:
    """Import each module or raise MissingExtraError (an ImportError) naming the missing one and the extra that
    installs it."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise MissingExtraError(
            f"ONNX export needs {', '.join(missing)}, which is not installed: install the optional extra with "
            f"`{EXTRA}` (onnx, onnxscript and onnxruntime)."
        )


def _example(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """An example batch for tracing: image uint8 [2, C, 2d, 3d], sizes int64 [2, 2].

    Batch 2 and unequal multiples keep the exporter from specialising a dimension to 1 or tying H to W.
    """
    d = model.size_divisor
    image = torch.zeros(2, model.in_channels, 2 * d, 3 * d, dtype=torch.uint8)
    sizes = torch.tensor([[2 * d, 3 * d], [d + 1, 2 * d - 1]], dtype=torch.int64)
    return image, sizes


def export_onnx(model: torch.nn.Module, path: str | os.PathLike, class_names=None, opset: int | None = None) -> Path:
    """Export ``model`` (any model meeting srforge.models.contract) to ``path`` (written atomically); returns the path.

    The graph has inputs ``image`` uint8 [B, C, H, W] and, for a padding-aware model, ``sizes`` int64 [B, 2],
    and the output ``logits`` [B, K, H, W]; B is free, H and W free multiples of ``model.size_divisor``.
    """
    require("onnx", "onnxscript")
    from torch.export import Dim

    from srforge.export.fast_graph import export_copy

    model = model.eval()
    d = model.size_divisor
    image, sizes = _example(model)
    batch = Dim("batch", min=1)
    image_dims = {0: batch, 2: Dim("h_blocks", min=1) * d, 3: Dim("w_blocks", min=1) * d}
    # Shapes by position, not by name: the model's forward may call its parameters anything.
    if takes_sizes(model):
        args, names, dynamic = (image, sizes), ["image", "sizes"], (image_dims, {0: batch})
    else:
        args, names, dynamic = (image,), ["image"], (image_dims,)
    with warnings.catch_warnings():
        # The exporter notes that `batch` names two axes (image and sizes): that is the intent.
        warnings.filterwarnings("ignore", message="# The axis name")
        program = torch.onnx.export(
            export_copy(model)[0],  # the padding-aware norms in fewer passes (srforge.export.fast_graph)
            args,
            dynamo=True,
            dynamic_shapes=dynamic,
            input_names=names,
            output_names=["logits"],
            opset_version=opset,
            verbose=False,
        )
    names = class_names if class_names is not None else [f"class_{c}" for c in range(model.num_classes)]
    program.model.metadata_props.update(
        {
            "size_divisor": str(d),
            "class_names": ",".join(names),
            "padding_aware": str(takes_sizes(model)).lower(),
            "in_channels": str(model.in_channels),
        }
    )
    data = program.model_proto.SerializeToString()
    return atomic_write(path, lambda f: f.write(data))


def check_inputs(metadata: Mapping[str, str], image, sizes=None) -> None:
    """A ValueError naming what is wrong with an exported model's inputs, before onnxruntime sees them (it would
    answer with an opaque broadcast error): ``image`` [B, C, H, W] with C = ``in_channels`` and H, W multiples of
    ``size_divisor``; ``sizes`` [B, 2] (padding-aware models) of true sizes between 1 and (H, W). ``metadata`` is
    the model's ``custom_metadata_map``."""
    d, channels = int(metadata["size_divisor"]), int(metadata["in_channels"])
    shape = tuple(image.shape)
    if len(shape) != 4 or shape[1] != channels:
        raise ValueError(f"image: expected [B, {channels}, H, W], found {list(shape)}")
    if shape[2] % d or shape[3] % d:
        raise ValueError(
            f"image: H and W must be multiples of the size divisor {d}, found {shape[2]} x {shape[3]}; pad each "
            f"scan bottom-right to {-(-shape[2] // d) * d} x {-(-shape[3] // d) * d} and pass its true size in sizes"
        )
    if metadata.get("padding_aware") != "true":
        return
    if sizes is None or tuple(sizes.shape) != (shape[0], 2):
        raise ValueError(f"sizes: expected int64 [{shape[0]}, 2], found {None if sizes is None else list(sizes.shape)}")
    for i, (h, w) in enumerate(sizes.tolist()):
        if not (1 <= h <= shape[2] and 1 <= w <= shape[3]):
            raise ValueError(
                f"sizes[{i}] = ({h}, {w}): a true size must lie within the image, 1..{shape[2]} x 1..{shape[3]}"
            )


def run_onnx(session, image, sizes=None):
    """``logits`` float32 [B, K, H, W] of an exported model in an onnxruntime ``session``, after
    :func:`check_inputs`; ``image`` uint8 and ``sizes`` int64 numpy arrays."""
    check_inputs(session.get_modelmeta().custom_metadata_map, image, sizes)
    names = {i.name for i in session.get_inputs()}
    feed = {"image": image, "sizes": sizes}
    return session.run(["logits"], {k: v for k, v in feed.items() if k in names})[0]


def check_scans(in_channels: int, divisor: int, seed: int = 0) -> list[torch.Tensor]:
    """Three random uint8 scans [C, H_i, W_i] of different sizes, none a multiple of ``divisor``."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(max(1, a * divisor + b), max(1, c * divisor + e)) for a, b, c, e in CHECK_SIZES]
    return [torch.randint(0, 256, (in_channels, h, w), dtype=torch.uint8, generator=generator) for h, w in shapes]


def check_onnx(model: torch.nn.Module, path: str | os.PathLike, tolerance: float = TOLERANCE) -> float:
    """Run the exported model in onnxruntime against ``model``; returns max |logits difference|.

    Three scans of different sizes are predicted batched (padded together by AlignedCollate) and each alone
    (padded to its own multiple of the divisor); logits are compared on each scan's true extent. Raises
    OnnxCheckError when the difference exceeds ``tolerance``, ImportError naming the extra without onnxruntime.
    """
    require("onnxruntime")
    import onnxruntime

    model = model.eval()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name for i in session.get_inputs()}
    scans = check_scans(model.in_channels, model.size_divisor)
    collate = AlignedCollate(model.size_divisor, pad={"image": 0})
    worst, where = 0.0, ""
    for label, group in [("batched", scans)] + [(f"scan {i} alone", [s]) for i, s in enumerate(scans)]:
        batch = collate([{"image": s} for s in group])
        feed = {"image": batch["image"].numpy(), "sizes": batch["sizes"].numpy()}
        got = torch.from_numpy(session.run(["logits"], {k: v for k, v in feed.items() if k in inputs})[0])
        with torch.no_grad():
            want = model(batch["image"], batch["sizes"] if "sizes" in inputs else None)
        if got.shape != want.shape:
            raise OnnxCheckError(
                f"{path}: onnxruntime gave logits {list(got.shape)} for {label}, PyTorch {list(want.shape)}."
            )
        for i, (a, b) in enumerate(zip(crop_to_sizes(got, batch["sizes"]), crop_to_sizes(want, batch["sizes"]))):
            diff = float((a - b).abs().max())
            diff = diff if diff == diff else float("inf")  # NaN counts as the worst
            if diff > worst:
                worst, where = diff, f"{label}, scan {tuple(batch['sizes'][i].tolist())}"
    if worst > tolerance:
        raise OnnxCheckError(
            f"{path}: onnxruntime's logits differ from PyTorch's by up to {worst:.3g} ({where}); expected at most "
            f"{tolerance:g}. The export does not reproduce the model: report it with your torch and onnxscript "
            "versions."
        )
    return worst
