"""Stage holds: a test's way to stop a job at a known point of a stage, without racing it.

Off unless ``worker.hold_dir`` is set (only the test suite sets it). A job whose stage ``S``
reports its first bytes while ``<hold_dir>/S`` exists claims that file by renaming it to
``S.held`` (one rename wins, so one job per armed hold: a retried attempt runs through) and
then waits, inside its progress call, until ``S.held`` is gone. The test arms the hold before
it submits the job, waits for ``S.held`` to appear (the job is now provably mid-stage, with
some of its bytes written), does what it came to do (cancel, kill, break storage) and deletes
``S.held`` to let the job go on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# How often a held job looks whether it was let go (only ever while a test holds it).
POLL_SECONDS = 0.01


def held_path(directory: Path, stage: str) -> Path:
    return directory / f"{stage}.held"


def hold(directory: Path | None, stage: str) -> None:
    """Wait here while a test holds ``stage``; returns at once when no hold is armed."""
    if directory is None:
        return
    held = held_path(directory, stage)
    try:
        os.rename(directory / stage, held)
    except FileNotFoundError:
        return
    while held.exists():
        time.sleep(POLL_SECONDS)
