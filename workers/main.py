"""Start a Celery worker process configured from settings (``tensor-registry worker``, and
the one ``tensor-registry serve`` starts beside the API).

The main process heartbeats and sweeps (``workers.heartbeat``); pool processes (prefork,
``--concurrency``) run jobs, each with its own runtime (``workers.runtime``). Prefork rather
than threads because a job holds the GIL for long stretches and may need to be killed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery import signals

from app.jobs.queue import CelerySender
from app.settings import Settings
from workers import jobrun
from workers.celery_app import QUEUES, make_celery
from workers.runtime import close_runtime, use_settings

log = logging.getLogger("tensor_registry.worker")


# Set once the pool process has imported the heavy libraries; jobs wait for it, because
# importing transformers from two threads at once can break its lazy module.
WARM = threading.Event()
WARM.set()


def _warm_up() -> None:
    # Import the heavy libraries in the pool process before the first job needs them.
    try:
        import tensorizer  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except Exception:
        log.debug("warm-up import failed", exc_info=True)
    finally:
        WARM.set()


@signals.worker_process_init.connect
def _pool_process_started(**_: Any) -> None:
    WARM.clear()
    threading.Thread(target=_warm_up, name="tensor-registry-warmup", daemon=True).start()


@signals.worker_process_shutdown.connect
def _pool_process_stopping(**_: Any) -> None:
    close_runtime()


def run_worker(settings: Settings, *, queues: list[str], concurrency: int | None) -> int:
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown:
        raise SystemExit(f"unknown queue(s) {', '.join(unknown)}; choose from {', '.join(QUEUES)}")
    use_settings(settings)
    concurrency = concurrency or settings.worker.concurrency
    jobrun.NODE_ID = f"{socket.gethostname()}:{os.getpid()}"
    app = make_celery(settings)
    import workers.tasks  # noqa: F401 - registers the tasks on the app
    from workers.heartbeat import Heartbeat

    beat = Heartbeat(
        settings,
        worker_id=jobrun.NODE_ID,
        queues=list(queues),
        concurrency=concurrency,
        sender=CelerySender(app),
    )
    beat.start()
    try:
        app.worker_main(
            [
                "worker",
                "--queues",
                ",".join(queues),
                "--concurrency",
                str(concurrency),
                "--loglevel",
                settings.log_level,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--hostname",
                f"tensor-registry@{jobrun.NODE_ID}",
            ]
        )
    finally:
        beat.stop()
        close_runtime()
    return 0
