"""Score a checkpoint on a labelled folder / .zip / .tar (or a folder of predicted masks) and write report.html.

python scripts/evaluate.py --checkpoint CKPT --input DATA [--output DIR] [--compare CKPT_B] [--tta flip]
python scripts/evaluate.py --predictions DIR --masks DIR [--predictions DIR_B]
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from srforge.cli import main_evaluate  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main_evaluate())
