"""Batched inference and crop-back: scans of any size in, class maps of exactly their size out.

    scans [C, H_i, W_i] -> size-grouped batches under a pixel budget -> AlignedCollate(size_divisor)
        -> model(image, sizes) -> logits [B, K, Hp, Wp] -> class map on the device (uint8)
        -> crop to each scan's (H_i, W_i) -> host

Only the uint8 class maps cross to the host; softmax probabilities are computed (on the device) only when
asked for, and cross as float16 when written to files. A scan whose aligned size alone exceeds the budget is
tiled (srforge.predict.tiling). A CUDA out-of-memory error is not a failure: the batch is split in halves and
retried, then a single scan is tiled with ever smaller tiles; only a scan that fails as one smallest tile
(2d x 2d, d = the size divisor) raises. :func:`srforge.predict.pipeline.predict_archive` runs a Predictor over
a whole archive.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from srforge.config import import_object
from srforge.config.trust import check_checkpoint_model
from srforge.constants import CPU_PIXELS, PRECISIONS
from srforge.data.collate import AlignedCollate
from srforge.data.sampling import SizeGroupedBatchSampler
from srforge.geometry import aligned_size
from srforge.models.class_map import class_map
from srforge.models.contract import check_attributes, with_sizes
from srforge.predict.onnx_model import is_onnx_path
from srforge.predict.tiling import predict_tiled, tile_grid, tile_shape
from srforge.runtime.checkpoint import class_names_or_default, load_checkpoint, model_from_checkpoint
from srforge.runtime.device import autocast, resolve_device
from srforge.runtime.device_memory import cuda_pixel_budget, is_out_of_memory, processes_per_device
from srforge.tta import flip_probabilities, tta_mode

# Padded pixels per batch on the CPU: srforge.constants.CPU_PIXELS (a full-scale 640 x 6,400 scan fits; wider ones
# are tiled). On CUDA the default comes from the device: its prediction share of the free memory over the model's
# bytes per pixel (srforge.runtime.device_memory). ``max_batch`` values: "auto" -> no cap on scans, and on CPU
# batches of at most CPU_BATCH_PIXELS; None or 0 -> no cap; n >= 1 -> n scans at most.
#
# On CPU a forward costs a fixed few ms (Python, one oneDNN call per layer) whatever its size, so tiny scans are worth
# batching, while batches of bigger scans run slower per scan than one at a time (benchmarks/bench_predict.py
# --tiny, docs/performance.md): past CPU_BATCH_PIXELS a scan goes alone.
CPU_BATCH_PIXELS = 2**16
# A CPU batch of at most this many padded pixels runs on one intra-op thread: each oneDNN convolution opens a parallel
# region, whose threads must all be scheduled before the convolution ends; for a few thousand pixels the work is
# microseconds, while on a busy machine the wait for a descheduled thread is a scheduler slice.
ONE_THREAD_PIXELS = CPU_BATCH_PIXELS
AUTO_BATCH_PIXELS = {"cpu": CPU_BATCH_PIXELS}
_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def batch_cap(max_batch: int | str | None, device: torch.device) -> int | None:
    """The one reading of ``max_batch`` as scans per batch at most, or None for no cap.

    "auto" -> no cap (on CPU :func:`batch_pixels` bounds the batch instead); None or 0 -> no cap; n >= 1 -> n.
    Anything else is a ValueError naming the value.
    """
    if max_batch == "auto":
        return None
    if max_batch is None or (isinstance(max_batch, int) and not isinstance(max_batch, bool) and max_batch >= 0):
        return max_batch or None
    raise ValueError(f"max_batch must be 'auto', None, 0 (no cap) or an int >= 1, got {max_batch!r}")


def batch_pixels(max_batch: int | str | None, device: torch.device, max_pixels: int) -> int:
    """Padded pixels a planned batch may hold: ``max_pixels``, or with ``max_batch="auto"`` at most
    AUTO_BATCH_PIXELS for the device type (CPU: CPU_BATCH_PIXELS, so only small scans share a batch). A scan over
    it but within ``max_pixels`` is a batch alone, not tiled."""
    if max_batch == "auto":
        return min(max_pixels, AUTO_BATCH_PIXELS.get(device.type, max_pixels))
    return max_pixels


def fingerprint(model: torch.nn.Module, class_names: Sequence[str], image_mode: str, tta: str | None = None) -> str:
    """32 hex digits naming what decides a prediction: every weight and buffer of ``model`` (name, dtype, shape,
    values), the class names, the PIL mode scans are decoded to and the test-time augmentation (``tta``, when
    not None: flipped views change the prediction). The same weights give the same fingerprint
    whichever checkpoint file holds them (last.pt and a copy of it). The run's settings (device, precision, pixel
    budget, batch cap, tile overlap) do not enter it: they move a prediction by rounding and tile seams at most,
    and a rerun with other settings is meant to skip what is done."""
    named = (list(class_names), image_mode) if tta is None else (list(class_names), image_mode, tta)
    digest = hashlib.sha256(repr(named).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name} {tensor.dtype} {tuple(tensor.shape)};".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()[:32]


@dataclass
class Prediction:
    """One scan's result on the host: ``mask`` uint8 [H, W] class ids; ``probabilities`` [K, H, W] or None;
    ``tiles``: how many tiles it was predicted in (1: the whole scan at once).

    On CUDA the copies to the host may still be in flight: :meth:`wait` before reading them.
    """

    mask: torch.Tensor
    probabilities: torch.Tensor | None = None
    ready: Any = None  # a torch.cuda.Event recorded after the copies, or None
    tiles: int = 1

    def wait(self) -> Prediction:
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None
        return self


class Predictor:
    """A trained model (srforge's UNet or any model meeting srforge.models.contract) ready for inference on scans
    of any size.

    ``predict(images)`` -> class maps; ``probabilities(images)`` -> softmax maps; both take a list of scans
    [C, H, W] (uint8 0..255, or float 0..1) and return one result a scan at its exact (H, W), computed in
    size-grouped batches of at most ``max_pixels`` padded pixels (default: CPU_PIXELS on CPU; on CUDA
    measured from the device and the model, see :func:`srforge.runtime.device_memory.cuda_pixel_budget`).
    A scan whose aligned size alone exceeds the budget is tiled, tiles overlapping by ``overlap`` px
    (default 4 * size_divisor). ``max_batch`` caps scans per batch (:func:`batch_cap`; "auto" on CPU:
    batches of at most CPU_BATCH_PIXELS, :func:`batch_pixels`). ``precision``: fp32,
    bf16 or fp16 (autocast). ``image_mode`` is the PIL mode scans are decoded to (default from the model's
    input channels: L, RGB or RGBA). A model whose forward takes the image alone is wrapped to take ``sizes``
    (srforge.models.contract.with_sizes). ``tta``: None or "none", or "flip" (srforge.tta: the softmax
    probabilities averaged over the scan and its three mirror images, each mirrored within the scan's extent).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        class_names: Sequence[str] | None = None,
        device="cpu",
        precision: str = "fp32",
        max_pixels: int | None = None,
        overlap: int | None = None,
        image_mode: str | None = None,
        max_batch: int | str | None = "auto",
        tta: str | None = None,
    ):
        self.tta = tta_mode(tta)
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be {', '.join(PRECISIONS[:-1])} or {PRECISIONS[-1]}, got {precision!r}")
        self.device = resolve_device(device)
        if self.device.type == "cuda":
            # Events, pinned copies and the cuBLAS handle follow the current device: make it this one, so that a
            # process on cuda:N (a torchrun rank) neither waits on nor allocates on cuda:0.
            torch.cuda.set_device(self.device)
        check_attributes(model, "Predictor")
        model = with_sizes(model)  # a forward that takes the image alone is called without sizes
        self.model = model.to(self.device).eval()
        self.divisor, self.num_classes = model.size_divisor, model.num_classes
        if self.num_classes > 256:
            raise ValueError(f"masks are written as uint8 PNG: at most 256 classes, the model has {self.num_classes}")
        self.class_names = class_names_or_default(class_names, self.num_classes)
        self.precision = precision
        self.max_batch = batch_cap(max_batch, self.device)
        self.overlap = 4 * self.divisor if overlap is None else int(overlap)
        if self.overlap < 0:
            raise ValueError(f"Tile overlap must be >= 0 px, found {self.overlap}.")
        self.image_mode = image_mode or _MODES.get(model.in_channels)
        if self.image_mode is None:
            raise ValueError(f"no PIL mode for a {model.in_channels}-channel model; pass image_mode")
        self.collate = AlignedCollate(self.divisor, pad={"image": 0})
        if max_pixels is None:
            max_pixels = (
                cuda_pixel_budget(self.model, self.device, precision, sharing=processes_per_device())
                if self.device.type == "cuda"
                else CPU_PIXELS
            )
        self.max_pixels = int(max_pixels)
        self.batch_pixels = batch_pixels(max_batch, self.device, self.max_pixels)
        if self.max_pixels < 4 * self.divisor**2:
            raise ValueError(
                f"max_pixels={self.max_pixels} is below one {2 * self.divisor}x{2 * self.divisor} tile "
                f"(size_divisor {self.divisor}); raise it"
            )
        self.timings: list | None = None  # set to [] to record the time of every model call (busy_seconds)
        self._fingerprint: str | None = None

    @property
    def fingerprint(self) -> str:
        """The model's :func:`fingerprint`, computed once: every output file is marked with it."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint(self.model, self.class_names, self.image_mode, self.tta)
        return self._fingerprint

    @property
    def runtime(self) -> str:
        """What runs the model, for the report: PyTorch on a device and precision, or ONNX Runtime's provider."""
        return getattr(self.model, "runtime", f"pytorch {self.device} {self.precision}")

    @classmethod
    def from_onnx(cls, path, *, threads: int | None = None, providers=None, **options) -> Predictor:
        """The Predictor of an exported model (srforge-export's .onnx), run by ONNX Runtime
        (:class:`srforge.predict.onnx_model.OnnxModel`: divisor, classes and channels from its metadata, checked
        against its graph); ``threads``: its intra-op threads (default: the CPUs). Tensors stay on the host, so
        ``precision`` is fp32 and ``device`` the CPU; ``options`` are Predictor's other keywords."""
        from srforge.predict.onnx_model import OnnxModel

        options.pop("device", None)
        model = OnnxModel(path, threads=threads, providers=providers)
        return cls(model, class_names=model.class_names, device="cpu", **options)

    @classmethod
    def from_checkpoint(cls, path, *, device="auto", allow_model: Sequence[str] = (), **options) -> Predictor:
        """The Predictor a checkpoint describes: model, weights, divisor, classes, normalisation, image mode.

        The model is rebuilt from the checkpoint alone (:func:`srforge.runtime.checkpoint.model_from_checkpoint`).
        Its class is imported only when srforge.config.trust.check_checkpoint_model allows it: srforge's own, or
        one named in ``allow_model`` ("module:Class", the CLI's --allow-model); else a ConfigError (a ValueError)
        saying how to allow it.
        ``options`` are Predictor's keywords (precision, max_pixels, overlap, max_batch, tta). The image mode is the
        checkpoint's ``image_mode``, else its training config's, else the model's input channels'. A ``.onnx`` file
        is an exported model: :meth:`from_onnx`.
        """
        if is_onnx_path(path):
            return cls.from_onnx(path, **options)
        ckpt = load_checkpoint(path)
        model_class = check_checkpoint_model(ckpt, path, allow_model)
        # A class the user named may live in the working directory; srforge's own come from the package alone.
        resolve = functools.partial(import_object, key=f"{path}: model_class") if model_class in allow_model else None
        model = model_from_checkpoint(ckpt, path, allowed=[model_class], **({"resolve": resolve} if resolve else {}))
        names = ckpt["class_names"]
        if names and len(names) != model.num_classes:
            raise ValueError(
                f"{path}: {len(names)} class names for a model of {model.num_classes} classes; a checkpoint "
                "needs one name per class (model.class_names in the training config)"
            )
        mode = ckpt.get("image_mode")
        return cls(model, class_names=names, device=device, image_mode=mode, **options)

    # -- planning ---------------------------------------------------------------------------------------
    def aligned_area(self, size: tuple[int, int]) -> int:
        """Padded pixels of one scan of (H, W) on its own."""
        height, width = aligned_size(*size, self.divisor)
        return height * width

    def plan(self, sizes: Sequence[tuple[int, int]]) -> list[list[int]]:
        """Indices into ``sizes`` grouped into batches of at most ``batch_pixels`` padded pixels and ``max_batch``
        scans (a scan over ``batch_pixels`` alone)."""
        if not sizes:
            return []
        batches = SizeGroupedBatchSampler(sizes, max_pixels=self.batch_pixels, divisor=self.divisor, shuffle=False)
        step = self.max_batch or len(sizes)
        return [batch[j : j + step] for batch in batches for j in range(0, len(batch), step)]

    def collate_images(self, images: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """{"image": [B, C, Hp, Wp], "sizes": [B, 2]} on the host; pinned on CUDA so the copy overlaps."""
        batch = self.collate([{"image": image} for image in images])
        if self.device.type == "cuda":
            batch["image"] = batch["image"].pin_memory()
        return batch

    # -- inference --------------------------------------------------------------------------------------
    @torch.inference_mode()
    def _run(self, batch: dict[str, torch.Tensor], probs_dtype: torch.dtype | None) -> list[Prediction]:
        """One padded batch on the device, no budget check -> one Prediction a scan (copies maybe in flight)."""
        cuda = self.device.type == "cuda"
        image = batch["image"].to(self.device, non_blocking=True)
        sizes = batch["sizes"]
        with self.timed(), self._threads(image):
            scores = self._scores(image, sizes.to(self.device, non_blocking=True))
            masks = class_map(scores, dim=1, dtype=torch.uint8)  # uint8: an eighth of int64's bytes to write
            probs = None
            if probs_dtype is not None:
                probs = (scores if self.tta else scores.float().softmax(1)).to(probs_dtype)
        out = [
            Prediction(self._to_host(masks[b, :h, :w]), None if probs is None else self._to_host(probs[b, :, :h, :w]))
            for b, (h, w) in enumerate(sizes.tolist())
        ]
        if cuda:
            # Blocking: a writer thread waiting on it sleeps instead of spinning a core. Recorded on this device's
            # stream, where the copies run (the current device is set to it in __init__).
            ready = torch.cuda.Event(blocking=True)
            ready.record(torch.cuda.current_stream(self.device))
            for prediction in out:
                prediction.ready = ready
        return out

    def _scores(self, image: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """[B, K, Hp, Wp] on the device: the logits, or with ``tta`` the averaged probabilities (argmax alike).
        The model gets its own copy of ``sizes``: what it does to it is never what srforge crops and reports with."""
        with autocast(self.device, self.precision):
            if self.tta is None:
                return self.model(image, sizes.clone())
            return flip_probabilities(lambda view: self.model(view, sizes.clone()), image, sizes)

    @contextlib.contextmanager
    def _threads(self, image: torch.Tensor):
        """On CPU, run a batch ``image`` [B, C, Hp, Wp] of at most ONE_THREAD_PIXELS padded pixels on one intra-op
        thread (torch's setting is restored after); anything else as set."""
        threads = torch.get_num_threads()
        if (
            self.device.type != "cpu"
            or threads == 1
            or image.shape[0] * image.shape[-2] * image.shape[-1] > ONE_THREAD_PIXELS
        ):
            yield
            return
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def _to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.device.type != "cuda":
            return tensor.contiguous()
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        return host.copy_(tensor, non_blocking=True)

    @contextlib.contextmanager
    def timed(self):
        """Add the time of the device work inside the block to ``timings``, when it is a list (else do nothing).
        On CUDA a pair of events, read by :meth:`busy_seconds`; elsewhere seconds."""
        if self.timings is None:
            yield
        elif self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(torch.cuda.current_stream(self.device))
            yield
            end.record(torch.cuda.current_stream(self.device))
            self.timings.append((start, end))
        else:
            start = time.perf_counter()
            yield
            self.timings.append(time.perf_counter() - start)

    def busy_seconds(self) -> float:
        """Seconds the device spent in model calls since ``timings`` was set to [] (synchronises on CUDA)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return sum(start.elapsed_time(end) for start, end in self.timings or []) / 1000
        return float(sum(self.timings or []))

    def _forget_oom(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def infer(
        self,
        images: Sequence[torch.Tensor],
        probs_dtype: torch.dtype | None = None,
        batch: dict[str, torch.Tensor] | None = None,
    ) -> list[Prediction]:
        """Predictions for one planned batch of scans [C, H_i, W_i] (``batch``: their collate, if made already).

        Probabilities are computed only when ``probs_dtype`` is given. Out of memory: the batch is split in
        halves and each retried; a single scan is tiled, with tiles halved until one 2d x 2d tile per batch.
        """
        if len(images) == 1 and self.aligned_area(tuple(images[0].shape[-2:])) > self.max_pixels:
            return [self._tiled(images[0], probs_dtype, self.max_pixels)]
        try:
            return self._run(batch if batch is not None else self.collate_images(images), probs_dtype)
        except RuntimeError as error:  # OutOfMemoryError is one
            if not is_out_of_memory(error):
                raise
            # leave the except block first, so the failed attempt's tensors can be freed
        batch = None
        self._forget_oom()
        if len(images) > 1:
            half = len(images) // 2
            return self.infer(images[:half], probs_dtype) + self.infer(images[half:], probs_dtype)
        return [self._tiled(images[0], probs_dtype, self.aligned_area(tuple(images[0].shape[-2:])) // 2)]

    def _tiled(self, image: torch.Tensor, probs_dtype: torch.dtype | None, budget: int) -> Prediction:
        """One scan in tiles of at most ``budget`` pixels, halving the tiles on out-of-memory."""
        smallest = 4 * self.divisor**2
        budget = max(smallest, budget)

        def run(tiles: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
            return [(p.wait().mask, p.probabilities) for p in self._run(self.collate_images(tiles), probs_dtype)]

        while True:
            tile = tile_shape(*image.shape[-2:], budget, self.divisor)
            try:
                mask, probs = predict_tiled(
                    run, image, tile, self.overlap, self.divisor, max(1, budget // (tile[0] * tile[1]))
                )
                rows, columns = tile_grid(*image.shape[-2:], tile, self.overlap, self.divisor)
                return Prediction(mask, probs, tiles=len(rows) * len(columns))
            except RuntimeError as error:
                if not is_out_of_memory(error) or (tile[0] * tile[1] <= smallest and budget <= smallest):
                    raise
            self._forget_oom()
            budget = max(smallest, min(budget, tile[0] * tile[1]) // 2)

    def _check(self, images: Sequence[torch.Tensor]) -> None:
        for i, image in enumerate(images):
            channels = self.model.in_channels
            if not isinstance(image, torch.Tensor) or image.ndim != 3 or image.shape[0] != channels:
                found = tuple(image.shape) if isinstance(image, torch.Tensor) else type(image).__name__
                raise ValueError(f"Predictor: image {i} must be a tensor [{channels}, H, W], found {found}")
            if image.dtype != torch.uint8 and not image.is_floating_point():
                raise TypeError(f"Predictor: image {i} is {image.dtype}; give uint8 (0..255) or float (0..1)")

    def _predict_in_batches(self, images: Sequence[torch.Tensor], probs_dtype: torch.dtype | None) -> list[Prediction]:
        """One finished Prediction a scan [C, H_i, W_i], in the order given, computed in planned batches."""
        self._check(images)
        out: list[Prediction | None] = [None] * len(images)
        for batch in self.plan([tuple(image.shape[-2:]) for image in images]):
            for i, prediction in zip(batch, self.infer([images[i] for i in batch], probs_dtype)):
                out[i] = prediction.wait()
        return out

    def probabilities(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Softmax probabilities float32 [K, H_i, W_i] for scans [C, H_i, W_i], in the order given."""
        return [p.probabilities for p in self._predict_in_batches(images, torch.float32)]

    def predict(self, images: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Class maps int64 [H_i, W_i] for scans [C, H_i, W_i] (uint8, or float in [0, 1])."""
        return [p.mask.long() for p in self._predict_in_batches(images, None)]
