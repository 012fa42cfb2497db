"""The one exception for an optional package that is not installed (the extras of pyproject.toml).

Commands treat it as the user's to fix (exit status 2, the message naming what to install); any other ImportError
is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["MissingExtraError"]


class MissingExtraError(ImportError):
    """An optional package a model, a weights file or the ONNX export needs is not installed; the message says
    which extra installs it and carries the import's own error."""
