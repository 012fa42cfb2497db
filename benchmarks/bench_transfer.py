"""Does what srforge's generator teaches hold on well-log scans it did not draw? (issue 30)

Models are trained with srforge's own trainer on srforge's synthetic scans -- its own curves or curves from a LAS
file (``data.synthetic.las``), with domain randomisation off and on (the ``data.synthetic`` key whose name starts
with "random") -- and on the scans of a second, independent renderer (benchmarks/log_plotter.py, which plots real
LAS curves with matplotlib and degrades them like a scan, sharing no code with srforge's generator). Every model
is scored by srforge's evaluator (foreground IoU, micro, and its tolerance F1 within 2 px) on:

- ``dev``: the renderer on the training depths of TOTEM #9, another seed (for tuning the generator on);
- ``test_same_well``: the renderer on TOTEM #9's last 40% of depths, which no training set shows;
- ``test_other_well``: the renderer on Scorpio E1, a well no training set shows;
- ``srforge held-out``: srforge's generator as the quickstart has it (own curves, defaults), another seed.

Beside those, the variants of issue 37 train the randomised generator with what learns from the target scans
without their masks: self-training (``train.self_training``, the teacher's confident pixels) on the renderer's
images drawn with other seeds over the dev and test sets' depths (never the test scans), or, as the archive case,
on the dev and test scans' own images; the thin-structure loss (``train.skeleton_weight``); the ink input
(``model.args.ink``: each scan as its darkness against its own paper); and later rounds, each round's best.pt,
fixed, teaching a fresh student from epoch 1 (``train.self_training.teacher``; choosing a round trains the rounds
before it first). The recipe's two rounds are ``RECIPE_ROUNDS``. The other variants change a setting or two of a
round (the unlabelled loss's weight, the teacher's confidence, one threshold a class, its flips, class balance,
ClassMix, the pseudo-labels' skeleton term, the student's views, dropout, width and epochs, the generator's curves),
and the renderer's own model is trained with the ink input and with each change made to a student, the bar such a
student is held to. ``--variants`` picks variants by name; docs/performance.md gives each table's command.
``--unlabelled-scans N`` sets how many scans the renderer draws over each dev and test set's depths for
self-training (default 24; the test scans' own images stay the test sets', ``--test-scans``).

The curves are lasio's example LAS files (lasio 0.31's source distribution, tests/examples/): logging_levels.las
(TOTEM #9) and 6038187_v1.2.las (Scorpio E1). TOTEM #9's first 60% of depths are written as a LAS file of their
own: srforge's "LAS curves" variants read it, and so does the renderer's own training set. A threshold baseline
(the best global darkness threshold, chosen on each set itself, so an optimistic one) needs no training.

Recipe: configs/quickstart.yaml's (UNet, loss, optimizer, lr, 12 epochs, hflip) with binary masks at 1/8 scale
(400-1,600 x 60-80 px), model depth 4, 60 generated scans split 48 training + 12 validation (val_fraction 0.2),
and the pixel budget scaled with the scans: 4 x the quickstart's 30,000, as scans at 1/8 scale hold 4 x the pixels
of its 1/16. best.pt (best validation mean IoU, on the training kind of scans) is scored. Seeds change the
training scans, the split and the initial weights; the dev and test sets are the same for every seed.

    python benchmarks/bench_transfer.py [--seeds 0 1] [--variants WORD ...] [--las-dir DIR] [--work DIR]
                                        [--scale 0.125] [--depth 4] [--epochs 12] [--test-scans 24]
                                        [--unlabelled-scans 24]
                                        [--threads 1] [--reuse] [--tta] [--quick] [--make-sets DIR]
                                        [--out FILE.json]

``--las-dir DIR``: a folder holding logging_levels.las and 6038187_v1.2.las; without it they are fetched with
``pip download lasio==0.31 --no-deps --no-binary :all:`` into the work folder. ``--make-sets DIR`` only renders
DIR/{dev,test_same_well,test_other_well}/{images,masks} (PNG, masks 0/1). ``--quick`` is a smoke run (tiny sets,
one epoch, one seed): it checks that every variant trains and is scored, not what the table says. ``--reuse``
keeps the models trained on the renderer's scans by an earlier run (same renderer source, setting and seed), and
any model whose earlier run had the same stamp: srforge's source, torch's version, the run's overrides and its
teacher's file (:func:`training_stamp`); without it every model is trained afresh. ``--tta`` scores every model a
second time with each scan predicted as the mean of its four mirror images (the evaluator's ``--tta flip``),
printed as a second table.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import log_plotter  # noqa: E402

from srforge.cli.evaluate import main_evaluate  # noqa: E402
from srforge.config import load_config  # noqa: E402
from srforge.config.schema import SyntheticSection  # noqa: E402
from srforge.runtime.distributed import Processes  # noqa: E402
from srforge.synthetic.prepare import prepare_synthetic_data  # noqa: E402
from srforge.train import train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "quickstart.yaml"
LASIO = "lasio==0.31"
TOTEM, SCORPIO = "logging_levels.las", "6038187_v1.2.las"
TRAIN_FRACTION = 0.6
SET_SEEDS = {"dev": 1001, "test_same_well": 1002, "test_other_well": 1003}
SRFORGE_HELD_OUT_SEED = 1000
QUICKSTART_PIXELS, QUICKSTART_SCALE = 30_000, 0.0625
# One intra-op thread: on a 2-core machine shared with other jobs, torch's two threads spin against them (a UNet
# step of a [1, 3, 40, 800] batch: 8.9k px/s with 2 threads, 166k px/s with 1, measured side by side under load).
THREADS = 1
TEST_SETS = ("dev", "test_same_well", "test_other_well", "srforge_held_out")


@dataclass
class Setting:
    """Sizes and schedule of one benchmark run (full or --quick)."""

    scale: float = 0.125
    train_scans: int = 60  # 48 training + 12 validation at val_fraction 0.2
    test_scans: int = 24
    epochs: int = 12
    depth: int = 4
    unlabelled_scans: int = 24  # drawn over each dev and test set's depths with other seeds, for self-training

    @property
    def max_pixels(self) -> int:
        return int(QUICKSTART_PIXELS * (self.scale / QUICKSTART_SCALE) ** 2)


class SetupError(Exception):
    """A problem with the inputs (LAS files, folders): printed as a message, exit status 2."""


# -- the LAS files and the sets ----------------------------------------------------------------------------------
def fetch_las(work: Path) -> Path:
    """A folder holding TOTEM and SCORPIO, from lasio's source distribution fetched by pip into ``work``."""
    folder = work / "las"
    if (folder / TOTEM).is_file() and (folder / SCORPIO).is_file():
        return folder
    download = work / "pip"
    command = [sys.executable, "-m", "pip", "download", LASIO, "--no-deps", "--no-binary", ":all:", "-d", str(download)]
    done = subprocess.run(command, capture_output=True, text=True)
    archives = sorted(download.glob("lasio-*.tar.gz")) if download.is_dir() else []
    if done.returncode or not archives:
        raise SetupError(
            f"could not fetch {LASIO}'s source distribution with pip ({done.stderr.strip()[-300:] or 'no archive'}). "
            f"Download lasio-0.31.tar.gz from the package index by other means, take tests/examples/{TOTEM} and "
            f"tests/examples/{SCORPIO} out of it into a folder, and pass --las-dir FOLDER"
        )
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archives[-1]) as sdist:
        for member in sdist.getmembers():
            if member.isfile() and member.name.endswith((f"tests/examples/{TOTEM}", f"tests/examples/{SCORPIO}")):
                (folder / Path(member.name).name).write_bytes(sdist.extractfile(member).read())
    if not (folder / TOTEM).is_file() or not (folder / SCORPIO).is_file():
        raise SetupError(f"{archives[-1]}: expected tests/examples/{TOTEM} and {SCORPIO} in it, found them missing")
    return folder


def las_splits(las_dir: Path, work: Path) -> dict[str, Path]:
    """{"train", "test_same_well", "test_other_well"}: LAS files; TOTEM #9 cut at TRAIN_FRACTION of its depths."""
    for name in (TOTEM, SCORPIO):
        if not (las_dir / name).is_file():
            raise SetupError(f"--las-dir {las_dir}: expected {name} there, found no such file")
    out = work / "las_splits"
    out.mkdir(parents=True, exist_ok=True)
    first, rest = out / "totem9_first60.las", out / "totem9_last40.las"
    if not first.is_file() or not rest.is_file():
        log_plotter.split_las(las_dir / TOTEM, TRAIN_FRACTION, first, rest)
    return {"train": first, "test_same_well": rest, "test_other_well": las_dir / SCORPIO}


def renderer_version() -> str:
    """A digest of log_plotter.py: folders of rendered scans are named by it, so a changed renderer renders anew."""
    return hashlib.sha256(Path(log_plotter.__file__).read_bytes()).hexdigest()[:10]


def render_sets(splits: dict[str, Path], target: Path, setting: Setting) -> dict[str, Path]:
    """The renderer's dev and test sets under ``target``/<name>/{images,masks} (kept where already there)."""
    folders = {}
    for name, seed in SET_SEEDS.items():
        well = log_plotter.read_well(splits["train" if name == "dev" else name])
        folders[name] = log_plotter.write_scans(well, target / name, setting.test_scans, seed=seed, scale=setting.scale)
    return folders


# -- the variants --------------------------------------------------------------------------------------------------
def synthetic_keys() -> dict[str, tuple]:
    """``data.synthetic``'s keys and the types each takes (srforge.config.schema.SyntheticSection)."""
    return {k.name: k.types for k in vars(SyntheticSection).values() if hasattr(k, "types") and hasattr(k, "name")}


def randomise_key(keys: dict[str, tuple]) -> str | None:
    """The data.synthetic key that switches domain randomisation, if srforge has one (its name starts with
    "random" and it takes a bool)."""
    return next((k for k, types in keys.items() if k.startswith("random") and bool in types), None)


# Self-training (train.self_training) of the best generator variant: the EMA teacher from the first third of the
# epochs on, its confident pixels under photometric augmentation and flips (the scans' geometry otherwise kept).
SELF_TRAINING = {
    "weight": 1.0,
    "confidence": 0.9,
    "augment": {"hflip": 0.5, "color_jitter": {"brightness": 0.3, "contrast": 0.3}, "noise": 0.03},
}
EMA = 0.99
# The recipe's rounds (docs/training.md), by the end of their names: the first, and the second that the README's
# figure is of
RECIPE_ROUNDS = (
    ", + ink input, double-weight self-training with the flip teacher and skeleton loss (other renderer scans)",
    ", second round as the student trained twice as long, curves at a confidence of 0.95 (other renderer scans)",
)
SKELETON_WEIGHT = 1.0
UNLABELLED_SEEDS = {"dev": 2001, "test_same_well": 2002, "test_other_well": 2003}
# UNet(ink=True): each scan as its darkness against its own paper, in its darkest channel (srforge.models.ink).
INK = "model.args.ink=true"


def student_changes(epochs: int) -> list[tuple[str, str, tuple[str, ...]]]:
    """A later round's students unlike their teacher, as Noisy Student makes them: (the student's name; the name of
    the renderer's own model so changed, the bar such a student is held to; the overrides of both). Model noise
    (dropout before the head), a wider model (the quickstart's UNet has base_channels 8), twice the run's
    ``epochs``, twice the epochs with dropout 0.1, and three and four times the epochs."""
    longer = f"train.epochs={2 * epochs}"
    return [("dropout 0.1 in the student", "dropout 0.1", ("model.args.dropout=0.1",)),
            ("dropout 0.5 in the student", "dropout 0.5", ("model.args.dropout=0.5",)),
            ("a student twice as wide", "twice as wide", ("model.base_channels=16",)),
            ("a student trained twice as long", "trained twice as long", (longer,)),
            ("a student with dropout 0.1, twice as long", "dropout 0.1, trained twice as long",
             (longer, "model.args.dropout=0.1")),
            *[(f"a student trained {times} as long", f"trained {times} as long", (f"train.epochs={k * epochs}",))
              for k, times in ((3, "three times"), (4, "four times"))]]  # fmt: skip


def holds(name: str, part: str) -> bool:
    """Whether ``name`` holds ``part``, in any case; in ``part`` ``*`` stands for any run of characters, so that two
    parts of a long name can pick it out, and ``?`` for any one."""
    return fnmatchcase(name.lower(), f"*{part.lower()}*")


def selected(every: list[dict], patterns: list[str] | None) -> list[dict]:
    """The variants ``--variants`` names: those whose name holds one of ``patterns`` (any case; in it ``*`` stands
    for any run of characters, so that two parts of a name can pick it out, and ``?`` for any one), or is one written
    ``=NAME`` (taken as it is), so that a name which is the start of others (the renderer's own model, plain) can be
    run alone; no patterns: all."""
    if not patterns:
        return list(every)
    exact = {p[1:].lower() for p in patterns if p.startswith("=")}
    parts = [p for p in patterns if not p.startswith("=")]
    return [v for v in every if v["name"].lower() in exact or any(holds(v["name"], p) for p in parts)]


def render_unlabelled(splits: dict[str, Path], target: Path, setting: Setting) -> list[Path]:
    """The renderer's scans over each dev and test set's depths drawn with other seeds (UNLABELLED_SEEDS): their
    image folders alone, what self-training may read (never the test scans themselves, never a mask)."""
    folders = []
    for name, seed in UNLABELLED_SEEDS.items():
        well = log_plotter.read_well(splits["train" if name == "dev" else name])
        folders.append(log_plotter.write_scans(well, target / name, setting.unlabelled_scans, seed=seed,
                                               scale=setting.scale) / "images")  # fmt: skip
    return folders


def adaptation_variants(base: list[str], unlabelled: dict[str, list[Path]], epochs: int,
                        curves: str = "own curves") -> list[dict]:  # fmt: skip
    """The generator's randomised variant of ``curves`` (``base``, its overrides) with self-training on each kind of
    unlabelled scans (from epoch ``epochs`` // 3 + 1 on), with the thin-structure loss, and with both."""
    rows = []
    spec = {**SELF_TRAINING, "start_epoch": epochs // 3 + 1}
    twice = (f"train.epochs={2 * epochs}",)  # a student trained twice the run's epochs

    def add(name: str, extra: list[str]) -> None:
        rows.append({"name": f"srforge generator, {curves}, randomisation on, {name}", "kind": "srforge",
                     "overrides": [*base, *extra], "missing": ""})  # fmt: skip

    def learning_from(folders: list[Path], **options) -> list[str]:
        return [f"data.unlabelled={json.dumps([str(f) for f in folders])}", f"train.ema={EMA}",
                f"train.self_training={json.dumps({**spec, **options})}"]  # fmt: skip

    def later_round(name: str, folders: list[Path], teacher: str, extra: tuple[str, ...] = (), **options) -> None:
        """A round after the first: ``teacher``'s model, fixed, labels ``folders`` for a fresh student from epoch 1
        (double weight, the flip teacher, the ink input and the skeleton loss, as the first round has them);
        ``extra``: more overrides of the student's run."""
        add(f"+ ink input, {name}", [INK, *learning_from(folders, tta="flip", weight=2.0, start_epoch=1, **options),
                                     f"train.skeleton_weight={SKELETON_WEIGHT}", *extra])  # fmt: skip
        rows[-1]["teacher"] = teacher

    add("+ self-training on other renderer scans", learning_from(unlabelled["other seed"]))
    add("+ self-training on the test scans' images", learning_from(unlabelled["test images"]))
    add("+ class-balanced self-training on other renderer scans",
        learning_from(unlabelled["other seed"], balance=True))  # fmt: skip
    add("+ skeleton recall loss", [f"train.skeleton_weight={SKELETON_WEIGHT}"])
    add("+ both (other renderer scans)", [*learning_from(unlabelled["other seed"]),
                                          f"train.skeleton_weight={SKELETON_WEIGHT}"])  # fmt: skip
    skeleton = f"train.skeleton_weight={SKELETON_WEIGHT}"
    for kind, where in (("other seed", "other renderer scans"), ("test images", "the test scans' images")):
        add(f"+ class-balanced self-training and skeleton loss ({where})",
            [*learning_from(unlabelled[kind], balance=True), skeleton])  # fmt: skip
    add("+ ClassMix self-training and skeleton loss (other renderer scans)",
        [*learning_from(unlabelled["other seed"], mix=True), skeleton])  # fmt: skip
    add("+ ClassMix class-balanced self-training and skeleton loss (other renderer scans)",
        [*learning_from(unlabelled["other seed"], mix=True, balance=True), skeleton])  # fmt: skip
    add("+ ink input", [INK])
    add("+ ink input and skeleton loss", [INK, skeleton])
    for kind, where in (("other seed", "other renderer scans"), ("test images", "the test scans' images")):
        add(f"+ ink input and self-training on {where}", [INK, *learning_from(unlabelled[kind])])
    add("+ ink input and class-balanced self-training on other renderer scans",
        [INK, *learning_from(unlabelled["other seed"], balance=True)])  # fmt: skip
    for kind, where in (("other seed", "other renderer scans"), ("test images", "the test scans' images")):
        add(f"+ ink input, class-balanced self-training and skeleton loss ({where})",
            [INK, *learning_from(unlabelled[kind], balance=True), skeleton])  # fmt: skip
    for kind, where in (("other seed", "other renderer scans"), ("test images", "the test scans' images")):
        add(f"+ ink input, plain self-training and skeleton loss ({where})",
            [INK, *learning_from(unlabelled[kind]), skeleton])  # fmt: skip
        add(f"+ ink input, plain self-training and half-weight skeleton loss ({where})",
            [INK, *learning_from(unlabelled[kind]), f"train.skeleton_weight={SKELETON_WEIGHT / 2}"])  # fmt: skip
        add(f"+ ink input, plain self-training and double-weight skeleton loss ({where})",
            [INK, *learning_from(unlabelled[kind]), f"train.skeleton_weight={SKELETON_WEIGHT * 2}"])  # fmt: skip
        for confidence in (0.6, 0.7, 0.8, 0.95):  # the teacher's threshold, SELF_TRAINING's 0.9 either side
            add(f"+ ink input, plain self-training at confidence {confidence} and skeleton loss ({where})",
                [INK, *learning_from(unlabelled[kind], confidence=confidence), skeleton])  # fmt: skip
        add(f"+ ink input, plain self-training with the flip teacher and skeleton loss ({where})",
            [INK, *learning_from(unlabelled[kind], tta="flip"), skeleton])  # fmt: skip
        # the skeleton loss adds a labelled term that marks thin lines; a larger unlabelled weight answers it
        for times, weight in (("double", 2.0), ("triple", 3.0)):
            add(f"+ ink input, {times}-weight self-training with the flip teacher and skeleton loss ({where})",
                [INK, *learning_from(unlabelled[kind], tta="flip", weight=weight), skeleton])  # fmt: skip
        # rounds (Noisy Student): the last round's model, fixed, teaches a fresh student from epoch 1; the first round
        # is the double-weight row. Then the same rounds with each student also asked to cover the skeleton of its
        # teacher's confident curves (recall is what the second round lacks against the renderer's own model).
        first = rows[-2]["name"]
        for losses, options in ((" and skeleton loss", {}),
                                (", skeleton loss and skeleton recall on the pseudo-labels",
                                 {"skeleton": SKELETON_WEIGHT})):  # fmt: skip
            teacher = first
            for round_ in ("second", "third"):
                later_round(f"{round_} round of self-training at double weight with the flip teacher{losses} ({where})",
                            unlabelled[kind], teacher, **options)  # fmt: skip
                teacher = rows[-1]["name"]
        # the pseudo-labels' skeleton term trades tolerance precision for recall: its weight either side of 1, for
        # dev to choose (second round only)
        for times, weight in (("half", SKELETON_WEIGHT / 2), ("double", SKELETON_WEIGHT * 2)):
            later_round(f"second round of self-training at double weight with the flip teacher, skeleton loss and "
                        f"{times}-weight skeleton recall on the pseudo-labels ({where})",
                        unlabelled[kind], first, skeleton=weight)  # fmt: skip
        # more noise for the student (Noisy Student): its view also flipped upside down, the symmetry the flip
        # teacher already assumes
        later_round(f"second round at double weight with the flip teacher, skeleton loss, skeleton recall on the "
                    f"pseudo-labels and upside-down student views ({where})",
                    unlabelled[kind], first, skeleton=SKELETON_WEIGHT,
                    augment={**SELF_TRAINING["augment"], "vflip": 0.5})  # fmt: skip
        # the labelled scans' skeleton term asks for the generator's thin lines, the pseudo-labels' for the target's:
        # the second alone
        later_round(f"second round at double weight with the flip teacher and skeleton recall on the pseudo-labels "
                    f"alone ({where})", unlabelled[kind], first, extra=("train.skeleton_weight=0",),
                    skeleton=SKELETON_WEIGHT)  # fmt: skip
        # the student's model (Noisy Student): dropout before the head, its third kind of noise, at segmentation
        # heads' usual 0.1 and Noisy Student's 0.5 (the teacher predicts in eval mode, without it); a student larger
        # than its teacher; and ones trained two, three and four times the run's epochs
        for student, _, overrides in student_changes(epochs):
            later_round(f"second round at double weight with the flip teacher, skeleton loss, skeleton recall on the "
                        f"pseudo-labels and {student} ({where})",
                        unlabelled[kind], first, extra=overrides, skeleton=SKELETON_WEIGHT)  # fmt: skip
            if overrides == twice:  # the third round's teacher: twice the epochs, nothing else
                longer_second = rows[-1]["name"]
        # students trained longer than 24 epochs level off where the renderer's own model goes on learning: whether a
        # better teacher lifts them, a third round taught by the 24-epoch student, its student trained as long
        later_round(f"third round at double weight with the flip teacher, skeleton loss, skeleton recall on the "
                    f"pseudo-labels and students trained twice as long ({where})",
                    unlabelled[kind], longer_second, extra=twice,
                    skeleton=SKELETON_WEIGHT)  # fmt: skip
        # tolerance precision is what the 24-epoch student lacks, and its teacher's false marks fall faster than its
        # curve pixels as the threshold rises: curves learnt only where the teacher is surer, background as before
        for strict in (0.95, 0.97):
            later_round(f"second round as the student trained twice as long, curves at a confidence of {strict} "
                        f"({where})",
                        unlabelled[kind], first, extra=twice, skeleton=SKELETON_WEIGHT,
                        confidence=[SELF_TRAINING["confidence"], strict])  # fmt: skip
        # over four seeds the recipe lacks tolerance recall, and at 0.9 its teacher calls 8-13% of the true curve
        # pixels paper: paper learnt only where the teacher is surer, curves at 0.95
        for paper in (0.97, 0.99):
            later_round(f"second round as the student trained twice as long, curves at 0.95 and paper at {paper} "
                        f"({where})",
                        unlabelled[kind], first, extra=twice, skeleton=SKELETON_WEIGHT,
                        confidence=[paper, 0.95])  # fmt: skip
        # the students miss curve pixels where curves crowd, which the teacher calls paper there too: ClassMix
        # pastes the update's labelled curves over the target's own, truly labelled, so that curves beside and across
        # other curves are taught on the target's paper
        later_round(f"second round as the student trained twice as long, curves at 0.95 and ClassMix ({where})",
                    unlabelled[kind], first, extra=twice, skeleton=SKELETON_WEIGHT,
                    confidence=[SELF_TRAINING["confidence"], 0.95], mix=True)  # fmt: skip
        # the same crowding from the archive itself: each scan's confident curves, mirrored along the depth, pasted
        # over it, in the target's own look; and with stricter curves, fewer of the teacher's false lines doubled
        for strict in (0.95, 0.97, 0.99):
            later_round(f"second round as the student trained twice as long, curves at {strict} and mirror ClassMix "
                        f"({where})",
                        unlabelled[kind], first, extra=twice, skeleton=SKELETON_WEIGHT,
                        confidence=[SELF_TRAINING["confidence"], strict], mix="mirror")  # fmt: skip
    return rows


def variants(las_train: Path, unlabelled: dict[str, list[Path]] | None = None, epochs: int = 12) -> list[dict]:
    """Each training variant: {"name", "kind": "srforge" | "renderer" | "threshold", "overrides", "missing"}; a
    variant whose key srforge lacks has ``missing`` (why it is not run). With ``unlabelled`` ({"other seed",
    "test images"}: image folders), the adaptation variants of the randomised own-curves generator follow, and the
    recipe's two rounds (RECIPE_ROUNDS) on the randomised LAS-curves generator."""
    keys = synthetic_keys()
    random_key = randomise_key(keys)
    rows, adapted, las_rounds = [], [], []
    for curves in ("own", "las"):
        for randomised in (False, True):
            overrides, missing = [], []
            if curves == "las":
                overrides.append(f"data.synthetic.las={json.dumps([str(las_train)])}")
                missing += [] if "las" in keys else ["data.synthetic has no key 'las'"]
            if random_key:
                overrides.append(f"data.synthetic.{random_key}={'true' if randomised else 'false'}")
            elif randomised:
                missing.append("data.synthetic has no randomisation key (random*, a bool)")
            name = f"srforge generator, {'LAS curves' if curves == 'las' else 'own curves'}, randomisation " + (
                "on" if randomised else "off"
            )
            rows.append({"name": name, "kind": "srforge", "overrides": overrides, "missing": "; ".join(missing)})
            if unlabelled is not None and curves == "own" and randomised and not missing:
                adapted = adaptation_variants(overrides, unlabelled, epochs)
            if unlabelled is not None and curves == "las" and randomised and not missing:
                # the recipe's two rounds with the training well's LAS curves drawn: its students miss curve pixels
                # where curves crowd, which the generator's own synthetic curves may rarely draw
                las_rounds = [row for row in adaptation_variants(overrides, unlabelled, epochs, "LAS curves")
                              if row["name"].endswith(RECIPE_ROUNDS)]  # fmt: skip
    rows += adapted + las_rounds
    rows.append({"name": "the renderer's own scans (48)", "kind": "renderer", "overrides": [], "missing": ""})
    rows.append({"name": "the renderer's own scans (48), ink input", "kind": "renderer", "overrides": [INK],
                 "missing": ""})  # fmt: skip
    for _, bar, overrides in student_changes(epochs):  # the bar for a student so changed
        rows.append({"name": f"the renderer's own scans (48), {bar}", "kind": "renderer", "overrides": [*overrides],
                     "missing": ""})  # fmt: skip
    rows.append({"name": "threshold (best global darkness, chosen on each set)", "kind": "threshold",
                 "overrides": [], "missing": ""})  # fmt: skip
    return rows


def base_overrides(setting: Setting, seed: int, run_dir: Path) -> list[str]:
    """The quickstart recipe at the benchmark's scale (pixel budget scaled with the scans' pixels)."""
    return [
        f"run.dir={run_dir}",
        f"run.seed={seed}",
        "run.device=cpu",
        f"model.depth={setting.depth}",
        f"data.max_pixels={setting.max_pixels}",
        f"train.epochs={setting.epochs}",
        f"data.synthetic.n={setting.train_scans}",
        f"data.synthetic.scale={setting.scale}",
        f"data.synthetic.seed={seed}",
        "data.synthetic.classes=binary",
    ]


def srforge_scans(root: Path, setting: Setting, seed: int, extra: list[str], n: int) -> Path:
    """srforge's generator writes ``n`` scans into a fresh ``root`` (as the trainer has it do, through
    data.synthetic): the generator may have changed since an earlier run, so nothing of one is kept."""
    shutil.rmtree(root, ignore_errors=True)
    overrides = [*base_overrides(setting, seed, root / "unused_run"), f"data.synthetic.root={root}",
                 f"data.synthetic.n={n}", f"data.dataset.args.root={root}", *extra]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        prepare_synthetic_data(load_config(CONFIG, overrides).data.synthetic, Processes())
    return root


def slug(name: str) -> str:
    """A variant's name as a folder name."""
    words = (word.strip(",()+'").replace("'", "").replace(":", "") for word in name.split())
    return "_".join(word for word in words if word)


def run_key(setting: Setting, seed: int, unlabelled: bool = False) -> str:
    """A run folder's key; ``unlabelled``: the variant reads unlabelled scans, whose number it names too."""
    key = f"seed{seed}_n{setting.train_scans}_s{setting.scale:g}_e{setting.epochs}_d{setting.depth}"
    return f"{key}_u{setting.unlabelled_scans}" if unlabelled else key


def run_folder(variant: dict, setting: Setting, seed: int) -> str:
    """The name of ``variant``'s run folder for ``seed``. srforge's variants are named by their own names; the
    renderer's own models by the renderer's version and each override's last key and value (``_ink`` for the ink
    input, ``_dropout0.1``), so that ``--reuse`` finds each model where its own run left it."""
    key = run_key(setting, seed, reads_unlabelled(variant["overrides"]))
    if variant["kind"] == "srforge":
        return f"{slug(variant['name'])}_{key}"
    extra = ""
    for override in variant["overrides"]:
        path, value = override.split("=", 1)
        extra += "_ink" if override == INK else f"_{path.rsplit('.', 1)[-1]}{value}"
    return f"renderer_{renderer_version()}{extra}_{key}"


def reads_unlabelled(overrides: list[str]) -> bool:
    return any(o.startswith("data.unlabelled=") for o in overrides)


def with_teachers(chosen: list[dict], every: list[dict]) -> list[dict]:
    """``chosen``, each variant taught by another's model (``teacher``: that variant's name) after that variant, and
    after its teacher's teacher, chosen or not: a teacher's best.pt must come from this run, before its student."""
    named = {v["name"]: v for v in every}
    out: list[dict] = []

    def place(variant: dict) -> None:
        if any(v["name"] == variant["name"] for v in out):
            return
        if variant.get("teacher"):
            place(named[variant["teacher"]])
        out.append(variant)

    for variant in chosen:
        place(variant)
    return out


def training_stamp(overrides: list[str]) -> dict:
    """What a model trained with ``overrides`` depends on besides them: srforge's source (every .py file of the
    package, the recipe's config), torch's version, and the bytes of a teacher's checkpoint, which a retrained
    teacher may change. What the stamp leaves out (``--threads``, numpy's and Pillow's versions) is taken to be the
    same between the runs one ``--reuse``s."""
    source = hashlib.sha256()
    for file in [*sorted((ROOT / "srforge").rglob("*.py")), CONFIG]:
        source.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    teacher = next((o.split("=", 1)[1] for o in overrides if o.startswith("train.self_training.teacher=")), None)
    return {"srforge": source.hexdigest(), "torch": torch.__version__, "overrides": list(overrides),
            "teacher": hashlib.sha256(Path(teacher).read_bytes()).hexdigest() if teacher else None}  # fmt: skip


def reusable(done: Path, kind: str, stamp: dict) -> bool:
    """Whether the run whose record is ``done`` (bench_transfer_seconds.json beside its best.pt) may be kept: a
    model on the renderer's scans whenever its run finished, any other only when its run's stamp is ``stamp``."""
    if not done.is_file() or not (done.parent / "best.pt").is_file():
        return False
    return kind == "renderer" or json.loads(done.read_text()).get("stamp") == stamp


def train_variant(variant: dict, setting: Setting, seed: int, work: Path, own_train: Path, reuse: bool):
    """Train ``variant`` for ``seed``; (its best.pt, seconds of training, generation included). srforge's data
    is generated afresh; with ``reuse``, a model an earlier run left is kept (:func:`reusable`; its seconds are that
    run's). A variant with a ``teacher`` learns from that variant's best.pt of the same seed
    (train.self_training.teacher), trained before it (:func:`with_teachers`)."""
    key, name = run_key(setting, seed, reads_unlabelled(variant["overrides"])), slug(variant["name"])
    run_dir = work / "runs" / run_folder(variant, setting, seed)
    done = run_dir / "bench_transfer_seconds.json"
    overrides = base_overrides(setting, seed, run_dir)
    if variant["kind"] == "srforge":
        data = work / "srforge_train" / f"{name}_{key}"
        overrides += [f"data.synthetic.root={data}", f"data.dataset.args.root={data}", *variant["overrides"]]
    else:
        overrides += ["data.synthetic.root=null", f"data.dataset.args.root={own_train}", *variant["overrides"]]
    if variant.get("teacher"):
        # a teacher is a round of self-training: its folder names the unlabelled scans too
        teacher = work / "runs" / f"{slug(variant['teacher'])}_{run_key(setting, seed, True)}" / "best.pt"
        overrides.append(f"train.self_training.teacher={teacher}")
    stamp = training_stamp(overrides)
    if reuse and reusable(done, variant["kind"], stamp):
        return run_dir / "best.pt", json.loads(done.read_text())["seconds"]
    if variant["kind"] == "srforge":
        shutil.rmtree(data, ignore_errors=True)  # the generator may have changed since an earlier run
    cfg = load_config(CONFIG, overrides)
    done.unlink(missing_ok=True)  # a run stopped part-way must not leave an earlier record beside its best.pt
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train(cfg, overwrite=True)
    seconds = time.perf_counter() - start
    done.write_text(json.dumps({"seconds": seconds, "stamp": stamp}))
    return run_dir / "best.pt", seconds


# -- scoring -------------------------------------------------------------------------------------------------------
def evaluator(arguments: list[str], out: Path) -> dict:
    """Run srforge's evaluator (its command line, in this process) into a fresh ``out``; (fg IoU, tolerance F1)
    of the curve class, micro (pixels pooled)."""
    shutil.rmtree(out, ignore_errors=True)
    log = io.StringIO()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        status = main_evaluate([*arguments, "--output", str(out), "--no-progress", "--worst", "0", "--device", "cpu"])
    if status != 0:
        raise RuntimeError(f"srforge-evaluate {' '.join(arguments)} ended with status {status}:\n{log.getvalue()}")
    micro = json.loads((out / "metrics.json").read_text())["models"][0]["results"]["micro"]["per_class"]
    return {"fg_iou": micro["iou"]["curve"], "tol_f1": micro["tol_f1"]["curve"]}


def score_checkpoint(checkpoint: Path, folder: Path, out: Path, tta: str = "none") -> dict:
    """The checkpoint's scores on ``folder``, its scans predicted as they are or, ``tta`` flip, as the mean of
    their four mirror images (the evaluator's --tta)."""
    return evaluator(["--checkpoint", str(checkpoint), "--input", str(folder), "--workers", "0", "--tta", tta], out)


def darkness(path: Path) -> np.ndarray:
    """uint8 [H, W]: 255 - the image's luminance."""
    with Image.open(path) as image:
        return 255 - np.asarray(image.convert("L"))


def best_threshold(folder: Path) -> int:
    """The darkness t (pixels >= t are curve) of the best foreground IoU over ``folder``'s scans, pooled."""
    curve, background = np.zeros(256, np.int64), np.zeros(256, np.int64)
    for path in sorted((folder / "images").glob("*.png")):
        dark = darkness(path)
        with Image.open(folder / "masks" / path.name) as mask:
            truth = np.asarray(mask) == 1
        curve += np.bincount(dark[truth], minlength=256)
        background += np.bincount(dark[~truth], minlength=256)
    hits = np.cumsum(curve[::-1])[::-1]  # curve pixels at darkness >= t
    false = np.cumsum(background[::-1])[::-1]
    return int(np.argmax(hits / (curve.sum() + false)))


def score_threshold(folder: Path, out: Path) -> dict:
    """The threshold baseline on ``folder``: its masks written, scored by srforge's evaluator."""
    threshold = best_threshold(folder)
    predictions = out.parent / f"{out.name}_masks"
    shutil.rmtree(predictions, ignore_errors=True)
    predictions.mkdir(parents=True)
    for path in sorted((folder / "images").glob("*.png")):
        Image.fromarray((darkness(path) >= threshold).astype(np.uint8)).save(predictions / path.name)
    found = evaluator(["--predictions", str(predictions), "--masks", str(folder / "masks"), "--classes",
                       "background,curve"], out)  # fmt: skip
    return {**found, "threshold": threshold}


# -- the run ---------------------------------------------------------------------------------------------------------
def mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def print_table(rows: list[dict], skipped: list[dict], seeds: list[int], scores: str = "scores") -> None:
    """The markdown table: each variant's mean ± sample sd over seeds of foreground IoU and tolerance F1 (of
    each row's ``scores``: "scores", or "scores_tta", those of --tta flip at test time)."""
    rows = [{**r, "scores": r[scores]} for r in rows if scores in r]
    when = ", every scan predicted with --tta flip" if scores == "scores_tta" else ""
    print(f"\nforeground IoU / tolerance F1 (2 px), micro{when}; mean ± sd over seeds {seeds}:")
    head = ["trained on", *[f"{s} IoU / tol F1" for s in TEST_SETS], "training s"]
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for name in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == name]
        cells = [name]
        for part in TEST_SETS:
            scored = [r["scores"][part] for r in mine if part in r["scores"]]
            iou, f1 = mean_sd([s["fg_iou"] for s in scored]), mean_sd([s["tol_f1"] for s in scored])
            cells.append(f"{iou} / {f1}" if scored else "-")
        seconds = [r["seconds"] for r in mine if r["seconds"] is not None]
        cells.append(f"{np.mean(seconds):.0f}" if seconds else "-")
        print("| " + " | ".join(cells) + " |")
    for variant in skipped:
        print(f"not run: {variant['name']}: {variant['missing']}")


def run_seed(seed: int, chosen: list[dict], setting: Setting, args, sets: dict[str, Path], las: dict) -> list:
    """Train and score every chosen variant for ``seed``; one row each."""
    folder = args.work / "renderer_train" / f"{renderer_version()}_seed{seed}_n{setting.train_scans}_s{setting.scale:g}"
    own = log_plotter.write_scans(log_plotter.read_well(las["train"]), folder, setting.train_scans, seed=seed,
                                  scale=setting.scale)  # fmt: skip
    rows = []
    for variant in chosen:
        if variant["kind"] == "threshold":
            continue
        checkpoint, seconds = train_variant(variant, setting, seed, args.work, own, args.reuse)
        scores = {
            part: score_checkpoint(checkpoint, folder, checkpoint.parent / f"evaluate-{part}")
            for part, folder in sets.items()
        }
        rows.append({"variant": variant["name"], "seed": seed, "seconds": round(seconds, 1), "scores": scores})
        if args.tta:
            rows[-1]["scores_tta"] = {
                part: score_checkpoint(checkpoint, folder, checkpoint.parent / f"evaluate-tta-{part}", "flip")
                for part, folder in sets.items()
            }
        print(json.dumps(rows[-1]), flush=True)
    return rows


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--variants", nargs="+", default=None,
                        help="only variants whose name holds one of these, * and ? wildcards (=NAME: that name "
                             "alone)")  # fmt: skip
    parser.add_argument("--las-dir", type=Path, default=None, help=f"a folder holding {TOTEM} and {SCORPIO}")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "results" / "transfer_work")
    parser.add_argument("--scale", type=float, default=0.125, help="scan size relative to full size (default 1/8)")
    parser.add_argument("--depth", type=int, default=4, help="UNet depth (default 4)")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs (default 12, the quickstart's)")
    parser.add_argument("--test-scans", type=int, default=24, help="scans in each dev and test set (default 24)")
    parser.add_argument("--unlabelled-scans", type=int, default=Setting.unlabelled_scans,
                        help="unlabelled scans drawn over each dev and test set's depths (default 24)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=THREADS, help="torch's intra-op threads (default 1)")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep models trained on the renderer's scans by an earlier run of the same renderer, setting and seed, "
        "and any other model an earlier run trained with the same srforge source, torch, overrides and teacher",
    )
    parser.add_argument("--tta", action="store_true", help="also score every model with the evaluator's --tta flip")
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sets, one epoch, one seed")
    parser.add_argument("--make-sets", type=Path, default=None, metavar="DIR", help="only render the dev/test sets")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_transfer.json")
    return parser.parse_args(argv)  # fmt: skip


def main(argv=None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    setting = Setting(scale=args.scale, test_scans=args.test_scans, epochs=args.epochs, depth=args.depth,
                      unlabelled_scans=args.unlabelled_scans)  # fmt: skip
    if args.quick:
        setting = Setting(scale=0.0625, train_scans=10, test_scans=3, epochs=1, depth=3, unlabelled_scans=3)
        args.seeds = args.seeds[:1]
        args.work = args.work.parent / f"{args.work.name}_quick"
    try:
        las = las_splits(args.las_dir or fetch_las(args.work), args.work)
    except SetupError as exc:
        print(f"bench_transfer: {exc}", file=sys.stderr)
        return 2
    if args.make_sets:
        for name, folder in render_sets(las, args.make_sets, setting).items():
            print(f"{name}: {len(list((folder / 'images').glob('*.png')))} scans in {folder}")
        return 0
    return run(args, setting, las)


def run(args, setting: Setting, las: dict) -> int:
    """Render and generate the test sets, train and score the chosen variants, print the table, write the JSON."""
    start = time.perf_counter()
    sets = render_sets(las, args.work / f"sets_{renderer_version()}_n{setting.test_scans}_s{setting.scale:g}", setting)
    unlabelled = {
        "other seed": render_unlabelled(
            las, args.work / f"unlabelled_{renderer_version()}_n{setting.unlabelled_scans}_s{setting.scale:g}", setting
        ),
        "test images": [sets[name] / "images" for name in ("dev", "test_same_well", "test_other_well")],
    }
    every = variants(las["train"], unlabelled, setting.epochs)
    chosen = with_teachers(selected(every, args.variants), every)
    skipped = [v for v in chosen if v["missing"]]
    chosen = [v for v in chosen if not v["missing"]]
    sets["srforge_held_out"] = srforge_scans(
        args.work / f"srforge_held_out_n{setting.test_scans}_s{setting.scale:g}", setting, SRFORGE_HELD_OUT_SEED,
        [], setting.test_scans,
    )  # fmt: skip
    rows = []
    for variant in (v for v in chosen if v["kind"] == "threshold"):
        scores = {part: score_threshold(folder, args.work / "threshold" / part) for part, folder in sets.items()}
        rows.append({"variant": variant["name"], "seed": None, "seconds": None, "scores": scores})
        print(json.dumps(rows[-1]), flush=True)
    for seed in args.seeds:
        rows += run_seed(seed, chosen, setting, args, sets, las)
    print_table(rows, skipped, args.seeds)
    if args.tta:
        print_table(rows, [], args.seeds, scores="scores_tta")
    seconds = time.perf_counter() - start
    print(f"wall time {seconds:.0f} s")
    document = {"setting": {**asdict(setting), "max_pixels": setting.max_pixels}, "seeds": args.seeds,
                "rows": rows, "not_run": [{k: v[k] for k in ("name", "missing")} for v in skipped],
                "seconds": round(seconds, 1)}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
