"""TrainSettings: the plain numbers a Trainer runs by, each the ``train.*`` (or ``data.*``) key of the same name."""

from __future__ import annotations

from dataclasses import dataclass, fields

from srforge.constants import IGNORE_INDEX


@dataclass
class TrainSettings:
    """How a :class:`srforge.train.trainer.Trainer` trains (the defaults are the config's).

    ``epochs`` to train in all, at most ``stop_after`` of them in one :meth:`~Trainer.train` call (None: all);
    ``accumulate`` batches per optimizer update; ``precision`` fp32 | bf16 | fp16 (autocast); ``grad_clip`` bound on
    the gradient norm (None or 0: none); ``val_every`` epochs between validations (and after the last);
    ``log_every`` updates between the progress bar's reads; ``skip_nonfinite``: skip a batch whose loss is NaN or
    infinite instead of stopping; ``channels_last`` memory format of images and model; ``compile``: torch.compile
    the model; ``ignore_index``: the mask value that marks pixels without a class (padding is filled with it);
    ``seed`` (``run.seed``): with the step and the rank, it seeds what the model draws in an update (dropout).
    """

    epochs: int = 1
    stop_after: int | None = None
    accumulate: int = 1
    precision: str = "fp32"
    grad_clip: float | None = 1.0
    val_every: int = 1
    log_every: int = 2
    skip_nonfinite: bool = False
    channels_last: bool = False
    compile: bool = False
    ignore_index: int = IGNORE_INDEX
    seed: int = 0

    @classmethod
    def from_config(cls, cfg) -> TrainSettings:
        """The settings of a resolved config: its ``train`` keys of these names, ``data.ignore_index`` and
        ``run.seed``."""
        names = [f.name for f in fields(cls) if f.name not in ("ignore_index", "seed")]
        return cls(**{name: cfg.train[name] for name in names}, ignore_index=cfg.data.ignore_index, seed=cfg.run.seed)
