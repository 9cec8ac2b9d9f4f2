"""Server-side commands: serve (API + UI + embedded worker), api, worker, migrate."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import uvicorn

from app.db import create_engine, make_sessionmaker, session_scope
from app.settings import Settings


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser(
        "serve", help="Run the API, the web UI and one worker (embedded default: no servers)."
    )
    _server_args(serve)
    serve.add_argument(
        "--no-worker", action="store_true", help="Do not start a worker process beside the API."
    )
    serve.add_argument(
        "--no-migrate", action="store_true", help="Do not apply migrations on start-up."
    )
    serve.set_defaults(func=cmd_serve)

    migrate = sub.add_parser("migrate", help="Apply database migrations (scaled setup).")
    migrate.add_argument("--data-dir", type=Path)
    migrate.set_defaults(func=cmd_migrate)

    worker = sub.add_parser("worker", help="Run a Celery worker (scaled setup).")
    worker.add_argument("--data-dir", type=Path)
    worker.add_argument("--queues", default=None, help="Comma-separated, e.g. gpu,cpu")
    worker.add_argument("--concurrency", type=int, default=None)
    worker.set_defaults(func=cmd_worker)


def _server_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--data-dir", type=Path, default=None)


def load_settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, object] = {}
    for name in ("host", "port", "data_dir"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if overrides.get("data_dir") is not None:
        # Child processes (the embedded worker) must see the same data dir.
        os.environ["TENSOR_REGISTRY_DATA_DIR"] = str(overrides["data_dir"])
    settings = Settings(**overrides)  # type: ignore[arg-type]
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return settings


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(message)s", stream=sys.stderr)


def apply_migrations(settings: Settings) -> None:
    from app.migrate import upgrade

    upgrade(settings.database_url)


async def _bootstrap(settings: Settings) -> str | None:
    from app.tokens.service import ensure_bootstrap_admin

    engine = create_engine(settings.database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            return await ensure_bootstrap_admin(session, settings.bootstrap_admin_token())
    finally:
        await engine.dispose()


def cmd_migrate(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    configure_logging(settings.log_level)
    apply_migrations(settings)
    print("database is at the latest migration")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    configure_logging(settings.log_level)
    from workers.main import run_worker

    queues = args.queues.split(",") if args.queues else settings.worker.queues
    return run_worker(settings, queues=queues, concurrency=args.concurrency)


def cmd_serve(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    configure_logging(settings.log_level)
    if not args.no_migrate:
        apply_migrations(settings)
    # Create the embedded default's secrets now, before the worker process starts, so both
    # processes read the same file (no-op when they come from settings).
    settings.signing_key_bytes()
    settings.master_key_bytes()
    generated = asyncio.run(_bootstrap(settings))
    if generated:
        # Printed once, on first start; only its hash is stored.
        print(
            "\n  Bootstrap admin token (shown once, store it now):\n\n"
            f"    {generated}\n\n"
            "  export TENSOR_REGISTRY_TOKEN=<that token>\n",
            flush=True,
        )
    worker_proc = None
    if settings.worker.embedded and not args.no_worker:
        worker_proc = subprocess.Popen(
            [sys.executable, "-m", "app.client.cli", "worker", "--concurrency", "1"],
            env={**os.environ, "TENSOR_REGISTRY_DATA_DIR": str(settings.data_dir)},
        )
    from app.blobs.zerocopy import HttpLimits, ZeroCopyHttpProtocol
    from app.main import create_app

    # uvicorn re-raises the SIGTERM it handled once it has shut down; with the default handler
    # that kills this process before `finally` can stop the embedded worker. Exiting normally
    # instead lets the worker be stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = create_app(settings)
    # Everything imported so far lives as long as the process: keep it out of the cyclic
    # collector's scans, which otherwise dominate resolve's p99 under load
    # (bench/results/serving.md).
    gc.freeze()
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            # Blob downloads go out with os.sendfile: asyncio's loop does it natively, uvloop
            # does not (bench/download.py measures the difference).
            http=ZeroCopyHttpProtocol.with_limits(
                HttpLimits(
                    max_header_bytes=settings.http.max_header_bytes,
                    header_timeout_seconds=settings.http.header_timeout_seconds,
                    body_idle_timeout_seconds=settings.http.body_idle_timeout_seconds,
                )
            ),
            loop="asyncio",
            log_config=None,
            access_log=False,
            proxy_headers=True,
            timeout_graceful_shutdown=10,
        )
    finally:
        if worker_proc is not None:
            worker_proc.send_signal(signal.SIGTERM)
            try:
                worker_proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                worker_proc.kill()
    return 0
