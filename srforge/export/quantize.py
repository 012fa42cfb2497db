"""Static int8 quantisation of an exported model, calibrated on the user's own scans (ONNX Runtime's quantize_static).

    quantize_int8(float_model, output, scans, mode, count)   the exported float model -> an int8 model at output

The convolutions' weights become int8 (per output channel) and their inputs and outputs uint8, with ranges
(min and max) that ONNX Runtime measures by running the float model over calibration scans: ``count`` scans of
``scans`` (a folder, .zip or .tar, read as predict.py reads it), spread evenly over its sorted names, each decoded
in the model's image mode and padded bottom-right to the model's divisor as predict.py pads it (the calibrator keeps
only each convolution's per-channel minima and maxima of a scan, not its activations). Everything else
stays float32: the padding-aware norms' statistics, the upsampling, and the convolution that writes the logits
(8 bits of logits would tie classes that float32 tells apart). A scan
larger than ``CALIBRATION_PIXELS`` (a 544 x 3,200 scan is not) is calibrated on a centred window of that many pixels,
as predict.py tiles a scan over its pixel budget: the float model's run over a 640 x 12,800 scan whole would need
gigabytes.

The int8 model keeps srforge's metadata (divisor, class names, channels) and records how it was calibrated
(``quantization``), so predict.py and evaluate.py take it as they take the float export.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from srforge.atomic import atomic_write
from srforge.data.archive import ARCHIVE_KINDS, ScanArchive
from srforge.data.collate import AlignedCollate

CALIBRATION_COUNT = 8
CALIBRATION_PIXELS = 1 << 21  # a calibration window's pixels at most (about 1,448 x 1,448)
QUANTIZED_OPS = ["Conv"]  # the MatMuls of the norms' statistics stay float32: they are sums, not features


class CalibrationError(ValueError):
    """The calibration scans cannot be read: no such folder or archive, or no scans in it (exit status 2)."""


def calibration_archive(path) -> ScanArchive:
    """The scans at ``path`` (a folder, .zip or .tar) as a ScanArchive; a CalibrationError naming ``path`` when it
    is missing or holds no scans. The caller closes it."""
    path = Path(path)
    if not path.exists():
        raise CalibrationError(f"--calibrate {path}: not found (expected {ARCHIVE_KINDS} of scans to calibrate on)")
    archive = ScanArchive(path)
    if len(archive) == 0:
        archive.close()
        skipped = f"; passed over: {archive.rejected[0][0]} ({archive.rejected[0][1]})" if archive.rejected else ""
        raise CalibrationError(
            f"--calibrate {path}: no scans found (expected images such as .png, .jpg or .tif{skipped}); give the "
            "folder of scans the model will predict"
        )
    return archive


def spread(total: int, count: int) -> list[int]:
    """``count`` indices (at most ``total``) spread evenly over range(total), the first and the last included."""
    count = min(count, total)
    if count <= 1:
        return [0][:count]
    return sorted({round(i * (total - 1) / (count - 1)) for i in range(count)})


def window(image: torch.Tensor, pixels: int = CALIBRATION_PIXELS) -> torch.Tensor:
    """image [C, H, W] -> its centred window [C, h, w] of at most ``pixels`` pixels: the longer side cut first (a
    well log keeps its full width across), both sides when the shorter one alone is too many."""
    _, h, w = image.shape
    if h * w <= pixels:
        return image
    if min(h, w) ** 2 > pixels:
        nh = nw = math.isqrt(pixels)
    else:
        nh, nw = (h, pixels // h) if h <= w else (pixels // w, w)
    top, left = (h - nh) // 2, (w - nw) // 2
    return image[:, top : top + nh, left : left + nw]


def calibration_feeds(archive: ScanArchive, mode: str, divisor: int, count: int) -> Iterator[dict]:
    """One feed a calibration scan: {"image": uint8 [1, C, Hp, Wp], "sizes": int64 [1, 2]} (the true size of its
    window), decoded one at a time so that only one scan is held."""
    collate = AlignedCollate(divisor, pad={"image": 0})
    for i in spread(len(archive), count):
        batch = collate([{"image": window(archive.read(i, mode)).contiguous()}])
        yield {"image": batch["image"].numpy(), "sizes": batch["sizes"].numpy().astype(np.int64)}


def _reader(feeds: Iterator[dict], inputs: set[str]):
    """onnxruntime.quantization's CalibrationDataReader over ``feeds``, each cut to the graph's ``inputs`` (a plain
    model takes no sizes); imported here: onnxruntime is an optional extra."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def get_next(self):
            feed = next(feeds, None)
            return None if feed is None else {name: value for name, value in feed.items() if name in inputs}

    return Reader()


@contextlib.contextmanager
def _quiet_preprocessing_advice():
    """quantize_static logs "Please consider pre-processing before quantization" on the root logger on every call;
    the exported graph is shape-inferred already and ONNX Runtime optimises it at load, so the advice is noise."""

    def keep(record: logging.LogRecord) -> bool:
        return "pre-processing" not in record.getMessage()

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


def quantize_int8(float_model, output, scans, mode: str, count: int = CALIBRATION_COUNT) -> tuple[Path, int]:
    """Write the int8 model of the exported ``float_model`` to ``output`` (atomically), calibrated on ``count``
    scans of ``scans`` decoded in PIL ``mode``; returns (output, scans used). CalibrationError for unusable scans."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    float_model = Path(float_model)
    session = onnxruntime.InferenceSession(str(float_model), providers=["CPUExecutionProvider"])
    metadata = dict(session.get_modelmeta().custom_metadata_map)
    inputs = {i.name for i in session.get_inputs()}
    del session
    graph = onnx.load(str(float_model), load_external_data=False).graph
    outputs = {o.name for o in graph.output}
    heads = [node.name for node in graph.node if node.op_type in QUANTIZED_OPS and set(node.output) & outputs]
    with calibration_archive(scans) as archive, tempfile.TemporaryDirectory(prefix="srforge-int8-") as tmp:
        used = len(spread(len(archive), count))
        feeds = calibration_feeds(archive, mode, int(metadata["size_divisor"]), count)
        with _quiet_preprocessing_advice():
            quantize_static(
                str(float_model),
                os.path.join(tmp, "int8.onnx"),
                _reader(feeds, inputs),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=QUANTIZED_OPS,
                per_channel=True,
                activation_type=QuantType.QUInt8,  # uint8 activations and int8 weights: the CPU's fast int8 kernels
                weight_type=QuantType.QInt8,
                nodes_to_exclude=heads,
                calibrate_method=CalibrationMethod.MinMax,
            )
        model = onnx.load(os.path.join(tmp, "int8.onnx"))
    kept = {**metadata, "quantization": f"int8 static (QDQ, per-channel weights), MinMax on {used} scans of {scans}"}
    del model.metadata_props[:]
    for key, value in kept.items():
        model.metadata_props.add(key=key, value=value)
    data = model.SerializeToString()
    return atomic_write(output, lambda f: f.write(data)), used


def int8_agreement(float_model, int8_model, scans, mode: str) -> tuple[float, int]:
    """(share of mask pixels, pixels): how many of the first calibration scan's (window's) class ids the int8 model
    gives as the float model does, on the scan's true extent."""
    import onnxruntime

    cpu = ["CPUExecutionProvider"]
    sessions = [onnxruntime.InferenceSession(str(path), providers=cpu) for path in (float_model, int8_model)]
    metadata = sessions[0].get_modelmeta().custom_metadata_map
    inputs = {i.name for i in sessions[0].get_inputs()}
    with calibration_archive(scans) as archive:
        feed = next(calibration_feeds(archive, mode, int(metadata["size_divisor"]), 1))
    h, w = feed["sizes"][0].tolist()
    feed = {name: value for name, value in feed.items() if name in inputs}
    masks = [session.run(["logits"], feed)[0][0, :, :h, :w].argmax(0) for session in sessions]
    return float((masks[0] == masks[1]).mean()), int(h * w)
