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
   With ``mix`` (DACS's ClassMix, Tranheden et al., WACV 2021), before the augmentation each unlabelled scan first
   gets the foreground pixels (every class but 0) of one of the update's labelled scans pasted over it, aligned at
   the top-left and cut to both extents, labelled with their true classes (:func:`class_mix`): the student keeps
   seeing curves on the target's paper, labelled truly, where the teacher alone would label mostly background;
4. the student's cross-entropy over the labelled pixels of that view (with ``balance``, each class's mean, averaged
   over the classes present), times ``weight``, is added to the gradients.

A teacher that is rarely sure of a thin class (curves: a few per cent of the pixels) labels almost nothing but
background at a global threshold, and the student then learns to miss curves: ``balance`` is for that.

A part of the batch that runs out of memory, in the teacher or the student, is redone in halves, as the labelled
batches are; the student's halves are each normalised by the whole batch's labelled pixels, so that their sum is the
batch's loss. A scan the teacher cannot hold alone skips the update's unlabelled batch; one the student cannot hold
alone is left out of it (each said on the console). The stream's batches stay cut by the budget the run started
with.

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
from srforge.runtime.device_memory import is_out_of_memory
from srforge.train.update import backward_or_none, halves, no_sync


def teacher_guess(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probability float32 [B, H, W], class int64 [B, H, W]) of the most likely class of ``logits`` [B, K, H, W]."""
    return logits.float().softmax(dim=1).max(dim=1)


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
    probability, label = teacher_guess(logits)
    return confident_labels(probability, label, sizes, logits.shape[1], confidence, ignore_index, balanced)


def confident_labels(
    probability: torch.Tensor,
    label: torch.Tensor,
    sizes: torch.Tensor,
    num_classes: int,
    confidence: float,
    ignore_index: int = IGNORE_INDEX,
    balanced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pseudo_labels` from the teacher's guess (:func:`teacher_guess`, [B, H, W] each, of ``num_classes``
    classes), which parts of a batch may have given separately."""
    within = valid_mask(sizes, label.shape[-2], label.shape[-1])[:, 0]
    threshold = torch.full((num_classes,), float(confidence), device=label.device)
    if balanced:
        for c in label[within].unique().tolist():
            mine = probability[within & (label == c)]
            threshold[c] = torch.minimum(threshold[c], mine.kthvalue((mine.numel() + 1) // 2).values)
    confident = (probability >= threshold[label]) & within
    return label.masked_fill(~confident, ignore_index), confident


def class_mix(
    image: torch.Tensor,
    labels: torch.Tensor,
    sizes: list,
    labelled: tuple[torch.Tensor, torch.Tensor, list],
    ignore_index: int = IGNORE_INDEX,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ClassMix of an unlabelled batch (``image`` uint8 [B, C, H, W], pseudo-``labels`` int64 [B, H, W], true
    ``sizes`` [(h, w), ...]) with a labelled one (``labelled``: image uint8 [L, C, H', W'], mask [L, H', W'], sizes
    [(h, w), ...]): scan b takes labelled scan b mod L's foreground pixels (class not 0 nor ``ignore_index``) where
    both scans extend (top-left aligned), image and class alike. New tensors; padding untouched."""
    image, labels = image.clone(), labels.clone()
    source, mask, extents = labelled
    for b, (h, w) in enumerate(sizes):
        j = b % source.shape[0]
        hh, ww = min(h, extents[j][0]), min(w, extents[j][1])
        classes = mask[j, :hh, :ww].long()
        paste = (classes != 0) & (classes != ignore_index)
        image[b, :, :hh, :ww] = torch.where(paste, source[j, :, :hh, :ww].to(image.dtype), image[b, :, :hh, :ww])
        labels[b, :hh, :ww] = torch.where(paste, classes, labels[b, :hh, :ww])
    return image, labels


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
        mix: bool = False,
        ignore_index: int = IGNORE_INDEX,
        seed: int = 0,
    ):
        self.stream, self.weight, self.confidence, self.balance = stream, float(weight), float(confidence), balance
        self.mix, self.labelled = mix, None
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

    def remember(self, image: torch.Tensor, mask: torch.Tensor, sizes: torch.Tensor) -> None:
        """With ``mix``: keep the update's latest labelled batch (image uint8 [L, C, H, W] and mask [L, H, W] on the
        device, sizes [L, 2] on the host) for :func:`class_mix`; otherwise nothing is kept."""
        if self.mix:
            self.labelled = (image, mask, sizes.tolist())

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
        device = trainer.device
        image = batch.image.to(device, non_blocking=True)
        sizes = batch.sizes.to(device, non_blocking=True)
        if trainer.settings.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        guess = self.teach(trainer, image, sizes, batch.name)
        real = sizes.prod(1).sum()
        if guess is None:  # a scan the teacher cannot hold alone: no unlabelled loss in this update
            self.pending = torch.stack([torch.zeros((), dtype=torch.float64, device=device)] * 3 + [real.double()])
            return torch.zeros((), device=device)
        k = trainer.num_classes
        labels, confident = confident_labels(*guess, sizes, k, self.confidence, self.ignore_index, self.balance)
        del guess
        if self.mix and self.labelled is not None:
            image, labels = class_mix(image, labels, batch.sizes.tolist(), self.labelled, self.ignore_index)
        self.labelled = None
        image, labels = self.student_view(image, labels, batch.sizes.tolist())  # the host's copy: no sync
        kept = labels != self.ignore_index
        ids = labels.masked_fill(~kept, 0).flatten()
        counts = torch.zeros(k, device=device).index_add(0, ids, kept.flatten().float())  # the whole batch's
        totals = (kept.sum(), counts)
        loss, parts = torch.zeros((), device=device), [(0, image.shape[0])]
        while parts:
            lo, hi = parts.pop(0)
            part = (image[lo:hi], labels[lo:hi], sizes[lo:hi])
            done = backward_or_none(trainer.params, lambda: self.student_step(trainer, part, totals), device)
            if done is None and hi - lo > 1:
                parts[:0] = halves(lo, hi)
            elif done is None:
                print(f"srforge: out of memory: the unlabelled scan {batch.name[lo]} alone does not fit the student's "
                      f"step at step {trainer.step}; left out of this update")  # fmt: skip
            else:
                loss = loss + done
        self.pending = torch.stack([loss.double(), torch.ones_like(real).double(),
                                    confident.sum().double(), real.double()])  # fmt: skip
        return loss

    def teach(self, trainer, image: torch.Tensor, sizes: torch.Tensor, names) -> tuple | None:
        """The teacher's guess (:func:`teacher_guess`) of the padded batch, part by part when a part runs out of
        memory (halves); None when a single scan does not fit (said on the console)."""
        teacher = trainer.averaged
        if teacher is None:
            raise ConfigError(
                "train.self_training: the teacher is the EMA of the weights, and this Trainer has none; set train.ema "
                "(or give the Trainer an EMAHook)."
            )
        teacher.eval()
        guesses, parts = [], [(0, image.shape[0])]
        while parts:
            lo, hi = parts.pop(0)
            try:
                with torch.no_grad(), autocast(trainer.device, trainer.settings.precision):
                    guesses.append(teacher_guess(teacher(image[lo:hi], sizes[lo:hi].clone())))
            except RuntimeError as error:
                if not is_out_of_memory(error):
                    raise
                if trainer.device.type == "cuda":
                    torch.cuda.empty_cache()
                if hi - lo == 1:
                    print(f"srforge: out of memory: the unlabelled scan {names[lo]} alone does not fit the teacher at "
                          f"step {trainer.step}; this update goes without its unlabelled batch")  # fmt: skip
                    return None
                parts[:0] = halves(lo, hi)
        if len(guesses) == 1:
            return guesses[0]
        return torch.cat([g[0] for g in guesses]), torch.cat([g[1] for g in guesses])

    def student_step(self, trainer, part: tuple, totals: tuple) -> torch.Tensor:
        """Forward, loss (a share of the batch's: ``totals`` are its labelled pixels, all and per class) and backward
        of the student on ``part`` (image, pseudo-labels, sizes); the loss, detached."""
        image, labels, sizes = part
        with no_sync(trainer.net):
            with autocast(trainer.device, trainer.settings.precision):
                logits = trainer.net(image, sizes.clone())
            loss = self.student_loss(logits, labels, *totals)
            trainer.scaler.scale(loss * self.weight).backward()
        return loss.detach()

    def student_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, counted: torch.Tensor, counts: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-entropy of the student's ``logits`` [B, K, H, W] on the pseudo-``labels`` [B, H, W]: the sum over
        their labelled pixels over the batch's ``counted`` ones, or with ``balance`` the mean over the classes
        present of each class's sum over its batch count ``counts`` [K] (a thin class weighs as much as the
        background around it; ``counts`` of ``labels`` themselves when None). A batch done in parts gives each
        part the batch's counts: the parts' losses add up to the batch's."""
        if not self.balance:
            loss = F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="sum")
            return loss / counted.clamp_min(1)
        each = F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="none")
        kept = labels != self.ignore_index
        k = logits.shape[1]
        ids = labels.masked_fill(~kept, 0).flatten()
        sums = torch.zeros(k, device=logits.device).index_add(0, ids, (each * kept).flatten())
        if counts is None:
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
