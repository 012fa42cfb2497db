"""Predict masks for a folder / .zip / .tar of scans.

python scripts/predict.py --checkpoint CKPT --input PATH --output DIR
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from srforge.cli import main_predict  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main_predict())
