"""The input and output of a prediction run, checked before anything is read or written, and the output folder
held by one run at a time.

Input and output never overlap: an output inside the input would be read back as scans, an input inside the
output would be written over (``--input data/images --output data``: predictions among the training masks). The
output folder must hold no symbolic links (outputs would be written through them) and be writable; the input
must be a folder or a regular file. :func:`hold_output` keeps a second run out of the folder while one runs.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from srforge.atomic import TEMP_SUFFIX, as_disk_full, atomic_write_text
from srforge.locks import FolderLock


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
    scans), holds the input (outputs would be written over it), is not a folder, or holds a symbolic link (outputs
    would be written through it). Creates nothing."""
    out, source = out_dir.resolve(), input_path.resolve()
    if out == source or source in out.parents:
        raise OutputError(
            f"--output {out_dir} is {'the input' if out == source else 'inside the input folder'} {input_path}; "
            "its masks would be read back as scans. Choose a folder outside the input."
        )
    if out in source.parents:
        raise OutputError(
            f"--input {input_path} is inside --output {out_dir}; masks, overlays and reports written there could "
            "land on the input (its scans, or masks beside them such as training ground truth). Choose an output "
            "folder that neither holds nor lies inside the input."
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


@contextmanager
def hold_output(out_dir: Path) -> Iterator[None]:
    """Hold ``out_dir`` for this process while inside (FolderLock "output folder"): a second run into it is refused
    with FolderLockedError naming this one. The lock file is removed on leaving, while still held, so that the
    folder keeps only outputs; a run that opened it just before and locks it just after finds it gone, and takes
    the lock afresh on a new file."""
    for attempt in range(5):
        lock = FolderLock(out_dir, "output folder").acquire()
        if _names_this_process(lock.path) or attempt == 4:
            break
        lock.release()  # locked a file another run had already removed: try again on the file there now
    try:
        yield
    finally:
        lock.path.unlink(missing_ok=True)
        lock.release()


def _names_this_process(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("pid") == os.getpid()
    except (OSError, ValueError, AttributeError):
        return False


# The first bytes of srforge's own reports (json.dumps(indent=1) of {"summary", "scans"}; csv.DictWriter's header).
REPORT_STARTS = {"report.json": b'{\n "summary": {', "report.csv": b"name,status,"}


def check_reports(out_dir: Path, starts: dict[str, bytes] = REPORT_STARTS) -> None:
    """OutputError when ``out_dir`` holds a file named in ``starts`` (default: report.json, report.csv) that does
    not begin as srforge writes it (someone else's file of that name): the run would write over it."""
    for name, start in starts.items():
        try:
            with open(out_dir / name, "rb") as f:
                found = f.read(len(start))
        except FileNotFoundError:
            continue
        except OSError as error:  # a folder of that name, unreadable: not a report srforge may replace
            found = f"({error.strerror or error})".encode()
        if found != start:
            raise OutputError(
                f"{out_dir / name} is not a report srforge wrote (expected it to start with {start.decode()!r}, "
                f"found {found[:40].decode(errors='replace')!r}); the run would write over it. Move it out of the "
                "output folder, or choose another --output"
            )
