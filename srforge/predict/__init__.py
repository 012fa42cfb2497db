"""Prediction: :class:`Predictor` (scans in, masks at their own size out) and :func:`predict_archive` (a whole
folder or archive of scans, in stages, with a report)."""

from srforge.predict.pipeline import predict_archive
from srforge.predict.predictor import Predictor

__all__ = ["Predictor", "predict_archive"]
