"""An exported model (srforge-export's ONNX file) as a model the Predictor runs: through ONNX Runtime, not PyTorch.

    OnnxModel(path)    size_divisor, in_channels, num_classes and class names from the file's metadata, checked
                       against the graph with one small run; forward(image [B, C, H, W], sizes [B, 2]) -> logits
                       [B, K, H, W] as a torch tensor, so that batching, tiling, TTA and crop-back are the
                       Predictor's own, exactly as for a checkpoint

ONNX Runtime runs the graph with every graph optimisation (ORT_ENABLE_ALL) on the CPU provider by default, CUDA's
when onnxruntime-gpu and a GPU are there (``providers``). Its intra-op threads are this machine's CPUs
(:func:`onnx_threads`), stated in the report. ``fingerprint`` names the file's bytes, so outputs
of an exported model are marked as its own.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch

from srforge.extras import MissingExtraError

# What srforge-export writes into the model's metadata, each needed here.
METADATA_KEYS = ("size_divisor", "class_names", "padding_aware", "in_channels")
ONNX_MAGIC = b"\x08"  # a ModelProto starts with field 1 (ir_version), a varint: tag byte 0x08


class OnnxModelError(ValueError):
    """The file is not an ONNX model srforge-export wrote, or its metadata does not describe its graph."""


def is_onnx_path(path) -> bool:
    """Whether ``path`` names an exported model (``.onnx``) rather than a checkpoint."""
    return Path(path).suffix.lower() == ".onnx"


def onnx_threads() -> int:
    """ONNX Runtime's intra-op threads: this process's share of the CPUs (all of them, or divided among torchrun's
    processes on the machine), as PyTorch takes them. Decoding workers are not subtracted: they decode a scan in a
    fraction of the time the model takes it and then wait, and a full-size scan took twice as long on one thread of
    two as on both (docs/performance.md)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)  # torchrun's processes on this machine share its CPUs
    return max(1, cpus // max(1, local))


def _session(path: Path, threads: int, providers):
    try:
        import onnxruntime
    except ImportError:
        raise MissingExtraError(
            f"{path}: predicting with an exported model needs onnxruntime: install the optional extra with "
            '`pip install -e ".[export]"` (or onnxruntime-gpu for CUDA)'
        ) from None
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The CPU memory arena on: without it every run maps its activations afresh and faults every page in (a
    # full-size 544 x 3,200 scan's run allocates gigabytes), 15% of a run of full-size scans and tiles of three
    # shapes on two cores (28.0 s against 33.0 s); the arena keeps its largest blocks between runs instead (peak
    # memory 6.6 GB against 3.8 GB for that run; docs/performance.md).
    options.enable_cpu_mem_arena = True
    # No memory pattern: ONNX Runtime plans one per input shape and, on a shape's second run, allocates the whole
    # plan as one new block, which grows the arena and faults every page of it in again (a 640 x 6,528 tile's
    # second run 14.9 s against 8.0 s warm, 10.5 s of it the kernel's; docs/performance.md). An archive's scans and
    # tiles come in many shapes; without the pattern the arena's freed blocks serve every later shape that fits.
    options.enable_mem_pattern = False
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    available = onnxruntime.get_available_providers()
    chosen = providers or [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    try:
        return onnxruntime.InferenceSession(str(path), options, providers=chosen)
    except Exception as error:  # onnxruntime's own exception types: InvalidProtobuf, Fail, NoSuchFile, ...
        raise OnnxModelError(
            f"{path}: not an ONNX model onnxruntime can load ({type(error).__name__}: {str(error)[:200]}); give "
            "a file srforge-export wrote, or a checkpoint (.pt)"
        ) from None


def _metadata(path: Path, session) -> dict[str, str]:
    found = dict(session.get_modelmeta().custom_metadata_map)
    missing = [key for key in METADATA_KEYS if key not in found]
    if missing:
        raise OnnxModelError(
            f"{path}: an ONNX model without srforge's metadata (missing {', '.join(missing)}): srforge needs the "
            "size divisor, class names and input channels srforge-export records; export the checkpoint with "
            "srforge-export, or predict with the checkpoint itself"
        )
    return found


class OnnxModel(torch.nn.Module):
    """The exported model at ``path`` in an ONNX Runtime session of ``threads`` intra-op threads (default
    :func:`onnx_threads`) on ``providers`` (default CUDA's where available, else the CPU's); meets
    srforge.models.contract: ``size_divisor``, ``in_channels``, ``num_classes``, ``padding_aware``, ``class_names``.
    A file that is not ONNX, lacks srforge's metadata, or whose metadata does not match its graph (a divisor or
    channel count the graph refuses, a class count its logits do not have) is an :class:`OnnxModelError`."""

    def __init__(self, path, *, threads: int | None = None, providers=None):
        super().__init__()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such exported model")
        self.threads = onnx_threads() if threads is None else int(threads)
        self.session = _session(self.path, self.threads, providers)
        meta = _metadata(self.path, self.session)
        try:
            self.size_divisor, self.in_channels = int(meta["size_divisor"]), int(meta["in_channels"])
        except ValueError:
            raise OnnxModelError(f"{self.path}: its metadata's size_divisor or in_channels is no number") from None
        self.class_names = meta["class_names"].split(",")
        self.num_classes = len(self.class_names)
        self.padding_aware = meta["padding_aware"] == "true"
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.provider = self.session.get_providers()[0]
        self.runtime = f"onnxruntime {self.provider}, {self.threads} intra-op threads"
        digest = hashlib.sha256(self.path.read_bytes()).digest()
        self.register_buffer("file_sha256", torch.frombuffer(bytearray(digest), dtype=torch.uint8))
        self.check_graph()

    def check_graph(self) -> None:
        """One run on a zero image [1, C, 2d, 3d]: the logits must be [1, K, 2d, 3d] for the metadata's d, C, K."""
        d, c = self.size_divisor, self.in_channels
        image = torch.zeros(1, c, 2 * d, 3 * d, dtype=torch.uint8)
        try:
            logits = self.forward(image, torch.tensor([[2 * d, 3 * d]]))
        except Exception as error:  # onnxruntime's failure on inputs the graph cannot take
            raise OnnxModelError(
                f"{self.path}: its metadata does not describe its graph: a [1, {c}, {2 * d}, {3 * d}] image (the "
                f"metadata's {c} channels, divisor {d}) fails in onnxruntime ({str(error)[:200]})"
            ) from None
        want = (1, self.num_classes, 2 * d, 3 * d)
        if tuple(logits.shape) != want:
            raise OnnxModelError(
                f"{self.path}: its metadata does not describe its graph: logits {list(logits.shape)} for a "
                f"[1, {c}, {2 * d}, {3 * d}] image, where the metadata's {self.num_classes} class names and "
                f"divisor {d} say {list(want)}"
            )

    def forward(self, image: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
        """logits float32 [B, K, H, W] of ``image`` uint8 (or float 0..1) [B, C, H, W], H and W multiples of the
        divisor; ``sizes`` int64 [B, 2] for a padding-aware graph."""
        if image.dtype != torch.uint8:
            image = (image.float() * 255).round().clamp(0, 255).to(torch.uint8)
        feed = {"image": np.ascontiguousarray(image.cpu().numpy())}
        if "sizes" in self.inputs:
            if sizes is None:
                h, w = image.shape[-2:]
                sizes = torch.tensor([[h, w]] * image.shape[0])
            feed["sizes"] = np.ascontiguousarray(sizes.cpu().numpy().astype(np.int64))
        logits = self.session.run(["logits"], feed)[0]
        return torch.from_numpy(logits).to(image.device)

    def extra_repr(self) -> str:
        return f"{self.path}, {self.provider}, {self.threads} threads"
