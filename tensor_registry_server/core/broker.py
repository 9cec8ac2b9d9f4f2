"""Celery configured from settings. Importable by the API (no torch here): it only sends.

Embedded default: kombu's file-system transport under data_dir/broker
(tensor_registry_server.core.fs_transport:
message files written atomically) — no server, works across the API process and the worker
process it starts. Scaled: Redis (or any Celery broker
URL) with queues ``gpu`` and ``cpu``. State lives on job/artifact rows, so no result backend
is configured. Tasks are acknowledged late and rejected back to the queue when the pool process
running them dies, so a killed job is delivered again.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from tensor_registry_server.core.fs_transport import TRANSPORT as FILESYSTEM_TRANSPORT
from tensor_registry_server.settings import Settings

QUEUES = ("gpu", "cpu")
# How often the embedded broker looks for new message files.
FILESYSTEM_POLL_SECONDS = 0.25


def make_celery(settings: Settings) -> Celery:
    app = Celery("tensor_registry")
    conf: dict[str, object] = {
        "broker_url": settings.broker_url,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_ignore_result": True,
        "task_default_queue": "cpu",
        "task_queues": [Queue(name) for name in QUEUES],
        "task_serializer": "json",
        "accept_content": ["json"],
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        # Results are not used (state is on the rows): a killed pool process is reported, and
        # its message put back, after 1 s instead of the default 10 s.
        "worker_lost_wait": 1.0,
        "enable_utc": True,
    }
    if settings.embedded_broker:
        folder = settings.broker_dir
        for sub in ("out", "processed", "control"):
            # Messages name jobs and their parameters: owner-only, like the rest of data_dir.
            (folder / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        # kombu's file-system transport, with message files written atomically.
        conf["broker_transport"] = FILESYSTEM_TRANSPORT
        conf["broker_transport_options"] = {
            # Exchange tables; kombu's default is ./control in the working directory.
            "control_folder": str(folder / "control"),
            "data_folder_in": str(folder / "out"),
            "data_folder_out": str(folder / "out"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
            "polling_interval": FILESYSTEM_POLL_SECONDS,
        }
    else:
        # Redelivery of unacked (acks_late) tasks after a whole worker host dies. Jobs that
        # outlive it are not run twice: the worker that receives the copy sees the job running
        # on a live worker and drops it (tensor_registry_server.jobs.runner); the heartbeat sweep
        # covers the rest.
        options: dict[str, object] = {"visibility_timeout": 3600}
        if settings.broker.key_prefix:
            options["global_keyprefix"] = settings.broker.key_prefix
        conf["broker_transport_options"] = options
    app.conf.update(conf)
    return app
