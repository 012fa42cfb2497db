"""Command-line entry points, one module per command; scripts/*.py and the console scripts call these.

Each ``main_*`` takes ``argv`` (None: ``sys.argv[1:]``) and returns the exit status (srforge.cli.errors).
"""

from srforge.cli.check_data import main_check_data
from srforge.cli.evaluate import main_evaluate
from srforge.cli.export import main_export
from srforge.cli.make_synthetic import main_make_synthetic
from srforge.cli.predict import main_predict
from srforge.cli.train import main_train

__all__ = ["main_check_data", "main_evaluate", "main_export", "main_make_synthetic", "main_predict", "main_train"]
