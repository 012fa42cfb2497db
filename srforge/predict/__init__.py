"""Prediction: :class:`Predictor` (scans in, masks at their own size out) and :func:`predict_archive` (a whole
folder or archive of scans, in stages, with a report).

    predictor    Predictor, Prediction: batched inference under a pixel budget, out-of-memory split and tiling
    tiling       tiles of a scan larger than the budget, stitched back
    pipeline     predict_archive: list, skip finished, share out, read, infer, write, report
    background   the read stage's decoding processes and the write stage's threads
    sharding     which process predicts which scans under torchrun (split_by_pixels)
    folders      the input and output folders, checked before anything is read or written (OutputError); the
                 output folder held by one run at a time (hold_output)
    outputs      one scan's files: paths, srforge's mark on each (whose file, which model), completeness,
                 overlay, atomic writes
    report       one row a scan, the summary, report.json / report.csv, per-process partial reports
"""

from srforge.predict.folders import OutputError
from srforge.predict.outputs import output_paths
from srforge.predict.pipeline import predict_archive
from srforge.predict.predictor import Prediction, Predictor
from srforge.predict.report import STATUSES

__all__ = ["STATUSES", "OutputError", "Prediction", "Predictor", "output_paths", "predict_archive"]
