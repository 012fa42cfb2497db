"""The input and output of a prediction run, checked before anything is read or written.

The output folder must lie outside the input (outputs would be read back as scans), hold no symbolic links
(outputs would be written through them) and be writable; the input must be a folder or a regular file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from srforge.atomic import TEMP_SUFFIX, as_disk_full, atomic_write_text


class OutputError(Exception):
    """The output folder cannot be used (links inside it, read-only, inside the input); exit status 2."""


def check_input(path: Path) -> None:
    """FileNotFoundError unless ``path`` exists; ValueError unless it is a regular file or a folder.

    Checked with ``stat`` before anything opens it: a FIFO would block the opener and a device such as /dev/zero
    would be read without end.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"input not found: {path} (expected a folder, a .zip or a .tar archive)") from None
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise ValueError(
            f"{path} is not a regular file or a folder (a device, FIFO or socket); give a folder, .zip or .tar of scans"
        )


def check_output(out_dir: Path, input_path: Path) -> None:
    """OutputError when ``out_dir`` is the input or inside an input folder (outputs would be read back as
    scans), is not a folder, or holds a symbolic link (outputs would be written through it). Creates nothing."""
    out, source = out_dir.resolve(), input_path.resolve()
    if out == source or source in out.parents:
        raise OutputError(
            f"--output {out_dir} is {'the input' if out == source else 'inside the input folder'} {input_path}; "
            "its masks would be read back as scans. Choose a folder outside the input."
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"--output {out_dir} exists and is not a folder")
    for top, dirs, files in os.walk(out_dir):  # followlinks=False: a linked folder is reported, not entered
        for name in dirs + files:
            if os.path.islink(os.path.join(top, name)):
                raise OutputError(
                    f"{os.path.join(top, name)} is a symbolic link inside the output folder; outputs would be "
                    "written through it. Remove the link or choose another --output."
                )


def prepare_output(out_dir: Path) -> None:
    """Create ``out_dir`` and prove it writable: OutputError (read-only, no permission) or DiskFullError."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # One name per process: several torchrun ranks prove the same folder at once.
        atomic_write_text(out_dir / f".write-check.{os.getpid()}{TEMP_SUFFIX}", "").unlink(missing_ok=True)
    except OSError as error:
        if as_disk_full(error, out_dir) is not error:
            raise as_disk_full(error, out_dir) from None
        raise OutputError(
            f"cannot write into --output {out_dir} ({error.strerror or error}); choose a writable folder"
        ) from None
