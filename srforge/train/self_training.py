"""Self-training on unlabelled scans (``train.self_training``, ``data.unlabelled``): the EMA teacher labels them,
the student learns from the pixels the teacher is sure of (mean teacher; DACS and DAFormer take synthetic-to-real
street scenes the same way).

Each optimizer update, after its labelled batches' backward (and their valid-pixel rescaling) and before the
gradients are averaged across ranks, takes one batch of this rank's unlabelled stream
(:class:`srforge.data.unlabelled.UnlabelledStream`):

1. the teacher (``trainer.averaged``, the EMA of the weights) predicts the padded batch at the scans' true sizes;
2. :func:`pseudo_labels`: each pixel's most likely class where its probability is at least ``confidence`` (with
   ``balance``, at least its class's own threshold, the median of the batch's pixels of that class when lower),
   else the ignore index; padding and anything outside a scan's size are the ignore index too;
3. :meth:`SelfTraining.student_view`: each scan, cut to its true extent, goes through ``augment`` (a data.augment
   recipe without ``scale``) with its pseudo-labels, seeded by the stream's position, so that geometric steps move
   both alike (pixels an affine leaves empty get no label);
4. the student's cross-entropy over the labelled pixels of that view (with ``balance``, each class's mean, averaged
   over the classes present), times ``weight``, is added to the gradients.

A teacher that is rarely sure of a thin class (curves: a few per cent of the pixels) labels almost nothing but
background at a global threshold, and the student then learns to miss curves: ``balance`` is for that.

It starts at ``start_epoch`` (1-based), so that the teacher has learned something from the labelled scans first.
The update's row sums (loss, batches, confident pixels, real pixels) become the metrics row's ``unlabelled_loss``
(mean over the epoch's updates) and ``confident_share`` (confident pixels over the scans' real pixels).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from srforge.config import ConfigError
from srforge.config.schema import SELF_TRAINING
from srforge.constants import IGNORE_INDEX
from srforge.data.crop import sample_seed
from srforge.data.unlabelled import STREAM_SEED, UnlabelledStream
from srforge.geometry import valid_mask
from srforge.runtime import distributed
from srforge.runtime.device import autocast
from srforge.train.update import no_sync


def pseudo_labels(
    logits: torch.Tensor,
    sizes: torch.Tensor,
    confidence: float,
    ignore_index: int = IGNORE_INDEX,
    balanced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels int64 [B, H, W], confident bool [B, H, W]) from the teacher's ``logits`` [B, K, H, W] of a padded
    batch with true ``sizes`` [B, 2]: the most likely class where its probability is >= the threshold and the pixel
    lies within its scan, else ``ignore_index``.

    The threshold is ``confidence``; ``balanced``: each class's own, at most ``confidence``: the median probability
    of the batch's pixels predicted as that class (class-balanced self-training, Zou et al., ECCV 2018), so that the
    more confident half of a thin class's pixels is learned even when the teacher is rarely sure of it.
    """
    probability, label = logits.float().softmax(dim=1).max(dim=1)
    within = valid_mask(sizes, logits.shape[-2], logits.shape[-1])[:, 0]
    threshold = torch.full((logits.shape[1],), float(confidence), device=logits.device)
    if balanced:
        for c in label[within].unique().tolist():
            mine = probability[within & (label == c)]
            threshold[c] = torch.minimum(threshold[c], mine.kthvalue((mine.numel() + 1) // 2).values)
    confident = (probability >= threshold[label]) & within
    return label.masked_fill(~confident, ignore_index), confident


class SelfTraining:
    """The unlabelled half of each update (module docstring). ``stream`` gives the batches; ``weight``,
    ``confidence``, ``start_epoch`` and ``augment`` are train.self_training's keys; ``seed`` is run.seed."""

    def __init__(  # noqa: PLR0913 (train.self_training's keys)
        self,
        stream: UnlabelledStream,
        *,
        weight: float = 1.0,
        confidence: float = 0.9,
        start_epoch: int = 1,
        augment: Mapping | None = None,
        balance: bool = False,
        ignore_index: int = IGNORE_INDEX,
        seed: int = 0,
    ):
        self.stream, self.weight, self.confidence, self.balance = stream, float(weight), float(confidence), balance
        self.start_epoch, self.ignore_index, self.seed = int(start_epoch), ignore_index, seed
        self.augment = None
        if augment:
            from srforge.data.augment import build_augmentation  # torchvision's transforms: only with a recipe

            self.augment = build_augmentation(augment, ignore_index=ignore_index)
        self.sums: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None  # the running update's sums, until it is taken

    @classmethod
    def from_config(cls, spec: Mapping, stream: UnlabelledStream, *, ignore_index: int, seed: int) -> SelfTraining:
        """train.self_training's ``spec``, its missing keys at their defaults (srforge.config.schema.SELF_TRAINING)."""
        return cls(stream, **{**SELF_TRAINING, **dict(spec)}, ignore_index=ignore_index, seed=seed)

    def active(self, epoch: int) -> bool:
        """Whether the 0-based ``epoch`` learns from the unlabelled scans."""
        return epoch + 1 >= self.start_epoch

    def start_pass(self, device: torch.device) -> None:
        """Zero the pass's sums: float64 [4] (loss sum, batches, confident pixels, real pixels) on ``device``."""
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)

    def student_view(self, image: torch.Tensor, labels: torch.Tensor, sizes: list) -> tuple:
        """(image, labels) as the student sees them: each scan's true extent (``sizes``, [(h, w), ...]) through
        ``augment`` with its labels (image uint8 [B, C, H, W], labels int64 [B, H, W]; padding unchanged), seeded by
        the batch's place in the stream. Without a recipe, the same tensors."""
        if self.augment is None:
            return image, labels
        image, labels = image.clone(), labels.clone()
        pass_, done = self.stream.cursor
        devices = [image.device] if image.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(sample_seed(self.seed + STREAM_SEED, pass_, done, "student"))
            for b, (h, w) in enumerate(sizes):
                view, target = self.augment.transform_unbatched(image[b, :, :h, :w], labels[b, :h, :w])
                image[b, :, :h, :w], labels[b, :h, :w] = view, target
        return image, labels

    def backward(self, trainer) -> torch.Tensor:
        """The unlabelled loss of the stream's next batch (module docstring), its gradients times ``weight`` added
        to ``trainer``'s (DDP's no_sync: the update's one all-reduce follows); returns the loss, detached."""
        batch = self.stream.next()
        device, precision = trainer.device, trainer.settings.precision
        image = batch.image.to(device, non_blocking=True)
        sizes = batch.sizes.to(device, non_blocking=True)
        if trainer.settings.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        teacher = trainer.averaged
        if teacher is None:
            raise ConfigError(
                "train.self_training: the teacher is the EMA of the weights, and this Trainer has none; set train.ema "
                "(or give the Trainer an EMAHook)."
            )
        teacher.eval()
        with torch.no_grad(), autocast(device, precision):
            taught = teacher(image, sizes.clone())
        labels, confident = pseudo_labels(taught, sizes, self.confidence, self.ignore_index, self.balance)
        del taught
        image, labels = self.student_view(image, labels, batch.sizes.tolist())  # the host's copy: no sync
        counted = (labels != self.ignore_index).sum()
        with no_sync(trainer.net):
            with autocast(device, precision):
                logits = trainer.net(image, sizes.clone())
            loss = self.student_loss(logits, labels, counted)
            trainer.scaler.scale(loss * self.weight).backward()
        real = sizes.prod(1).sum()
        self.pending = torch.stack([loss.detach().double(), torch.ones_like(real).double(),
                                    confident.sum().double(), real.double()])  # fmt: skip
        return loss.detach()

    def student_loss(self, logits: torch.Tensor, labels: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the student's ``logits`` [B, K, H, W] on the pseudo-``labels`` [B, H, W]: the mean over
        the ``counted`` labelled pixels, or with ``balance`` the mean over the classes present of each class's mean
        (a thin class weighs as much as the background around it)."""
        if not self.balance:
            loss = F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="sum")
            return loss / counted.clamp_min(1)
        each = F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="none")
        kept = labels != self.ignore_index
        k = logits.shape[1]
        ids = labels.masked_fill(~kept, 0).flatten()
        sums = torch.zeros(k, device=logits.device).index_add(0, ids, (each * kept).flatten())
        counts = torch.zeros(k, device=logits.device).index_add(0, ids, kept.flatten().float())
        present = counts > 0
        return (sums / counts.clamp_min(1) * present).sum() / present.sum().clamp_min(1)

    def commit(self, stepped: bool) -> None:
        """The update is done: its batch too (the stream's checkpointed position moves past it); its numbers count
        in the pass's sums when the update was ``stepped`` (a non-finite one skipped leaves them out)."""
        self.stream.commit()
        if stepped and self.pending is not None:
            self.sums += self.pending
        self.pending = None

    def row(self) -> dict[str, float]:
        """The pass's ``unlabelled_loss`` and ``confident_share``, summed across ranks (None before start_epoch)."""
        loss, batches, confident, real = distributed.reduce_sum(self.sums.clone()).tolist()
        return {
            "unlabelled_loss": loss / batches if batches else None,
            "confident_share": confident / real if real else None,
        }

    def state_dict(self) -> dict:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.stream.load_state_dict(state)
