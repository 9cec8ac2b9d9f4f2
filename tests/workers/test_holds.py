"""Stage holds (tensor_registry_server/jobs/holds.py): armed once, claimed by one job, let go by
the test."""

from __future__ import annotations

import threading
from pathlib import Path

from harness.waiting import poll
from tensor_registry_server.jobs.holds import held_path, hold


def _holding(directory: Path, stage: str) -> threading.Thread:
    thread = threading.Thread(target=hold, args=(directory, stage), daemon=True)
    thread.start()
    return thread


def test_an_armed_hold_stops_one_caller_until_released(tmp_path: Path) -> None:
    (tmp_path / "serialize").touch()
    first = _holding(tmp_path, "serialize")
    held = held_path(tmp_path, "serialize")
    poll(held.exists, what="the hold to be claimed", interval=0.01)
    assert not (tmp_path / "serialize").exists()
    first.join(timeout=0.1)
    assert first.is_alive()  # and it stays held while the file is there
    # Armed once, claimed once: a second caller (a retried attempt) runs straight through.
    second = _holding(tmp_path, "serialize")
    second.join(timeout=30)
    assert not second.is_alive()
    held.unlink()
    first.join(timeout=30)
    assert not first.is_alive()


def test_other_stages_and_an_unset_folder_never_wait(tmp_path: Path) -> None:
    (tmp_path / "serialize").touch()
    hold(tmp_path, "download")
    hold(None, "serialize")
    assert (tmp_path / "serialize").exists() and not held_path(tmp_path, "download").exists()
