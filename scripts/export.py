"""Export a checkpoint to ONNX: python scripts/export.py --checkpoint runs/x/best.pt --output model.onnx"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from srforge.cli import main_export  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main_export())
