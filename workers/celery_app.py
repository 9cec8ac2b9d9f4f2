"""Celery configured from settings. Importable by the API (no torch here): it only sends.

Embedded default: kombu's file-system transport under data_dir/broker — no server, works
across the API process and the worker process it starts. Scaled: Redis (or any Celery broker
URL). State lives on job/artifact rows, so no result backend is configured.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

from app.settings import Settings

QUEUES = ("gpu", "cpu")


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
        "enable_utc": True,
    }
    if settings.embedded_broker:
        folder = settings.broker_dir
        for sub in ("out", "processed"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        conf["broker_transport_options"] = {
            "data_folder_in": str(folder / "out"),
            "data_folder_out": str(folder / "out"),
            "processed_folder": str(folder / "processed"),
            "store_processed": False,
        }
    else:
        # Redelivery of unacked (acks_late) tasks after a worker dies: longer than any job
        # heartbeat gap, shorter than an operator's patience.
        conf["broker_transport_options"] = {"visibility_timeout": 3600}
    app.conf.update(conf)
    return app
