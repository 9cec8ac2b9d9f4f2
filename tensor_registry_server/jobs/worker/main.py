"""Start a Celery worker process configured from settings (``python -m
tensor_registry_server.jobs.worker``, which
``tensor-registry worker`` and the worker ``tensor-registry serve`` starts beside the API exec).

The main process heartbeats and sweeps (``tensor_registry_server.jobs.worker.heartbeat``); pool
processes (prefork,
``--concurrency``) run jobs, each with its own runtime (``tensor_registry_server.jobs.runtime``).
Prefork rather
than threads because a job holds the GIL for long stretches and may need to be killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
import warnings
from typing import Any

from celery import signals
from celery.apps import worker as celery_worker_program

from tensor_registry_server.core.broker import QUEUES, make_celery
from tensor_registry_server.core.logs import json_line
from tensor_registry_server.core.queue import CelerySender
from tensor_registry_server.jobs import runner
from tensor_registry_server.jobs.runtime import WARM, close_runtime, use_settings
from tensor_registry_server.settings import Settings

log = logging.getLogger("tensor_registry.worker")


def _route_library_output_to_logging() -> None:
    """transformers logs through a handler of its own (plain text, not propagated) and draws
    tqdm bars on stderr: both would break the one JSON line format
    (tensor_registry_server.core.logs)."""
    import huggingface_hub.utils
    import transformers.utils.logging as hf_logging

    hf_logging.disable_default_handler()
    hf_logging.enable_propagation()
    hf_logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()


def _warm_up() -> None:
    # Import the heavy libraries in the pool process before the first job needs them.
    try:
        import tensorizer  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401

        _route_library_output_to_logging()
    except Exception:
        log.debug("warm-up import failed", exc_info=True)
    finally:
        WARM.set()


@signals.setup_logging.connect
def _keep_json_logging(**_: Any) -> None:
    """Celery configures no logging of its own when this signal has a receiver: the JSON setup
    of ``tensor-registry worker`` (tensor_registry_server.core.logs) stays, in the main and the
    pool processes."""


def _say_as_json(msg: str, f: Any = None) -> None:
    """Celery's shutdown notices ("worker: Warm shutdown") bypass logging and write plain text
    straight to a file descriptor from a signal handler; written here as one JSON line, with a
    single os.write like Celery's own."""
    stream: Any = f if f is not None else sys.__stderr__
    line = json_line(
        level="info", logger="celery.worker", created=time.time(), message=str(msg).strip()
    )
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.write(stream.fileno(), (line + "\n").encode())


celery_worker_program.safe_say = _say_as_json


@signals.worker_process_init.connect
def _pool_process_started(**_: Any) -> None:
    WARM.clear()
    threading.Thread(target=_warm_up, name="tensor-registry-warmup", daemon=True).start()


@signals.worker_process_shutdown.connect
def _pool_process_stopping(**_: Any) -> None:
    close_runtime()


def _accept_root_with_json_only(app: Any) -> None:
    """Celery warns at every start when the worker runs as root, because a root worker that
    accepts pickle runs whatever a broker message says. This worker accepts JSON only (a pickle
    setting would make Celery refuse to start as root, not warn), so that one warning says
    nothing here: it is ignored for exactly that category and message, and only while the
    accepted content has no pickle."""
    accepted = {str(c) for c in app.conf.accept_content or ()}
    if accepted & {"pickle", "application/x-python-serialize"}:
        return
    from celery.exceptions import SecurityWarning

    warnings.filterwarnings(
        "ignore", message="You're running the worker with superuser", category=SecurityWarning
    )


def run_worker(settings: Settings, *, queues: list[str], concurrency: int | None) -> int:
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown:
        raise SystemExit(f"unknown queue(s) {', '.join(unknown)}; choose from {', '.join(QUEUES)}")
    use_settings(settings)
    if settings.worker.hold_dir is not None:
        log.warning(
            "worker.hold_dir is set (%s): jobs pause where a file there says so; tests only",
            settings.worker.hold_dir,
        )
    concurrency = concurrency or settings.worker.concurrency
    runner.NODE_ID = f"{socket.gethostname()}:{os.getpid()}"
    app = make_celery(settings)
    # Celery imports the task module when the worker boots, before the pool forks; this module
    # never imports it (the tasks wait on runtime.WARM, which the signals below drive).
    app.conf.include = ["tensor_registry_server.jobs.worker.tasks"]
    from tensor_registry_server.jobs.worker.heartbeat import Heartbeat

    beat = Heartbeat(
        settings,
        worker_id=runner.NODE_ID,
        queues=list(queues),
        concurrency=concurrency,
        sender=CelerySender(app),
    )
    beat.start()
    _accept_root_with_json_only(app)
    try:
        app.worker_main(
            [
                # No banner: it is plain text on stdout; the heartbeat logs the same facts.
                "--quiet",
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
                f"tensor-registry@{runner.NODE_ID}",
            ]
        )
    finally:
        beat.stop()
        close_runtime()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m tensor_registry_server.jobs.worker [--queues gpu,cpu] [--concurrency N]``:
    settings
    from the
    environment (``tensor-registry worker`` sets TENSOR_REGISTRY_DATA_DIR for --data-dir)."""
    import argparse

    from tensor_registry_server.core.logs import configure_logging

    parser = argparse.ArgumentParser(
        prog="python -m tensor_registry_server.jobs.worker", description=__doc__
    )
    parser.add_argument("--queues", default=None, help="Comma-separated, e.g. gpu,cpu")
    parser.add_argument("--concurrency", type=int, default=None)
    args = parser.parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_level)
    queues = args.queues.split(",") if args.queues else settings.worker.queues
    return run_worker(settings, queues=queues, concurrency=args.concurrency)
