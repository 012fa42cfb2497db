"""Segmentation quality of whole-scan padded batches against what other toolkits do instead, at equal real pixels.

Every recipe trains srforge's trainer from configs/quickstart.yaml (synthetic well-log scans at 1/16 scale, its
UNet, loss, optimizer, learning rate and augmentation) and changes only how the training pixels are served:

- whole scans, size-grouped batches of 4, and of 2 (only when ``--recipes`` names it, e.g. ``--recipes "of 2"``);
- whole scans, the pixel budget of configs/quickstart.yaml (the default recipe);
- whole scans one at a time (batch 1);
- random fixed-size crops (``data.crop``), batches of 8, predicted whole and by srforge's tiling with a budget
  of the crop's pixel count (srforge picks the tile shape: full-height strips of at most that many pixels,
  overlapping by 4 x the divisor);
- every scan resized to one fixed size (image bilinear with antialias, mask nearest), class probabilities resized
  back (bilinear) before the argmax.

Each recipe sees the same number of real (unpadded) training pixels: ``--epochs`` epochs of the whole scans, and
as many epochs of crops or resized scans as give that many pixels. Models are scored on held-out scans of another
seed, predicted whole (best.pt: a 4-scan validation set of a third seed is checked once, after the last epoch,
so best.pt holds the final weights -- the averaged ones under train.ema -- and chooses nothing): foreground IoU
(curve vs background, whatever the class), IoU per class, foreground IoU by width third (the narrowest, middle
and widest third of the held-out scans), optimizer steps, training seconds and padding waste (padded / real
pixels - 1 of the training batches). Binary and multiclass (one class per curve style) tasks, one table each,
``--seeds`` seeds (data, split and initialisation all change with the seed).

``--resolution`` adds the last table: binary models of the default recipe scored on held-out scans at 0.5x, 1x and
2x the scans' scale, trained on a set that mixes resolutions from 0.5x to 2x (``data.synthetic.scale``), on 1x
scans rescaled by ``data.augment.scale: [0.5, 2]``, and on 1x scans alone (the binary table's default run, or a run of
its own with ``--recipes`` that leave it out).

    python benchmarks/bench_quality.py [--seeds 0 1] [--epochs 12] [--tasks binary multiclass] [--recipes WORD ...]
                                       [--resolution] [--quick] [--work DIR] [--out FILE.json]

``--quick`` is a smoke test (a few tiny scans, one epoch, one seed, the binary task): it checks that every recipe
runs and is scored, not what the table says.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.config import load_config  # noqa: E402
from srforge.data.crop import crop_sizes  # noqa: E402
from srforge.data.images import read_image, read_mask  # noqa: E402
from srforge.data.layout_plot import batch_layout, waste  # noqa: E402
from srforge.predict.predictor import Predictor  # noqa: E402
from srforge.synthetic import make_welllog_scans  # noqa: E402
from srforge.train import train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "quickstart.yaml"
DEFAULT = "pixel budget (the default)"
TASKS = {"binary": ["background", "curve"], "multiclass": ["background", "solid", "dashed", "dotted"]}


@dataclass
class Setting:
    """The scans and schedule of one benchmark run (full or --quick)."""

    scale: float = 0.0625
    train_scans: int = 40
    test_scans: int = 24
    # per resolution, 24 a width third: with 8 a third the mixed model's narrowest and widest third at 0.5x were
    # 0.068 apart, with 24 0.014
    resolution_test_scans: int = 72
    val_scans: int = 4
    epochs: int = 12
    crop: tuple[int, int] = (24, 128)  # multiples of the quickstart's divisor 8, inside every 1/16-scale scan
    resize: tuple[int, int] = (32, 512)  # (H, W): near the scans' mean height (35) and width (500), aligned
    crop_batch: int = 8


@dataclass
class Recipe:
    """How a recipe serves its pixels: config overrides, and which pixels one epoch holds ("whole", "crop",
    "resize"); ``tiled``: also score the model by srforge's tiling with tiles of the crop's size; ``optional``: run
    only when ``--recipes`` names it (keeps the whole script under 20 minutes)."""

    name: str
    overrides: list[str]
    serves: str = "whole"
    tiled: bool = False
    optional: bool = False


@dataclass
class Score:
    """Pooled confusion counts over held-out scans, and foreground counts per width third."""

    num_classes: int
    confusion: np.ndarray = field(init=False)
    thirds: list[list[int]] = field(default_factory=lambda: [[0, 0], [0, 0], [0, 0]])  # [intersection, union]

    def __post_init__(self):
        self.confusion = np.zeros((self.num_classes, self.num_classes), np.int64)

    def add(self, truth: np.ndarray, predicted: np.ndarray, third: int) -> None:
        """``truth`` and ``predicted`` uint8 [H, W] class ids of one scan in width third ``third``."""
        k = self.num_classes
        self.confusion += np.bincount(truth.astype(np.int64).ravel() * k + predicted.ravel(), minlength=k * k).reshape(
            k, k
        )
        fg_t, fg_p = truth > 0, predicted > 0
        self.thirds[third][0] += int((fg_t & fg_p).sum())
        self.thirds[third][1] += int((fg_t | fg_p).sum())

    def foreground_iou(self) -> float:
        hit = self.confusion[1:, 1:].sum()
        return float(hit / (hit + self.confusion[0, 1:].sum() + self.confusion[1:, 0].sum()))

    def class_iou(self) -> list[float]:
        tp = np.diag(self.confusion)
        return (tp / np.maximum(self.confusion.sum(0) + self.confusion.sum(1) - tp, 1)).tolist()

    def third_iou(self) -> list[float]:
        return [i / u if u else float("nan") for i, u in self.thirds]


def recipes(setting: Setting) -> list[Recipe]:
    """The recipes compared, the default (configs/quickstart.yaml as shipped) first."""
    ch, cw = setting.crop
    return [
        Recipe(DEFAULT, []),
        Recipe("size-grouped batches of 4", ["data.max_pixels=null", "data.batch_size=4"]),
        Recipe("size-grouped batches of 2", ["data.max_pixels=null", "data.batch_size=2"], optional=True),
        Recipe("pixel budget + EMA 0.999", ["train.ema=0.999"], optional=True),
        Recipe("pixel budget + EMA 0.99", ["train.ema=0.99"], optional=True),
        Recipe("batch 1", ["data.max_pixels=null", "data.batch_size=1"]),
        Recipe(
            f"random {ch} x {cw} crops, batches of {setting.crop_batch}",
            ["data.max_pixels=null", f"data.batch_size={setting.crop_batch}", f"data.crop=[{ch}, {cw}]"],
            "crop",
            tiled=True,
        ),
        Recipe(f"resized to {setting.resize[0]} x {setting.resize[1]}", [], "resize"),
    ]


def scan_sizes(folder: Path) -> list[tuple[int, int]]:
    """(H, W) of every image of a generated folder, in name order."""
    sizes = []
    for path in sorted((folder / "images").glob("*.png")):
        with Image.open(path) as image:
            sizes.append((image.height, image.width))
    return sizes


def resized_copy(source: Path, target: Path, size: tuple[int, int]) -> Path:
    """Every scan of ``source`` resized to ``size`` (H, W) into ``target``: image bilinear (PIL's, antialiased when
    it shrinks), mask nearest, as resize-based pipelines prepare their data."""
    for sub, method in (("images", Image.BILINEAR), ("masks", Image.NEAREST)):
        (target / sub).mkdir(parents=True, exist_ok=True)
        for path in sorted((source / sub).glob("*.png")):
            with Image.open(path) as image:
                image.resize((size[1], size[0]), method).save(target / sub / path.name)
    return target


def epochs_for(recipe: Recipe, setting: Setting, sizes: list[tuple[int, int]]) -> int:
    """Epochs that give ``recipe`` the real pixels of ``setting.epochs`` epochs of the whole training scans."""
    whole = sum(h * w for h, w in sizes) * setting.epochs
    if recipe.serves == "crop":
        per_epoch = sum(h * w for h, w in crop_sizes(sizes, setting.crop))
    elif recipe.serves == "resize":
        per_epoch = len(sizes) * setting.resize[0] * setting.resize[1]
    else:
        return setting.epochs
    return max(1, round(whole / per_epoch))


def training_waste(recipe: Recipe, cfg, sizes: list[tuple[int, int]], setting: Setting) -> float:
    """Padding waste of one epoch's training batches as the trainer's sampler makes them (every scan trains)."""
    if recipe.serves == "resize":
        return 0.0  # one size, a multiple of the divisor
    served = crop_sizes(sizes, setting.crop) if recipe.serves == "crop" else sizes
    budget = {"batch_size": cfg.data.batch_size, "max_pixels": cfg.data.max_pixels}
    layout = batch_layout(served, **budget, divisor=2**cfg.model.depth, val_fraction=None, seed=cfg.run.seed)
    return waste(layout.batches)


def predict_scores(ckpt: Path, folder: Path, num_classes: int, *, tile=None, resize=None) -> Score:
    """Score the model of ``ckpt`` on every scan of ``folder``: whole scans, or tiles of ``tile`` pixels at most,
    or each scan resized to ``resize`` (H, W) and its probabilities resized back (bilinear) before the argmax."""
    predictor = Predictor.from_checkpoint(ckpt, device="cpu", max_pixels=tile, max_batch=1)
    names = sorted(p.name for p in (folder / "images").glob("*.png"))
    widths = [w for _, w in scan_sizes(folder)]  # in name order, as ``names``
    cuts = np.quantile(widths, [1 / 3, 2 / 3])
    score = Score(num_classes)
    for name, width in zip(names, widths):
        truth = read_mask(folder / "masks" / name).numpy()
        if resize is None:
            (predicted,) = predictor.predict([read_image(folder / "images" / name)])
            predicted = predicted.numpy().astype(np.uint8)
        else:
            with Image.open(folder / "images" / name) as image:
                small = image.convert("RGB").resize((resize[1], resize[0]), Image.BILINEAR)
            tensor = torch.from_numpy(np.asarray(small).copy()).permute(2, 0, 1).contiguous()
            (probabilities,) = predictor.probabilities([tensor])  # [K, h, w]
            # probabilities back to the scan's size, bilinear, then the class map: a fairer return trip for thin
            # curves than enlarging the class map itself
            back = torch.nn.functional.interpolate(probabilities[None], size=truth.shape, mode="bilinear")
            predicted = back[0].argmax(0).numpy().astype(np.uint8)
        score.add(truth, predicted, int(np.searchsorted(cuts, width, side="right")))
    return score


def make_sets(work: Path, setting: Setting, task: str, seed: int) -> dict[str, Path]:
    """Training, validation and held-out folders of ``task`` for ``seed`` (generated when missing)."""
    sets = {
        "train": (setting.train_scans, seed),
        "val": (setting.val_scans, 500 + seed),
        "test": (setting.test_scans, 1000 + seed),
    }
    folders = {}
    for part, (n, data_seed) in sets.items():
        folder = work / f"{task}_{seed}_scale{setting.scale:g}" / f"{part}_{n}"
        make_welllog_scans(folder, n, scale=setting.scale, seed=data_seed, classes=task, workers=1, only_missing=True)
        folders[part] = folder
    return folders


def run_recipe(recipe: Recipe, setting: Setting, task: str, seed: int, sets: dict[str, Path], work: Path) -> dict:
    """Train ``recipe`` on ``sets["train"]`` and score it on ``sets["test"]``; one result row."""
    sizes = scan_sizes(sets["train"])
    train_root = sets["train"]
    if recipe.serves == "resize":
        resized = sets["train"].parent / f"{sets['train'].name}_resized_{setting.resize[0]}x{setting.resize[1]}"
        train_root = resized_copy(sets["train"], resized, setting.resize)
    run_dir = work / "runs" / f"{task}_{seed}_{recipe.name.split()[0]}_{abs(hash(recipe.name)) % 10**6}"
    overrides = [
        f"run.dir={run_dir}",
        f"run.seed={seed}",
        "run.device=cpu",
        "data.synthetic.root=null",
        f"data.dataset.args.root={train_root}",
        "data.val_dataset.class=srforge.data.datasets:SegmentationFolder",
        f"data.val_dataset.args.root={sets['val']}",
        f"model.num_classes={len(TASKS[task])}",
        f"model.class_names={json.dumps(TASKS[task])}",
        f"train.epochs={epochs_for(recipe, setting, sizes)}",
        f"train.val_every={epochs_for(recipe, setting, sizes)}",  # only after the last epoch: not timed per recipe
        *recipe.overrides,
    ]
    cfg = load_config(CONFIG, overrides)
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        train(cfg, overwrite=True)
    seconds = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    k = len(TASKS[task])
    resize = setting.resize if recipe.serves == "resize" else None
    scores = {"whole": predict_scores(run_dir / "best.pt", sets["test"], k, resize=resize)}
    if recipe.tiled:
        scores["tiled"] = predict_scores(run_dir / "best.pt", sets["test"], k, tile=setting.crop[0] * setting.crop[1])
    row = {"recipe": recipe.name, "task": task, "seed": seed, "epochs": cfg.train.epochs, "steps": rows[-1]["step"]}
    row["checkpoint"] = run_dir / "best.pt"  # for the resolution table; not written to the JSON
    row |= {"seconds": round(seconds, 1), "waste": training_waste(recipe, cfg, sizes, setting)}
    for how, score in scores.items():
        row[how] = {"fg_iou": score.foreground_iou(), "class_iou": score.class_iou(), "thirds": score.third_iou()}
    return row


RESOLUTION_WAYS = {
    "mixed": "a set of scans at 0.5x-2x (data.synthetic.scale: [lo, hi])",
    "rescaled": "scans at 1x rescaled by data.augment.scale: [0.5, 2]",
    "single": "scans at 1x only (the default recipe's binary run)",
}


def resolution_rows(setting: Setting, seed: int, work: Path, single: Path | None = None) -> list[dict]:
    """Binary models of the default recipe that meet scans of other resolutions, scored on held-out scans at 0.5x,
    1x and 2x ``setting.scale``: trained on a set that mixes resolutions from 0.5x to 2x (as an archive scanned at
    several resolutions does), on 1x scans rescaled by ``data.augment.scale: [0.5, 2]``, and on 1x scans alone
    (``single``: the binary table's default run, trained here when None). The first two see about 1.35x the pixels
    of the third (a factor log-uniform in [0.5, 2] scales a scan's pixels by 1.35 on average)."""
    binary = make_sets(work, setting, "binary", seed)
    mixed = work / f"resolution_{seed}_scale{setting.scale / 2:g}-{setting.scale * 2:g}_n{setting.train_scans}"
    make_welllog_scans(
        mixed,
        setting.train_scans,
        scale=(setting.scale / 2, setting.scale * 2),
        seed=seed,
        workers=1,
        only_missing=True,
    )
    ways = [("mixed", mixed, []), ("rescaled", binary["train"], ["data.augment.scale=[0.5, 2.0]"])]
    if single is None:
        ways.append(("single", binary["train"], []))
    checkpoints = {}
    for way, train_set, extra in ways:
        run_dir = work / "runs" / f"resolution_{way}_{seed}"
        overrides = [
            f"run.dir={run_dir}",
            f"run.seed={seed}",
            "run.device=cpu",
            "data.synthetic.root=null",
            f"data.dataset.args.root={train_set}",
            "data.val_dataset.class=srforge.data.datasets:SegmentationFolder",
            f"data.val_dataset.args.root={binary['val']}",
            f"train.epochs={setting.epochs}",
            f"train.val_every={setting.epochs}",
            *extra,
        ]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            train(load_config(CONFIG, overrides), overwrite=True)
        checkpoints[way] = run_dir / "last.pt"
    checkpoints.setdefault("single", single)
    rows = []
    for factor in (0.5, 1.0, 2.0):
        n = setting.resolution_test_scans
        test = work / f"resolution_test_{seed}_scale{setting.scale * factor:g}_n{n}"
        make_welllog_scans(test, n, scale=setting.scale * factor, seed=1000 + seed, workers=1, only_missing=True)
        for way, ckpt in checkpoints.items():
            score = predict_scores(ckpt, test, 2)
            rows.append(
                {
                    "seed": seed,
                    "way": way,
                    "factor": factor,
                    "fg_iou": score.foreground_iou(),
                    "thirds": score.third_iou(),
                }
            )
    return rows


def print_resolution(rows: list[dict]) -> None:
    """The resolution table: one row per training set and held-out resolution."""
    print(f"\nresolution (binary, seeds {sorted({r['seed'] for r in rows})}):")
    print("| trained on | held-out scans at | fg IoU | narrowest / middle / widest third |\n| --- | --- | --- | --- |")
    for way in RESOLUTION_WAYS:
        for factor in (0.5, 1.0, 2.0):
            mine = [r for r in rows if r["way"] == way and r["factor"] == factor]
            if mine:
                thirds = " / ".join(f"{t:.3f}" for t in np.mean([r["thirds"] for r in mine], axis=0))
                print(f"| {RESOLUTION_WAYS[way]} | {factor}x | {mean_sd([r['fg_iou'] for r in mine])} | {thirds} |")


def mean_sd(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f}"


def print_table(rows: list[dict], task: str) -> None:
    """One markdown table of ``task``: each recipe's mean (± sample sd over seeds) of every figure."""
    classes = TASKS[task]
    print(f"\n{task} (seeds {sorted({r['seed'] for r in rows if r['task'] == task})}):")
    head = ["recipe", "fg IoU", *[f"IoU {c}" for c in classes[1:]], "fg IoU by width third", "steps", "s", "waste"]
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    names = list(dict.fromkeys(r["recipe"] for r in rows if r["task"] == task))
    for name in names:
        mine = [r for r in rows if r["task"] == task and r["recipe"] == name]
        for how in ("whole", "tiled"):
            if how not in mine[0]:
                continue
            label = name + (", predicted by tiles" if how == "tiled" else "")
            cells = [label, mean_sd([r[how]["fg_iou"] for r in mine])]
            cells += [mean_sd([r[how]["class_iou"][c] for r in mine]) for c in range(1, len(classes))]
            thirds = np.mean([r[how]["thirds"] for r in mine], axis=0)
            cells.append(" / ".join(f"{t:.3f}" for t in thirds))
            cells += [f"{np.mean([r['steps'] for r in mine]):.0f}", f"{np.mean([r['seconds'] for r in mine]):.0f}"]
            cells.append(f"{np.mean([r['waste'] for r in mine]):.1%}")
            print("| " + " | ".join(cells) + " |")


def self_test() -> list[str]:
    """The benchmark's own arithmetic on hand-computed cases (``--self-test``): every recipe gets the whole scans'
    real pixels, and the Score pools pixels and splits them by width third. Returns what failed (empty: all held)."""
    failed = []
    setting = Setting(epochs=12, crop=(24, 128), resize=(32, 512))
    sizes = [(30 + i % 11, 200 + 37 * i) for i in range(20)]
    whole = sum(h * w for h, w in sizes) * setting.epochs
    for recipe in recipes(setting):
        if recipe.serves == "crop":
            per_epoch = sum(min(h, 24) * min(w, 128) for h, w in sizes)
        elif recipe.serves == "resize":
            per_epoch = len(sizes) * 32 * 512
        else:
            per_epoch = whole / setting.epochs
        if abs(epochs_for(recipe, setting, sizes) * per_epoch - whole) > per_epoch / 2 + 1:  # whole epochs
            failed.append(f"{recipe.name}: not the whole scans' real pixels")
    score = Score(3)
    truth = np.array([[0, 1, 2, 0]], np.uint8)
    score.add(truth, np.array([[0, 2, 2, 1]], np.uint8), third=0)  # foreground: 2 hits, 1 false positive
    score.add(truth, truth, third=2)
    first, middle, last = score.third_iou()
    checks = {
        "foreground IoU 4/5": math.isclose(score.foreground_iou(), 4 / 5),
        "class IoU 1/3 and 2/3": score.class_iou()[1] == 1 / 3 and score.class_iou()[2] == 2 / 3,
        "thirds 2/3, NaN, 1": first == 2 / 3 and math.isnan(middle) and last == 1.0,
    }
    return failed + [f"Score: {name} does not hold" for name, held in checks.items() if not held]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--epochs", type=int, default=12, help="epochs of whole scans; the others get equal pixels")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--recipes", nargs="+", default=None, help="only recipes whose name holds one of these words")
    parser.add_argument("--resolution", action="store_true", help="add the 0.5x / 1x / 2x resolution table")
    parser.add_argument("--quick", action="store_true", help="a smoke test: tiny scans, one epoch, one seed")
    parser.add_argument("--work", type=Path, default=None, help="folder for data and runs (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_quality.json")
    parser.add_argument("--self-test", action="store_true", help="check the benchmark's arithmetic on hand-made cases")
    args = parser.parse_args(argv)
    if args.self_test:
        failed = self_test()
        print("\n".join(failed) if failed else "bench_quality self-test: every check held")
        return 1 if failed else 0
    torch.set_num_threads(max(1, torch.get_num_threads()))
    setting = Setting(epochs=args.epochs)
    if args.quick:
        setting = Setting(
            scale=0.04,
            train_scans=6,
            test_scans=3,
            resolution_test_scans=3,
            val_scans=2,
            epochs=1,
            crop=(16, 64),
            resize=(24, 256),
        )
        args.seeds, args.tasks = args.seeds[:1], ["binary"]
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        rows = []
        for task in args.tasks:
            for seed in args.seeds:
                sets = make_sets(work, setting, task, seed)
                for recipe in recipes(setting):
                    if args.recipes and not any(word in recipe.name for word in args.recipes):
                        continue
                    if recipe.optional and not args.recipes:
                        continue
                    rows.append(run_recipe(recipe, setting, task, seed, sets, work))
                    print(json.dumps({k: rows[-1][k] for k in ("task", "seed", "recipe", "steps", "seconds")}))
            print_table(rows, task)
        resolution = []
        if args.resolution:
            for seed in args.seeds:
                single = [r for r in rows if r["task"] == "binary" and r["seed"] == seed and r["recipe"] == DEFAULT]
                resolution += resolution_rows(setting, seed, work, single[0]["checkpoint"] if single else None)
            print_resolution(resolution)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in row.items() if k != "checkpoint"} for row in rows]
    args.out.write_text(json.dumps({"setting": setting.__dict__, "rows": rows, "resolution": resolution}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
