"""Train a segmentation model: python scripts/train.py --config configs/X.yaml [key.path=value ...]"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from srforge.cli import main_train  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main_train())
