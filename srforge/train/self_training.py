"""Self-training on unlabelled scans (``train.self_training``, ``data.unlabelled``): the EMA teacher labels them,
the student learns from the pixels the teacher is sure of (mean teacher; DACS and DAFormer take synthetic-to-real
street scenes the same way).

Each optimizer update, after its labelled batches' backward (and their valid-pixel rescaling) and before the
gradients are averaged across ranks, takes one batch of this rank's unlabelled stream
(:class:`srforge.data.unlabelled.UnlabelledStream`):

1. the teacher (``trainer.averaged``, the EMA of the weights; with ``teacher``, the fixed model of that checkpoint,
   :func:`srforge.train.teacher.load_teacher`) predicts the padded batch at the scans' true sizes;
   with ``tta: flip``, its class probabilities are the mean over each scan and its three mirror images, each
   mirrored within the scan's own extent (srforge.tta, as predict.py's ``--tta flip``): a mark the teacher
   makes in one orientation only is less often sure, at four teacher passes instead of one;
2. :func:`pseudo_labels`: each pixel's most likely class where its probability is at least ``confidence`` (one
   threshold, or a list of one a class; with ``balance``, at least its class's own threshold, the median of the
   batch's pixels of that class when lower), else the ignore index; padding and anything outside a scan's size are
   the ignore index too;
3. :meth:`SelfTraining.student_view`: each scan, cut to its true extent, goes through ``augment`` (a data.augment
   recipe without ``scale``) with its pseudo-labels, seeded by the stream's position, so that geometric steps move
   both alike (pixels an affine leaves empty get no label);
   With ``mix`` true or labelled (DACS's ClassMix, Tranheden et al., WACV 2021), before the augmentation each
   unlabelled scan first gets the foreground pixels (every class but 0) of one of the update's labelled scans pasted
   over it, aligned at the top-left and cut to both extents, labelled with their true classes (:func:`class_mix`):
   the student keeps seeing curves on the target's paper, labelled truly, where the teacher alone would label mostly
   background.
   With ``mix: mirror`` each scan instead gets its own confident foreground pixels, mirrored left-right within its
   extent, pasted over it (:func:`mirror_mix`): curves crossing curves, in the archive's own look;
4. the student's cross-entropy over the labelled pixels of that view (with ``balance``, each class's mean, averaged
   over the classes present), plus, with ``skeleton``, that weight times the skeleton recall loss on the view's
   pseudo-labels (:meth:`SelfTraining.tubes`, made on the device), all times ``weight``, is added to the gradients.

A teacher that is rarely sure of a thin class (curves: a few per cent of the pixels) labels almost nothing but
background at a global threshold, and the student then learns to miss curves: ``balance`` is for that. The
cross-entropy of a curve's pseudo-labels is mostly its wide parts' and the background's; ``skeleton`` (Skeleton
Recall, Kirchhoff et al., ECCV 2024, as ``train.skeleton_weight`` on labelled scans) asks the student to cover the
medial line of every confident curve piece, a faint thin stretch as much as a bold one.

A part of the batch that runs out of memory, in the teacher or the student, is redone in halves, as the labelled
batches are, and later batches start in parts no larger than the last that was tried; the student's halves are each
normalised by the whole batch's labelled pixels (and the skeleton term by its (scan, class) pairs with a tube), so
that their sum is the batch's loss. The tubes are made for the whole batch before its parts (a few bytes a pixel,
against the student's many channels). A scan the teacher cannot hold alone skips the update's unlabelled batch;
one the student cannot hold alone is left out of it (its pixels still in the normaliser, so that loss is a little
smaller), each said on the console. A batch none of whose scans
decodes teaches nothing either. Every update takes exactly one batch on every rank, so that the ranks' positions in
their streams (the checkpoint keeps rank 0's) stay alike. The stream's batches stay cut by the budget the run
started with.

It starts at ``start_epoch`` (1-based), so that the teacher has learned something from the labelled scans first. A
fixed teacher has learned already: an earlier run's model (a first round of self-training, or the model a user
trained on synthetic scans) labels the archive for a fresh student from epoch 1 (Noisy Student, Xie et al., CVPR
2020, trains each round's student afresh on its teacher's labels), and train.ema is then optional.
The update's row sums (loss, batches, confident pixels, real pixels) become the metrics row's ``unlabelled_loss``
(mean over the epoch's updates of the student's unlabelled loss, its skeleton term included, before ``weight``)
and ``confident_share`` (confident pixels over the scans' real pixels).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from srforge.config import ConfigError
from srforge.config.preflight import TEACHER
from srforge.config.schema import SELF_TRAINING, mix_mode
from srforge.constants import IGNORE_INDEX
from srforge.data.crop import sample_seed
from srforge.data.skeleton import skeleton_tube
from srforge.data.unlabelled import STREAM_SEED, UnlabelledStream
from srforge.geometry import valid_mask
from srforge.runtime import distributed
from srforge.runtime.device import autocast
from srforge.runtime.device_memory import is_out_of_memory
from srforge.train.losses import skeleton_recalls
from srforge.train.update import backward_or_none, each_part, no_sync, parts_of, scans_within
from srforge.tta import flip_probabilities, tta_mode


def teacher_guess(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probability float32 [B, H, W], class int64 [B, H, W]) of the most likely class of ``logits`` [B, K, H, W]."""
    return logits.float().softmax(dim=1).max(dim=1)


def flip_guess(teacher, image: torch.Tensor, sizes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probability float32 [B, H, W], class int64 [B, H, W]): the most likely class of ``teacher``'s softmax
    averaged over each scan of the padded ``image`` [B, C, H, W] and its mirror images within its true extent
    (``sizes`` [B, 2]; srforge.tta.flip_probabilities); padding's values are those of padding."""
    return flip_probabilities(lambda view: teacher(view, sizes.clone()), image, sizes).max(dim=1)


def pseudo_labels(
    logits: torch.Tensor,
    sizes: torch.Tensor,
    confidence: float | Sequence[float],
    ignore_index: int = IGNORE_INDEX,
    balanced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels int64 [B, H, W], confident bool [B, H, W]) from the teacher's ``logits`` [B, K, H, W] of a padded
    batch with true ``sizes`` [B, 2]: the most likely class where its probability is >= the threshold and the pixel
    lies within its scan, else ``ignore_index``.

    The threshold is ``confidence``, one for every class or a list of K, one a class (a stricter one for a thin
    class whose false marks the student would learn); ``balanced``: each class's own, at most that: the median
    probability of the batch's pixels predicted as that class (class-balanced self-training, Zou et al., ECCV 2018),
    so that the more confident half of a thin class's pixels is learned even when the teacher is rarely sure of it.
    """
    probability, label = teacher_guess(logits)
    return confident_labels(probability, label, sizes, logits.shape[1], confidence, ignore_index, balanced)


def confident_labels(
    probability: torch.Tensor,
    label: torch.Tensor,
    sizes: torch.Tensor,
    num_classes: int,
    confidence: float | Sequence[float] | torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
    balanced: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pseudo_labels` from the teacher's guess (:func:`teacher_guess`, [B, H, W] each, of ``num_classes``
    classes), which parts of a batch may have given separately. ``confidence`` may also be :func:`class_thresholds`'
    tensor on the guess's device (left unchanged)."""
    within = valid_mask(sizes, label.shape[-2], label.shape[-1])[:, 0]
    if isinstance(confidence, torch.Tensor):
        threshold = confidence.clone()  # ``balanced`` lowers its entries in place
    else:
        threshold = class_thresholds(confidence, num_classes, label.device)
    if balanced:
        for c in label[within].unique().tolist():
            mine = probability[within & (label == c)]
            threshold[c] = torch.minimum(threshold[c], mine.kthvalue((mine.numel() + 1) // 2).values)
    confident = (probability >= threshold[label]) & within
    return label.masked_fill(~confident, ignore_index), confident


def class_thresholds(confidence: float | Sequence[float], num_classes: int, device=None) -> torch.Tensor:
    """float32 [K] on ``device``: ``confidence`` for every class, or its K values one a class
    (train.self_training.confidence). One number is filled on the device, so that no copy waits for its queue."""
    if isinstance(confidence, numbers.Real):
        return torch.full((num_classes,), float(confidence), device=device)
    if len(confidence) != num_classes:
        raise ValueError(
            f"train.self_training.confidence: expected one threshold or {num_classes} (one a class), found "
            f"{len(confidence)}: {list(confidence)}."
        )
    return torch.tensor([float(c) for c in confidence], device=device)


def class_mix(
    image: torch.Tensor,
    labels: torch.Tensor,
    sizes: list,
    labelled: tuple[torch.Tensor, torch.Tensor, list],
    ignore_index: int = IGNORE_INDEX,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ClassMix of an unlabelled batch (``image`` uint8 [B, C, H, W], pseudo-``labels`` int64 [B, H, W], true
    ``sizes`` [(h, w), ...]) with a labelled one (``labelled``: image [L, C, H', W'], uint8 or float in [0, 1], mask
    [L, H', W'], sizes [(h, w), ...]): scan b takes labelled scan b mod L's foreground pixels (class not 0 nor
    ``ignore_index``) where both scans extend (top-left aligned), image and class alike. New tensors; padding
    untouched."""
    source, mask, extents = labelled
    if source.shape[1] != image.shape[1]:
        raise ValueError(
            f"train.self_training.mix: the labelled scans have {source.shape[1]} channel(s) and the unlabelled ones "
            f"{image.shape[1]}; mixing needs the same (read both in the model's image mode)"
        )
    if source.is_floating_point():  # a Dataset's float images in [0, 1], as the models take them
        source = (source.float() * 255).round().clamp(0, 255).to(torch.uint8)
    image, labels = image.clone(), labels.clone()
    for b, (h, w) in enumerate(sizes):
        j = b % source.shape[0]
        hh, ww = min(h, extents[j][0]), min(w, extents[j][1])
        paste_foreground(image, labels, b, source[j, :, :hh, :ww], mask[j, :hh, :ww].long(), ignore_index)
    return image, labels


def paste_foreground(
    image: torch.Tensor, labels: torch.Tensor, b: int, source: torch.Tensor, classes: torch.Tensor, ignore_index: int
) -> None:
    """In place: scan b of ``image`` [B, C, H, W] and ``labels`` [B, H, W] takes, from its top-left corner over
    ``classes``' extent [h, w], the pixels of ``source`` [C, h, w] and their ``classes`` wherever the class is
    foreground (not 0 nor ``ignore_index``): ClassMix's paste, whatever the source."""
    h, w = classes.shape
    paste = (classes != 0) & (classes != ignore_index)
    image[b, :, :h, :w] = torch.where(paste, source.to(image.dtype), image[b, :, :h, :w])
    labels[b, :h, :w] = torch.where(paste, classes, labels[b, :h, :w])


def mirror_mix(
    image: torch.Tensor, labels: torch.Tensor, sizes: list, ignore_index: int = IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """ClassMix of each unlabelled scan with itself (``mix: mirror``): scan b (``image`` uint8 [B, C, H, W],
    pseudo-``labels`` int64 [B, H, W], true ``sizes`` [(h, w), ...]) takes the confident foreground pixels (class not
    0 nor ``ignore_index``) of its own left-right mirror image within its extent, image and class alike, over it.
    A well log's curves run along the width, so the mirrored ones cross its own in their tracks: crowded curves drawn
    as the archive draws them, labelled where the teacher was sure. New tensors; padding untouched."""
    image, labels = image.clone(), labels.clone()
    for b, (h, w) in enumerate(sizes):  # flip copies: the paste never reads what it has written
        paste_foreground(image, labels, b, image[b, :, :h, :w].flip(-1), labels[b, :h, :w].flip(-1), ignore_index)
    return image, labels


class SelfTraining:
    """The unlabelled half of each update (module docstring). ``stream`` gives the batches; ``weight``,
    ``confidence``, ``start_epoch``, ``augment``, ``balance``, ``mix``, ``tta`` and ``skeleton`` are
    train.self_training's keys;
    ``seed`` is run.seed; ``teacher``: a fixed teacher (model, file, sha256: :mod:`srforge.train.teacher`), None
    for the trainer's EMA of the weights."""

    def __init__(  # noqa: PLR0913 (train.self_training's keys)
        self,
        stream: UnlabelledStream,
        *,
        weight: float = 1.0,
        confidence: float | Sequence[float] = 0.9,
        start_epoch: int = 1,
        augment: Mapping | None = None,
        balance: bool = False,
        mix: bool | str = False,
        tta: str = "none",
        ignore_index: int = IGNORE_INDEX,
        seed: int = 0,
        teacher: tuple[torch.nn.Module, str, str] | None = None,
        skeleton: float = 0.0,
    ):
        self.stream, self.weight, self.balance = stream, float(weight), balance
        self.confidence = float(confidence) if isinstance(confidence, numbers.Real) else tuple(map(float, confidence))
        self.thresholds: torch.Tensor | None = None  # float32 [K] on the device, made at the first update
        self.skeleton = float(skeleton)
        self.tta = tta_mode(tta)  # None or "flip"
        self.mix = mix_mode(mix)  # None, labelled or mirror
        self.labelled = None
        self.teacher, self.teacher_file, self.teacher_digest = teacher if teacher is not None else (None,) * 3
        self.teacher_pixels: int | None = None  # the largest unlabelled part tried since one ran out of memory
        self.student_pixels: int | None = None
        self.start_epoch, self.ignore_index, self.seed = int(start_epoch), ignore_index, seed
        self.augment = None
        if augment:
            from srforge.data.augment import build_augmentation  # torchvision's transforms: only with a recipe

            self.augment = build_augmentation(augment, ignore_index=ignore_index)
        self.sums: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None  # the running update's sums, until it is taken

    @classmethod
    def from_config(
        cls, spec: Mapping, stream: UnlabelledStream, *, ignore_index: int, seed: int, teacher: tuple | None = None
    ) -> SelfTraining:
        """train.self_training's ``spec``, its missing keys at their defaults (srforge.config.schema.SELF_TRAINING);
        ``teacher`` is its ``teacher`` key's checkpoint, loaded (:func:`srforge.train.teacher.load_teacher`)."""
        if spec.get("teacher") is not None and teacher is None:
            raise ValueError(
                f"{TEACHER} is {spec['teacher']!r}: pass its model, teacher=srforge.train.teacher.load_teacher(...)"
            )
        keys = {k: v for k, v in {**SELF_TRAINING, **dict(spec)}.items() if k != "teacher"}
        return cls(stream, **keys, ignore_index=ignore_index, seed=seed, teacher=teacher)

    def active(self, epoch: int) -> bool:
        """Whether the 0-based ``epoch`` learns from the unlabelled scans."""
        return epoch + 1 >= self.start_epoch

    def remember(self, image: torch.Tensor, mask: torch.Tensor, sizes: torch.Tensor, epoch: int) -> None:
        """With ``mix`` labelled, in an epoch that learns from the unlabelled scans: keep the update's latest labelled
        batch (image [L, C, H, W] and mask [L, H, W] on the device, sizes [L, 2] on the host) for :func:`class_mix`,
        until the update's unlabelled batch is done; otherwise nothing is kept."""
        if self.mix == "labelled" and self.active(epoch):
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
        to ``trainer``'s (DDP's no_sync: the update's one all-reduce follows); returns the loss, detached. One batch
        an update on every rank, whatever happens to it, so that the ranks' stream positions stay alike."""
        labelled, self.labelled = self.labelled, None
        batch = self.stream.next()
        device = trainer.device
        nothing = torch.zeros((), device=device)
        self.pending = torch.zeros(4, dtype=torch.float64, device=device)  # what a batch that teaches nothing adds
        if batch is None:  # not one of its scans decodes (named by the stream): no unlabelled loss this update
            return nothing
        image = batch.image.to(device, non_blocking=True)
        sizes = batch.sizes.to(device, non_blocking=True)
        if trainer.settings.channels_last:
            image = image.contiguous(memory_format=torch.channels_last)
        guess = self.teach(trainer, image, sizes, batch.name)
        if guess is None:  # a scan the teacher cannot hold alone: no unlabelled loss in this update
            return nothing
        k = trainer.num_classes
        if self.thresholds is None or self.thresholds.device != sizes.device:  # on the device once, not each update
            self.thresholds = class_thresholds(self.confidence, k, sizes.device)
        labels, confident = confident_labels(*guess, sizes, k, self.thresholds, self.ignore_index, self.balance)
        confident, real = confident.sum().double(), sizes.prod(1).sum().double()
        del guess
        if labelled is not None:
            image, labels = class_mix(image, labels, batch.sizes.tolist(), labelled, self.ignore_index)
        elif self.mix == "mirror":
            image, labels = mirror_mix(image, labels, batch.sizes.tolist(), self.ignore_index)
        del labelled
        image, labels = self.student_view(image, labels, batch.sizes.tolist())  # the host's copy: no sync
        tube = self.tubes(labels, sizes) if self.skeleton else None
        totals = self.totals(labels, k, tube)
        loss, taught = nothing, 0

        def attempt(lo: int, hi: int):
            part = (image[lo:hi], labels[lo:hi], sizes[lo:hi], None if tube is None else tube[lo:hi])
            return backward_or_none(trainer.params, lambda: self.student_step(trainer, part, totals), device)

        parts = parts_of(image.shape[0], self.fitting(self.student_pixels, image.shape, trainer))
        for lo, hi, done in each_part(parts, attempt):
            if done is not None:
                loss, taught = loss + done, taught + 1
                continue
            self.student_pixels = self.lowered(self.student_pixels, (hi - lo) // 2, image.shape)
            if hi - lo == 1:
                print(f"srforge: out of memory: the unlabelled scan {batch.name[lo]} alone does not fit the student's "
                      f"step at step {trainer.step}; left out of this update")  # fmt: skip
        if taught:
            self.pending = torch.stack([loss.double(), torch.ones_like(real), confident, real])
        return loss

    def totals(
        self, labels: torch.Tensor, k: int, tube: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """What each part's loss is divided by, so that the parts' losses add up to the batch's: the batch's
        labelled pixels (all, int64; with ``balance`` per class, float64 [K], else None) and, with a ``tube``
        [B, H, W], its (scan, class) pairs that have one (int64, else None)."""
        kept = labels != self.ignore_index
        pairs = None
        if tube is not None:  # class by class: a [B, K-1, H, W] comparison would cost K-1 bytes a pixel at once
            pairs = sum(
                ((tube == c).flatten(1).any(1).sum() for c in range(1, k)), tube.new_zeros((), dtype=torch.int64)
            )
        if not self.balance:
            return kept.sum(), None, pairs
        ids = labels.masked_fill(~kept, 0).flatten()
        counts = torch.zeros(k, dtype=torch.float64, device=labels.device).index_add(0, ids, kept.flatten().double())
        return kept.sum(), counts, pairs

    def tubes(self, labels: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        """The skeleton tube (:func:`srforge.data.skeleton.skeleton_tube`) of each scan's pseudo-``labels``
        [B, H, W] on its true extent (``sizes`` [B, 2]): [B, H, W] on their device, uint8 (int64 past 255
        classes), 0 on padding, on ignored pixels and where no tube. Made for the whole batch at once, on the
        device, each update afresh: the pseudo-labels change as the teacher does."""
        within = valid_mask(sizes, labels.shape[-2], labels.shape[-1])[:, 0]
        return skeleton_tube(labels.masked_fill(~within, self.ignore_index), self.ignore_index)

    @staticmethod
    def fitting(pixels: int | None, shape: torch.Size, trainer) -> int:
        """Scans of a batch ``shape`` [B, C, Hp, Wp] a first part may hold: all, unless this run has run out of
        memory on the unlabelled scans (``pixels``: the largest part tried since) or lowered its pixel budget."""
        budget = getattr(getattr(trainer, "budget", None), "pixels", None)
        limits = [p for p in (pixels, budget) if p is not None]
        return scans_within(min(limits) if limits else None, shape)

    @staticmethod
    def lowered(pixels: int | None, scans: int, shape: torch.Size) -> int:
        """After a part ran out of memory: the pixels of ``scans`` (at least 1) of ``shape``, when fewer."""
        tried = max(1, scans) * shape[-2] * shape[-1]
        return tried if pixels is None else min(pixels, tried)

    def teach(self, trainer, image: torch.Tensor, sizes: torch.Tensor, names) -> tuple | None:
        """The teacher's guess (:func:`teacher_guess`) of the padded batch, part by part when a part runs out of
        memory (halves); None when a single scan does not fit (said on the console)."""
        teacher = trainer.averaged if self.teacher is None else self.teacher
        if teacher is None:
            raise ConfigError(
                "train.self_training: the teacher is the EMA of the weights, and this Trainer has none; set train.ema "
                f"or {TEACHER} (or give the Trainer an EMAHook)."
            )
        teacher.eval()
        guesses = []
        parts = parts_of(image.shape[0], self.fitting(self.teacher_pixels, image.shape, trainer))

        def guess_part(lo: int, hi: int):
            return self.guess_or_none(teacher, image[lo:hi], sizes[lo:hi], trainer)

        for lo, hi, guess in each_part(parts, guess_part):
            if guess is not None:
                guesses.append(guess)
                continue
            if trainer.device.type == "cuda":
                torch.cuda.empty_cache()  # after the except: the failed forward's blocks are free by now
            self.teacher_pixels = self.lowered(self.teacher_pixels, (hi - lo) // 2, image.shape)
            if hi - lo == 1:
                print(f"srforge: out of memory: the unlabelled scan {names[lo]} alone does not fit the teacher at "
                      f"step {trainer.step}; this update goes without its unlabelled batch")  # fmt: skip
                return None
        if len(guesses) == 1:
            return guesses[0]
        return torch.cat([g[0] for g in guesses]), torch.cat([g[1] for g in guesses])

    def guess_or_none(self, teacher, image: torch.Tensor, sizes: torch.Tensor, trainer) -> tuple | None:
        """:func:`teacher_guess` of the teacher's logits for ``image`` [b, C, H, W] (with ``tta`` flip: the most
        likely class of the four views' mean probabilities, :func:`flip_guess`), or None out of memory."""
        try:
            with torch.no_grad(), autocast(trainer.device, trainer.settings.precision):
                if self.tta == "flip":
                    return flip_guess(teacher, image, sizes)
                return teacher_guess(teacher(image, sizes.clone()))
        except RuntimeError as error:
            if not is_out_of_memory(error):
                raise
            return None

    def student_step(self, trainer, part: tuple, totals: tuple) -> torch.Tensor:
        """Forward, loss (a share of the batch's: ``totals`` are :meth:`totals`) and backward of the student on
        ``part`` (image, pseudo-labels, sizes, skeleton tube or None); the loss, detached."""
        image, labels, sizes, tube = part
        counted, counts, pairs = totals
        with no_sync(trainer.net):
            with autocast(trainer.device, trainer.settings.precision):
                logits = trainer.net(image, sizes.clone())
            loss = self.student_loss(logits, labels, counted, counts)
            if tube is not None:
                loss = loss + self.skeleton * self.tube_loss(logits, tube, pairs)
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
        # float64 sums: float32 ones stop counting at 2^24 pixels of a class, which a GPU batch's background passes
        zeros = torch.zeros(k, dtype=torch.float64, device=logits.device)
        sums = zeros.index_add(0, ids, (each * kept).flatten().double())
        if counts is None:  # the labels alone: their own counts, as totals() gives a whole batch's
            counts = self.totals(labels, k)[1]
        present = counts > 0
        return ((sums / counts.clamp_min(1) * present).sum() / present.sum().clamp_min(1)).float()

    @staticmethod
    def tube_loss(logits: torch.Tensor, tube: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
        """The skeleton recall loss of the student's ``logits`` [B, K, H, W] on ``tube`` [B, H, W]: the sum over its
        (scan, class) pairs with a tube of 1 - their soft recall (:func:`srforge.train.losses.skeleton_recalls`),
        over the batch's ``pairs``; a whole batch gives 1 - their mean recall, and its parts add up to that."""
        recall, present = skeleton_recalls(logits, tube)
        return ((1 - recall) * present).sum() / pairs.clamp_min(1)

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
        """The stream's position, and a fixed teacher's file and sha256 (``teacher``, ``teacher_file``), which a
        resume must find again."""
        fixed = {"teacher": self.teacher_digest, "teacher_file": self.teacher_file} if self.teacher_digest else {}
        return {**self.stream.state_dict(), **fixed}

    def load_state_dict(self, state: dict) -> None:
        """Go on from ``state``; a ConfigError when its teacher is not this run's (another file's content, or none):
        the pseudo-labels, and so the weights, would not be those the run started with."""
        saved = state.get("teacher")
        if saved != self.teacher_digest:
            was = f"{state.get('teacher_file')} (sha256 {saved})" if saved else "the EMA of the weights (null)"
            now = f"{self.teacher_file} (sha256 {self.teacher_digest})" if self.teacher_digest else "null, the EMA"
            raise ConfigError(
                f"--resume: this run's teacher was {was}, and {TEACHER} now gives {now}. A resumed run keeps its "
                "teacher, whatever --allow-changes says: restore that file's content (or that setting), or start a "
                "new run."
            )
        self.stream.load_state_dict(state)
