"""The test side of tensor_registry_server/jobs/holds.py: arm a hold, wait for a job to be held,
let it go."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.waiting import poll_async
from tensor_registry_server.jobs.holds import held_path


class StageHold:
    """Stops the next job that writes bytes in a stage, until the test lets it go
    (tensor_registry_server/jobs/holds.py): the job is then provably mid-stage, however fast or
    loaded the machine."""

    def __init__(self, directory: Path, detail: Callable[[], str] | None = None) -> None:
        directory.mkdir(exist_ok=True)
        self.directory = directory
        self.detail = detail

    def arm(self, stage: str = "serialize") -> None:
        (self.directory / stage).touch()

    async def wait_held(self, stage: str = "serialize", timeout: float = 60) -> None:
        held = held_path(self.directory, stage)

        async def claimed() -> bool:
            return held.exists()

        await poll_async(
            claimed, what=f"a job to be held in {stage}", timeout=timeout, detail=self.detail
        )

    def release(self, stage: str = "serialize") -> None:
        held_path(self.directory, stage).unlink(missing_ok=True)

    def clear(self) -> None:
        for path in self.directory.iterdir():
            path.unlink()
