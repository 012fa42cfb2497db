"""Thin wrapper over srforge.cli.main_check_data; runs from a checkout without installing."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from srforge.cli import main_check_data  # noqa: E402

raise SystemExit(main_check_data())
