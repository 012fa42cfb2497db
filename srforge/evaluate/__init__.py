"""Evaluation: predicted masks scored against true masks, per class, per scan, by width; a report to look at.

    metrics      counts on the device, batched (confusion matrix, tolerance counts within a disc) and the
                 figures computed from counts (IoU, Dice, precision, recall, tolerance F1, pixel accuracy)
    scoring      true and predicted masks read ahead, size-grouped padded batches, one row a scan (Scorer)
    aggregate    micro (pixels pooled) and macro (mean over scans), both by width third
    inputs       labelled folders and archives (LabelledArchive), mask folders, predictions folders
    pictures     true positives, false positives and false negatives of a scan in three colours
    report       metrics.json, scans.csv, report.html
    run          evaluate: predict (srforge.predict.pipeline) or take predictions, score, write

Each line names one module of this package.
"""

from srforge.evaluate.metrics import batch_counts, figures
from srforge.evaluate.run import evaluate
from srforge.evaluate.scoring import Scorer, score_scans

__all__ = ["Scorer", "batch_counts", "evaluate", "figures", "score_scans"]
