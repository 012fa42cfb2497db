"""Thin wrapper over srforge.cli.make_masks.main_make_masks; runs from a checkout without installing."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.cli.make_masks import main_make_masks  # noqa: E402

raise SystemExit(main_make_masks())
