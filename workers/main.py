"""Start a Celery worker process configured from settings."""

from __future__ import annotations

from app.settings import Settings
from workers.celery_app import make_celery


def run_worker(settings: Settings, *, queues: list[str], concurrency: int | None) -> int:
    app = make_celery(settings)
    app.worker_main(
        [
            "worker",
            "--queues",
            ",".join(queues),
            "--concurrency",
            str(concurrency or settings.worker.concurrency),
            "--loglevel",
            settings.log_level,
            "--without-gossip",
            "--without-mingle",
        ]
    )
    return 0
