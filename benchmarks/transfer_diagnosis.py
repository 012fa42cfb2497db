"""What the gap between srforge's generator and the second renderer is made of (issue 37), read from the models and
sets bench_transfer.py left in its work folder (run it first):

- curve thickness: the mean length of the vertical runs of curve pixels, in the masks of each renderer's training
  scans, in the same-well test masks, and in the predictions of the generator's model and the renderer's own model;
- the mask's edge: the mean grey of the pixels just inside a mask, just outside it (1 and 2 px) and far from it, and
  where the first pixel outside lies between paper (0) and ink (1), for each renderer's scans;
- the decision threshold: foreground IoU of each model on each test set when a pixel is curve at p(curve) >= t, for
  a few t (chosen on the test set itself: an optimistic bound on what recalibration could give).

With ``--false-marks RUN ...`` (run folders under WORK/runs, by a part of their name) it says instead where each
run's false marks lie on the dev and test sets: its marks more than 2 px from every curve pixel (what the tolerance
precision counts against it), split into those inside the renderer's header panel (its width from the renderer's
plan of the scan), on border and grid lines (rows whose false marks cover 30% of the width), 3-4 px and 5-8 px from
a curve, and further away.

With ``--calibration RUN ...`` it says whether a decision made after the model would close the tolerance-F1 gap:
each run's foreground IoU and tolerance F1 (precision, recall) on every set with a pixel curve at p(curve) >= t for
a few t, and at 0.5 with the connected curve pieces under N px removed, for a few N (the evaluator's counts). With
``--teacher RUN ...`` it says how a teacher's confident pixels split, as the flip teacher sees them: for a few
thresholds, the share of the true curve pixels whose p(curve) reaches it, and how many pixels more than 2 px from
every curve pixel in either axis (as ``--false-marks`` counts) do: the false curve a student would learn at that
confidence; and the share of the curve pixels whose p(paper) reaches it (the paper a student would learn where a
curve is) beside the share of those far pixels that do. With ``--paper-ink RUN ...`` it says how dark the pixels
are that such a teacher is sure are paper (srforge.models.ink's ink value, 1 on the scan's paper): the curve pixels it
would teach as paper, and the pixels far from a curve. With ``--ensemble RUN ...`` it scores the runs alone and
as one model, the mean of their p(curve): how far what the runs share is from what each alone gets. With ``--misses
A B`` it says which same-well curve pixels the runs named like A (as one) and those named like B miss, what is
around them, and how many lie at a track's edge or on a straight stretch.

    python benchmarks/transfer_diagnosis.py [--work benchmarks/results/transfer_work] [--seed 0]
    python benchmarks/transfer_diagnosis.py --false-marks "plain_self-training_and_skeleton_loss_other" "_ink_seed"
    python benchmarks/transfer_diagnosis.py --calibration "student_trained_twice_as_long_other" "epochs24_seed"
    python benchmarks/transfer_diagnosis.py --teacher "own_curves*with_the_flip_teacher_and_skeleton_loss_other*_u72"
    python benchmarks/transfer_diagnosis.py --paper-ink "own_curves*with_the_flip_teacher_and_skeleton_loss_other*_u72"
    python benchmarks/transfer_diagnosis.py --ensemble "renderer_ddb3cbe75c_seed"
    python benchmarks/transfer_diagnosis.py --misses "own_curves*confidence_of_0.95_other" "renderer_ddb3cbe75c_seed"
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy import ndimage

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import bench_transfer  # noqa: E402
import log_plotter  # noqa: E402

from srforge.evaluate.metrics import batch_counts, per_class  # noqa: E402
from srforge.models.ink import ink_image  # noqa: E402
from srforge.predict import Predictor  # noqa: E402

GENERATOR = "srforge_generator_own_curves_randomisation_on_seed{seed}_"
THRESHOLDS = (0.5, 0.4, 0.3, 0.2)
CALIBRATION = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99)  # p(curve) a pixel needs to be curve
PIECES = (4, 8, 16)  # px: connected curve pieces smaller than this are removed
CONFIDENCES = (0.5, 0.9, 0.95, 0.97, 0.99)
INK_VALUES = (0.5, 0.7, 0.8, 0.9, 0.95)


def vertical_runs(mask: np.ndarray) -> np.ndarray:
    """The lengths of the vertical runs of True in bool [H, W]."""
    edges = np.diff(np.pad(mask.astype(np.int8), ((1, 1), (0, 0))), axis=0)
    return np.flatnonzero(edges.T == -1) - np.flatnonzero(edges.T == 1)


def horizontal_runs(mask: np.ndarray) -> np.ndarray:
    """int [H, W]: the length of the run of True along its row through each pixel of bool ``mask`` [H, W], 0 off
    it."""
    pieces, _ = ndimage.label(mask, structure=[[0, 0, 0], [1, 1, 1], [0, 0, 0]])
    lengths = np.bincount(pieces.ravel())
    lengths[0] = 0
    return lengths[pieces]


def track_edges(plan: dict, shape: tuple[int, int]) -> np.ndarray:
    """bool ``shape`` [H, W]: in each column, the rows within 2 px of the row a track's top or bottom edge in the
    renderer's ``plan`` (log_plotter.plan_scan) crosses, where a trace pegged at the edge runs. The edge at y crosses
    column x (its centre x + 0.5) at y' = cy + (x + 0.5 - cx) sin(skew) + (y - cy) cos(skew), the plan's skew being a
    rotation of the drawing about its centre (cx, cy), and lies in row floor(y'), row r covering [r, r + 1)."""
    height, width = shape
    skew = math.radians(plan["style"]["skew"])
    cx, cy = width / 2, height / 2
    across = (np.arange(width) + 0.5 - cx) * math.sin(skew)  # [W]
    rows = np.arange(height)[:, None]  # [H, 1]
    edges = np.zeros(shape, bool)
    for band in plan["bands"]:
        if band["kind"] == "track":
            for y in (band["y0"], band["y1"]):
                row = np.floor(cy + across + (y - cy) * math.cos(skew))  # [W]
                edges |= np.abs(rows - row[None, :]) <= 2
    return edges


def read(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def pairs(folder: Path, limit: int = 40) -> list[tuple[Path, Path]]:
    images = sorted(folder.rglob("images/*.png"))[:limit]
    return [(image, image.parent.parent / "masks" / image.name) for image in images]


def edge_greys(found: list[tuple[Path, Path]]) -> list[float]:
    """Mean grey just inside the masks, 1 and 2 px outside, and 4+ px away."""
    sums, counts = np.zeros(4), np.zeros(4)
    for image, mask_path in found:
        grey = np.asarray(Image.open(image).convert("L"), dtype=np.float64)
        mask = np.asarray(Image.open(mask_path)) > 0
        one = ndimage.binary_dilation(mask) & ~mask
        two = ndimage.binary_dilation(mask, iterations=2) & ~mask & ~one
        far = ~ndimage.binary_dilation(mask, iterations=4)
        for i, where in enumerate((mask & ~ndimage.binary_erosion(mask), one, two, far)):
            sums[i], counts[i] = sums[i] + grey[where].sum(), counts[i] + where.sum()
    return list(sums / counts)


def probabilities(predictor: Predictor, image: np.ndarray) -> np.ndarray:
    scan = torch.from_numpy(image.copy()).permute(2, 0, 1).contiguous()
    return predictor.probabilities([scan])[0][1].float().numpy()


def scan_plans(work: Path, sets: Path):
    """plan(set name, scan image path): the renderer's plan (log_plotter.plan_scan) of that scan of the sets
    ``sets`` in ``work``, its number read from the file's name (00007.png: 7); each set's well read once, when
    first asked for."""
    splits = bench_transfer.las_splits(work / "las", work)
    scale = float(sets.name.rsplit("_s", 1)[1])
    wells = {}

    def plan(name: str, image: Path) -> dict:
        if name not in wells:
            wells[name] = log_plotter.read_well(splits["train" if name == "dev" else name])
        return log_plotter.plan_scan(wells[name], bench_transfer.SET_SEEDS[name], int(image.stem), scale)

    return plan


def false_marks(predictor: Predictor, folder: Path, plan) -> dict[str, float]:
    """Tolerance precision of ``predictor`` on the renderer's set ``folder`` (each scan's plan from ``plan``(image
    path), :func:`scan_plans`) and the shares of its false marks (> 2 px from every curve pixel) by where they
    lie."""
    kinds = ("header panel", "border and grid lines", "3-4 px from a curve", "5-8 px", "further")
    counts, kept = dict.fromkeys(kinds, 0), 0
    for image, mask_path in pairs(folder, limit=1000):
        truth = np.asarray(Image.open(mask_path)) > 0
        marks = probabilities(predictor, read(image)) >= 0.5
        near = {r: ndimage.binary_dilation(truth, np.ones((2 * r + 1, 2 * r + 1), bool)) for r in (2, 4, 8)}
        false = marks & ~near[2]
        kept += int((marks & near[2]).sum())
        header = np.zeros_like(false)
        width = round(plan(image)["header"])
        header[:, : width + 2 if width else 0] = True
        lines = np.broadcast_to((false.mean(1) > 0.3)[:, None], false.shape)
        rest = false & ~header & ~lines
        found = (false & header, false & ~header & lines, rest & near[4], rest & near[8] & ~near[4], rest & ~near[8])
        for kind, where in zip(kinds, found):
            counts[kind] += int(where.sum())
    total = max(1, sum(counts.values()))
    return {"tolerance precision": kept / max(1, kept + total), **{k: v / total for k, v in counts.items()}}


def runs_and_sets(work: Path, names: list[str]) -> tuple[list[Path], Path]:
    """(the run folders whose name holds one of ``names`` as bench_transfer.holds reads them: any case, ``*`` and
    ``?`` wildcards; the renderer's dev and test sets)."""
    runs = sorted(run for run in (work / "runs").iterdir() if any(bench_transfer.holds(run.name, n) for n in names))
    sets = next(work.glob("sets_*"), None)
    if not runs or sets is None:
        raise SystemExit(f"{work}: no run named like {names} and the renderer's sets; run bench_transfer.py first")
    return runs, sets


def curve_figures(marks: np.ndarray, truth: np.ndarray) -> torch.Tensor:
    """The evaluator's counts of one scan (bool [H, W] predicted and true curve): confusion [2, 2] and tolerance
    [2, 4] flattened into one int64 [12], to be summed over a set."""
    counts = batch_counts(torch.from_numpy(marks)[None].long(), torch.from_numpy(truth)[None].long(), 2, 255, 2)
    return torch.cat([counts["confusion"][0].reshape(-1), counts["tolerance"][0].reshape(-1)])


def summary(counts: torch.Tensor) -> str:
    """IoU / tolerance F1 (precision, recall) of the curve class from :func:`curve_figures`' summed counts."""
    scores = {k: float(v[1]) for k, v in per_class(counts[:4].view(2, 2), counts[4:].view(2, 4)).items()}
    return f"{scores['iou']:.3f} / {scores['tol_f1']:.4f} ({scores['tol_precision']:.3f}, {scores['tol_recall']:.3f})"


def without_pieces(marks: np.ndarray, smallest: int) -> np.ndarray:
    """``marks`` without its 8-connected pieces of fewer than ``smallest`` pixels."""
    pieces, _ = ndimage.label(marks, structure=np.ones((3, 3), bool))
    sizes = np.bincount(pieces.ravel())
    keep = sizes >= smallest
    keep[0] = False
    return keep[pieces]


def print_calibration(work: Path, names: list[str]) -> None:
    """--calibration: each run whose folder name holds one of ``names``, on every renderer set."""
    runs, sets = runs_and_sets(work, names)
    print("curve IoU / tolerance F1 (tolerance precision, recall) at p(curve) >= t, and with pieces under N px gone:")
    for run in runs:
        predictor = Predictor.from_checkpoint(run / "best.pt", device="cpu")
        for name in bench_transfer.SET_SEEDS:
            at, small = {t: 0 for t in CALIBRATION}, {n: 0 for n in PIECES}
            for image, mask_path in pairs(sets / name, limit=1000):
                truth = np.asarray(Image.open(mask_path)) > 0
                curve = probabilities(predictor, read(image))
                for t in CALIBRATION:
                    at[t] = at[t] + curve_figures(curve >= t, truth)
                marks = curve >= 0.5
                for n in PIECES:
                    small[n] = small[n] + curve_figures(without_pieces(marks, n), truth)
            print(f"  {run.name}, {name}:")
            print("    " + "; ".join(f"t {t}: {summary(c)}" for t, c in at.items()))
            print("    " + "; ".join(f"N {n}: {summary(c)}" for n, c in small.items()))


def flip_teacher_sets(work: Path, names: list[str]):
    """Each run whose folder name holds one of ``names`` (the runs found now, so that a wrong name fails first), as
    a flip teacher, on every renderer set: an iterator of (run folder, set name, its scans), the scans an iterator of
    (truth bool [H, W], scan uint8 [H, W, 3], the teacher's p(curve) float [H, W]), one scan predicted at a time."""
    runs, sets = runs_and_sets(work, names)

    def each():
        for run in runs:
            predictor = Predictor.from_checkpoint(run / "best.pt", device="cpu", tta="flip")
            for name in bench_transfer.SET_SEEDS:
                scans = ((np.asarray(Image.open(m)) > 0, read(i)) for i, m in pairs(sets / name, limit=1000))
                yield run, name, ((truth, scan, probabilities(predictor, scan)) for truth, scan in scans)

    return each()


def far_from(truth: np.ndarray) -> np.ndarray:
    """bool [H, W]: the pixels more than 2 px from every pixel of ``truth`` [H, W] in either axis (a 5 x 5 square)."""
    return ~ndimage.binary_dilation(truth, np.ones((5, 5), bool))


def print_teacher(work: Path, names: list[str]) -> None:
    """--teacher: each run whose folder name holds one of ``names``, as a flip teacher, on every renderer set."""
    found_sets = flip_teacher_sets(work, names)
    print("the flip teacher's confident pixels: curve, the share of the curve pixels / pixels > 2 px from a curve at")
    print("p(curve) >= c; paper, the share of the curve pixels / of the pixels > 2 px from a curve at p(paper) >= c:")
    for run, name, scans in found_sets:
        on, off = [], []
        for truth, _, curve in scans:
            on.append(curve[truth])
            off.append(curve[far_from(truth)])
        on, off = np.concatenate(on), np.concatenate(off)
        found = "; ".join(f"c {c}: {(on >= c).mean():.3f} / {int((off >= c).sum())}" for c in CONFIDENCES)
        # two classes: p(paper) = 1 - p(curve)
        paper = "; ".join(f"c {c}: {(on <= 1 - c).mean():.3f} / {(off <= 1 - c).mean():.4f}" for c in CONFIDENCES)
        print(f"  {run.name}, {name}:\n    curve {found}\n    paper {paper}")


def paper_inks(curve: np.ndarray, truth: np.ndarray, ink: np.ndarray, sure: float = 0.9) -> tuple:
    """(the ink values of the true curve pixels, those of the pixels more than 2 px from every curve pixel in either
    axis) among the pixels whose p(paper) = 1 - ``curve`` is at least ``sure``; each argument [H, W]."""
    paper = curve <= 1 - sure
    return ink[paper & truth], ink[paper & far_from(truth)]


def print_paper_ink(work: Path, names: list[str]) -> None:
    """--paper-ink: each run whose folder name holds one of ``names``, as a flip teacher: of the pixels it is at least
    0.9 sure are paper, the true curve pixels and those more than 2 px from a curve, by their ink value
    (srforge.models.ink: the darkest channel against the scan's paper, 1 on paper), on every renderer set."""
    found_sets = flip_teacher_sets(work, names)
    print("the flip teacher's paper at p(paper) >= 0.9: the share of the curve pixels it holds, and the share of those")
    print("and of its pixels > 2 px from a curve whose ink value is under v (1: the scan's paper):")
    for run, name, scans in found_sets:
        on, off, curves = [], [], 0
        for truth, scan, curve in scans:
            ink = ink_image(torch.from_numpy(scan.copy()).permute(2, 0, 1)[None])[0, 0].numpy()
            curve_inks, far_inks = paper_inks(curve, truth, ink)
            on.append(curve_inks)
            off.append(far_inks)
            curves += int(truth.sum())
        on, off = np.concatenate(on), np.concatenate(off)
        split = "; ".join(f"v {v}: {(on < v).mean():.3f} / {(off < v).mean():.4f}" for v in INK_VALUES)
        print(f"  {run.name}, {name}: {on.size / curves:.3f} of the curve pixels; {split}")


def print_ensemble(work: Path, names: list[str]) -> None:
    """--ensemble: the runs whose folder name holds one of ``names``, each alone and as one model (the mean of their
    p(curve)), on every renderer set."""
    runs, sets = runs_and_sets(work, names)
    predictors = [Predictor.from_checkpoint(run / "best.pt", device="cpu") for run in runs]
    print("curve IoU / tolerance F1 (tolerance precision, recall) of " + ", ".join(run.name for run in runs) + ":")
    for name in bench_transfer.SET_SEEDS:
        alone, together = [0] * len(runs), 0
        for image, mask_path in pairs(sets / name, limit=1000):
            truth = np.asarray(Image.open(mask_path)) > 0
            curves = [probabilities(predictor, read(image)) for predictor in predictors]
            alone = [counts + curve_figures(curve >= 0.5, truth) for counts, curve in zip(alone, curves)]
            together = together + curve_figures(np.mean(curves, axis=0) >= 0.5, truth)
        print(f"  {name}: each {'; '.join(summary(c) for c in alone)}; their mean {summary(together)}")


def print_misses(work: Path, names: list[str]) -> None:
    """--misses A B: the runs whose folder name holds ``A`` as one model (the mean of their p(curve)) against those
    whose name holds ``B``, on the same-well set: the curve pixels each finds (a mark within 2 px in either axis, as
    --false-marks counts, looser than the evaluator's disc) and misses, what lies around them (9x9), and where: the
    share within 2 px of a track's edge (:func:`track_edges`, where pegged traces lie) and, elsewhere, on a straight
    row of at least 20 curve pixels (a flat stretch of a curve, as a grid line looks)."""
    groups = []
    for name in names:
        runs, sets = runs_and_sets(work, [name])
        groups.append([Predictor.from_checkpoint(run / "best.pt", device="cpu") for run in runs])
        print(f"{name}: {len(runs)} runs as one")
    kinds = {"found by both": (True, True), f"missed by {names[0]} alone": (False, True),
             f"missed by {names[1]} alone": (True, False), "missed by both": (False, False)}  # fmt: skip
    found = {kind: [] for kind in kinds}
    near = np.ones((5, 5), bool)
    plan = scan_plans(work, sets)
    for image, mask_path in pairs(sets / "test_same_well", limit=1000):
        truth, scan = np.asarray(Image.open(mask_path)) > 0, read(image)
        edge = track_edges(plan("test_same_well", image), truth.shape)
        straight = ~edge & (horizontal_runs(truth) >= 20)
        grey = scan[..., :3].astype(float) @ np.array([0.299, 0.587, 0.114])
        hits = [ndimage.binary_dilation(np.mean([probabilities(p, scan) for p in group], axis=0) >= 0.5, near)
                for group in groups]  # fmt: skip
        darker = ndimage.median_filter(grey, size=9) - grey  # how much darker than its neighbourhood's median
        curve_around = ndimage.uniform_filter(truth.astype(float), size=9)
        ink_around = ndimage.uniform_filter(((grey < 150) & far_from(truth)).astype(float), 9)
        for kind, (a, b) in kinds.items():
            where = truth & (hits[0] == a) & (hits[1] == b)
            found[kind].append(
                np.stack([darker[where], curve_around[where], ink_around[where], edge[where], straight[where]])
            )
    total = sum(np.concatenate(v, axis=1).shape[1] for v in found.values())
    print("same-well curve pixels: share; grey levels darker than their 9x9 median; the 9x9 share of curve pixels and")
    print("of ink (grey < 150) more than 2 px from a curve (medians, the last a mean); the shares of them within 2 px")
    print("of a track's edge and, elsewhere, on a straight row of >= 20 curve pixels:")
    for kind, parts in found.items():
        below, curve, ink, at_edge, on_row = np.concatenate(parts, axis=1)
        print(
            f"  {kind}: {below.size / total:.3f}; {np.median(below):.0f}; {np.median(curve):.2f}, {ink.mean():.3f}; "
            f"{at_edge.mean():.3f}, {on_row.mean():.3f}"
        )


def print_false_marks(work: Path, names: list[str]) -> None:
    """--false-marks: each run whose folder name holds one of ``names``, on every renderer set."""
    runs, sets = runs_and_sets(work, names)
    plan = scan_plans(work, sets)
    print("tolerance precision, and where the false marks lie (shares of them):")
    for run in runs:
        predictor = Predictor.from_checkpoint(run / "best.pt", device="cpu")
        for name in bench_transfer.SET_SEEDS:
            found = false_marks(predictor, sets / name, lambda image, name=name: plan(name, image))
            shares = ", ".join(f"{k} {v:.2f}" for k, v in found.items() if k != "tolerance precision")
            print(f"  {run.name}, {name}: {found['tolerance precision']:.3f}; {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "results" / "transfer_work")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--false-marks", nargs="+", metavar="RUN", help="where these runs' false marks lie")
    parser.add_argument("--calibration", nargs="+", metavar="RUN", help="these runs at other thresholds")
    parser.add_argument("--teacher", nargs="+", metavar="RUN", help="these runs' confident pixels, as flip teachers")
    parser.add_argument("--paper-ink", nargs="+", metavar="RUN", help="these runs' confident paper, by ink value")
    parser.add_argument("--ensemble", nargs="+", metavar="RUN", help="these runs alone and as one (mean p(curve))")
    parser.add_argument("--misses", nargs=2, metavar=("A", "B"), help="the curve pixels runs A and runs B miss")
    args = parser.parse_args()
    for option, report in ((args.false_marks, print_false_marks), (args.calibration, print_calibration),
                           (args.teacher, print_teacher), (args.paper_ink, print_paper_ink),
                           (args.ensemble, print_ensemble),
                           (args.misses, print_misses)):  # fmt: skip
        if option:
            return report(args.work, option)
    runs = args.work / "runs"
    generator = next(runs.glob(GENERATOR.format(seed=args.seed) + "n*"), None)
    renderer = next(runs.glob(f"renderer_*_seed{args.seed}_*"), None)
    sets = next(args.work.glob("sets_*"), None)
    if generator is None or renderer is None or sets is None:
        raise SystemExit(f"{args.work}: run benchmarks/bench_transfer.py first (seed {args.seed}, both models)")
    models = {"generator's model": Predictor.from_checkpoint(generator / "best.pt", device="cpu"),
              "renderer's model": Predictor.from_checkpoint(renderer / "best.pt", device="cpu")}  # fmt: skip
    training = {"generator": pairs(args.work / "srforge_train" / generator.name),
                "renderer": pairs(args.work / "renderer_train")}  # fmt: skip
    same_well = pairs(sets / "test_same_well", limit=1000)

    print("vertical runs of curve pixels (mean px):")
    for name, found in training.items():
        runs_ = np.concatenate([vertical_runs(np.asarray(Image.open(m)) > 0) for _, m in found])
        print(f"  {name} training masks: {runs_.mean():.2f}")
    truth = [np.asarray(Image.open(m)) > 0 for _, m in same_well]
    print(f"  same-well test masks: {np.concatenate([vertical_runs(t) for t in truth]).mean():.2f}")
    predicted = {name: [probabilities(p, read(i)) for i, _ in same_well] for name, p in models.items()}
    for name, probs in predicted.items():
        mean = np.concatenate([vertical_runs(q >= 0.5) for q in probs]).mean()
        print(f"  {name}'s same-well predictions: {mean:.2f}")

    print("grey at the mask's edge (inside, 1 px out, 2 px out, far); where 1 px out lies from paper (0) to ink (1):")
    for name, found in {**training, "same-well test": same_well}.items():
        inside, one, two, far = edge_greys(found)
        print(f"  {name}: {inside:.1f} {one:.1f} {two:.1f} {far:.1f}; {(far - one) / (far - inside):.2f}")

    print(f"foreground IoU at p(curve) >= {', '.join(map(str, THRESHOLDS))} (same-well test set):")
    flat_truth = np.concatenate([t.ravel() for t in truth])
    for name, probs in predicted.items():
        flat = np.concatenate([q.ravel() for q in probs])
        ious = [(flat >= t)[flat_truth].sum() / ((flat >= t) | flat_truth).sum() for t in THRESHOLDS]
        print(f"  {name}: " + " ".join(f"{iou:.3f}" for iou in ious))


if __name__ == "__main__":
    main()
