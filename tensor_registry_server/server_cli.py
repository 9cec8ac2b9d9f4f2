"""Server-side commands: serve (API + UI + embedded worker), api, worker, migrate, admin-token,
backfill-layouts, gc.

`tensor-registry --help` imports this module: keep module-level imports light (standard library
only); FastAPI, SQLAlchemy, uvicorn and the settings are imported inside the commands.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import logging
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import socket

    from fastapi import FastAPI

    from tensor_registry_server.settings import Settings


# What a node that has this distribution's metadata but not its dependencies lacks.
SERVER_PACKAGE = "uvicorn"


def _server_installed() -> bool:
    try:
        return importlib.util.find_spec(SERVER_PACKAGE) is not None
    except (ImportError, ValueError):
        return False


def register(sub: argparse._SubParsersAction) -> None:
    """The server's commands, for the `tensor-registry` command (the ``tensor_registry.commands``
    entry point); none where the server's packages are missing."""
    if not _server_installed():
        return
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

    admin_token = sub.add_parser(
        "admin-token",
        help="Mint a new admin token straight in the database (a lost bootstrap token); "
        "prints it once.",
    )
    admin_token.add_argument("--data-dir", type=Path)
    admin_token.add_argument("--name", default="admin-cli", help="Name shown in token lists.")
    admin_token.add_argument(
        "--expires-in",
        type=parse_duration,
        default=None,
        metavar="DURATION",
        help="Lifetime such as 3600, 90m, 12h or 30d (default: no expiry).",
    )
    admin_token.set_defaults(func=cmd_admin_token)

    backfill = sub.add_parser(
        "backfill-layouts",
        help="Write the layout manifest, the signed manifest and model.sig of every ready "
        "artifact that lacks them (published before manifests existed), so the load engine can "
        "read it and nodes can verify it, and sign again a model.sig whose signed ignore_paths "
        "are not the current ones; safe to run again.",
    )
    backfill.add_argument("--data-dir", type=Path)
    backfill.add_argument("--model", metavar="NS/NAME", help="only this model's artifacts")
    backfill.set_defaults(func=cmd_backfill_layouts)

    collect = sub.add_parser(
        "gc",
        help="Apply the retention policies: remove the versions (and their artifacts) no policy "
        "keeps, and orphaned storage objects; --dry-run lists what would go and why.",
    )
    collect.add_argument("--data-dir", type=Path)
    collect.add_argument(
        "--dry-run", action="store_true", help="Remove nothing; list what would go and why."
    )
    collect.add_argument("--json", action="store_true", help="One JSON document on stdout.")
    collect.set_defaults(func=cmd_gc)

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
    from tensor_registry_server.settings import Settings

    overrides: dict[str, object] = {}
    for name in ("host", "port", "data_dir"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if overrides.get("data_dir") is not None:
        # Child processes (the embedded worker) must see the same data dir.
        os.environ["TENSOR_REGISTRY_DATA_DIR"] = str(overrides["data_dir"])
    settings = Settings(**overrides)  # type: ignore[arg-type]
    make_private(settings)
    return settings


def make_private(settings: Settings) -> None:
    """Server processes create only owner-readable files: the database and its WAL, storage,
    broker messages, secrets (docs/threat-model.md rule 5). The umask is inherited by the
    embedded worker and its pool; the data dir of an older release (0755) is tightened once here."""
    os.umask(0o077)
    try:
        settings.check_layout()
    except ValueError as exc:
        raise SystemExit(f"tensor-registry: refusing to start: {exc}") from None
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # an operator-made directory we do not own
        os.chmod(settings.data_dir, 0o700)


def configure_logging(level: str) -> None:
    from tensor_registry_server.core.logs import configure_logging as configure_json_logging

    configure_json_logging(level)


def apply_migrations(settings: Settings) -> None:
    from tensor_registry_server.migrate import upgrade

    upgrade(settings.database_url)


async def _bootstrap(settings: Settings) -> str | None:
    from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
    from tensor_registry_server.tokens.service import ensure_bootstrap_admin

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


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds from ``3600``, ``90m``, ``12h`` or ``30d`` (argparse type)."""
    value = text.strip().lower()
    unit = _DURATION_UNITS.get(value[-1:])
    number = value[:-1] if unit else value
    if not number.isdigit() or int(number) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 3600, 90m, 12h, 30d")
    return int(number) * (unit or 1)


async def _mint_admin(settings: Settings, name: str, expires_in: int | None) -> str:
    from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
    from tensor_registry_server.tokens.service import mint_root_admin

    engine = create_engine(settings.database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            return await mint_root_admin(session, name=name, expires_in=expires_in)
    finally:
        await engine.dispose()


def cmd_admin_token(args: argparse.Namespace) -> int:
    """No HTTP: whoever can read the settings and reach the database owns the registry anyway.
    The secret goes to stdout alone (``TOKEN=$(tensor-registry admin-token)``); the rest to
    stderr. The database must be migrated (serve or migrate did that)."""
    settings = load_settings(args)
    configure_logging(settings.log_level)
    from sqlalchemy.exc import DBAPIError

    try:
        secret = asyncio.run(_mint_admin(settings, args.name, args.expires_in))
    except DBAPIError as exc:
        print(
            f"tensor-registry: cannot mint a token: {type(exc.orig).__name__}; is the database "
            "reachable and migrated (tensor-registry migrate)?",
            file=sys.stderr,
        )
        return 1
    print(f"New admin token {args.name!r} (shown once; only its hash is stored):", file=sys.stderr)
    print(secret, flush=True)
    return 0


def cmd_backfill_layouts(args: argparse.Namespace) -> int:
    """Worker code in its own process, like `worker` (the server never imports it): this
    process becomes ``python -m tensor_registry_server.artifacts.making.backfill``, which reads each
    artifact's weights once.
    Progress to stderr; exit 1 if any artifact failed."""
    model = args.model
    if model is not None and (model.count("/") != 1 or not all(model.split("/"))):
        print(f"tensor-registry: --model {model!r} is not NAMESPACE/NAME", file=sys.stderr)
        return 2
    load_settings(args)  # refuses bad settings here, and exports --data-dir
    argv = [sys.executable, "-m", "tensor_registry_server.artifacts.making.backfill"]
    if model is not None:
        argv += ["--model", model]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)  # noqa: S606 - our interpreter, fixed flags


async def _collect(settings: Settings, dry_run: bool) -> dict[str, object]:
    from datetime import timedelta

    from tensor_registry_server.core.db import create_engine, make_sessionmaker
    from tensor_registry_server.retention.gc import collect
    from tensor_registry_server.storage.registry import StorageRegistry

    engine = create_engine(settings.database_url)
    storages = StorageRegistry(settings)
    try:
        report = await collect(
            make_sessionmaker(engine),
            storages,
            settings.retention,
            dry_run=dry_run,
            orphan_grace=timedelta(seconds=settings.worker.orphan_grace_seconds),
        )
        return report.as_json()
    finally:
        await storages.close()
        await engine.dispose()


def cmd_gc(args: argparse.Namespace) -> int:
    """Garbage collection by retention policy (retention/gc.py), in this process: the same
    code the worker runs on its schedule. Each version goes in its own transaction, so an
    interrupted run leaves whole versions, and running it again is safe."""
    import json

    settings = load_settings(args)
    configure_logging(settings.log_level)
    report = asyncio.run(_collect(settings, args.dry_run))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(gc_text(report))
    return 0


def gc_text(report: dict[str, object]) -> str:
    """The human listing: what goes (or would) and why, what stays and what keeps it."""
    dry = bool(report["dry_run"])
    gone: list[dict[str, object]] = report["would_remove" if dry else "removed"]  # type: ignore[assignment]
    kept: list[dict[str, object]] = report["kept"]  # type: ignore[assignment]
    orphans: list[str] = report["orphans"]  # type: ignore[assignment]
    verb = "would remove" if dry else "removed"
    lines = []
    for d in gone:
        lines.append(f"{verb} {d['model']} v{d['version']} ({d['bytes']} bytes): {d['reasons'][0]}")  # type: ignore[index]
    for d in kept:
        lines.append(f"keep {d['model']} v{d['version']}: {'; '.join(d['reasons'])}")  # type: ignore[arg-type]
    for key in orphans:
        lines.append(f"{verb} orphaned object {key}")
    lines.append(
        f"{len(gone)} version(s) {verb} ({report['bytes']} bytes), {len(kept)} kept, "
        f"{len(orphans)} orphaned object(s)"
        + ("" if gone or kept else "; no retention policy covers any model")
    )
    return "\n".join(lines)


def cmd_worker(args: argparse.Namespace) -> int:
    """Become the worker process (``python -m tensor_registry_server.jobs.worker``): same pid and
    process group, so the
    supervisor of ``serve`` and process managers see one process; the server side never
    imports the worker's code. Settings reach it through the environment."""
    load_settings(args)  # refuses bad settings here, and exports --data-dir
    argv = [sys.executable, "-m", "tensor_registry_server.jobs.worker"]
    if args.queues:
        argv += ["--queues", args.queues]
    if args.concurrency is not None:
        argv += ["--concurrency", str(args.concurrency)]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)  # noqa: S606 - our interpreter, fixed flags


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
    _announce_token(settings, generated)
    _announce_public_url(settings)
    from tensor_registry_server.jobs.pool.embedded import EmbeddedWorker

    worker: EmbeddedWorker | None = None
    if settings.worker.embedded and not args.no_worker:
        worker = EmbeddedWorker(
            [sys.executable, "-m", "tensor_registry.cli", "worker", "--concurrency", "1"],
            env={**os.environ, "TENSOR_REGISTRY_DATA_DIR": str(settings.data_dir)},
            settings=settings,
            initial_backoff=settings.worker.restart_backoff_seconds,
        ).start()
    from tensor_registry_server.main import create_app

    # uvicorn re-raises the SIGTERM it handled once it has shut down; with the default handler
    # that kills this process before `finally` can stop the embedded worker. Exiting normally
    # instead lets the worker be stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = create_app(settings)
    # Everything imported so far lives as long as the process: keep it out of the cyclic
    # collector's scans, which otherwise dominate resolve's p99 under load
    # (bench/RESULTS.md).
    gc.freeze()
    try:
        _serve_http(app, settings)
    finally:
        if worker is not None:
            worker.stop()
    return 0


def _serve_http(app: FastAPI, settings: Settings) -> None:
    """uvicorn on the app until SIGTERM/SIGINT. As shutdown starts, the event streams end
    (``EventHub.drain``): their clients resume with Last-Event-ID, and a follower no longer
    holds the shutdown for the whole grace period and is then cut off with an error."""
    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    from tensor_registry_server.blobs.http_limits import HttpLimits
    from tensor_registry_server.blobs.zerocopy import ZeroCopyHttpProtocol

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            hub = getattr(app.state, "event_hub", None)
            if hub is not None:
                hub.drain()
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # Blob downloads go out with os.sendfile: asyncio's loop does it natively, uvloop
        # does not (bench/serving/download.py measures the difference).
        http=ZeroCopyHttpProtocol.with_limits(
            HttpLimits(
                max_header_bytes=settings.http.max_header_bytes,
                header_timeout_seconds=settings.http.header_timeout_seconds,
                body_idle_timeout_seconds=settings.http.body_idle_timeout_seconds,
                sendfile_threads=settings.http.sendfile_threads,
                send_idle_timeout_seconds=settings.http.send_idle_timeout_seconds,
            )
        ),
        loop="asyncio",
        log_config=None,
        access_log=False,
        # X-Forwarded-For is read by RequestContextMiddleware, and only from the proxies in
        # security.trusted_proxies (uvicorn's own default believes any loopback peer).
        proxy_headers=False,
        timeout_graceful_shutdown=10,
    )
    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def cli_command() -> str:
    """How a fresh shell runs this `tensor-registry`: its name when PATH finds this very program,
    else its absolute path (`./scripts/serve` installs into .venv, not on a new shell's PATH)."""
    import shutil

    here = Path(sys.executable).parent / "tensor-registry"
    found = shutil.which("tensor-registry")
    if not here.exists() or (found and Path(found).resolve() == here.resolve()):
        return "tensor-registry"
    return shlex.quote(str(here.absolute()))


def token_hint(settings: Settings, generated: str | None) -> str:
    """The shell line that gives a user a working TENSOR_REGISTRY_TOKEN after this start.

    The token just generated (shown this once), else the configured admin token's variable,
    else the command that mints an admin token with the same settings (`admin-token`)."""
    if generated:
        return f"export TENSOR_REGISTRY_TOKEN={shlex.quote(generated)}"
    if settings.bootstrap_admin_token():
        return 'export TENSOR_REGISTRY_TOKEN="$TENSOR_REGISTRY_ADMIN_TOKEN"'
    data_dir = shlex.quote(str(settings.data_dir.resolve()))
    return f"export TENSOR_REGISTRY_TOKEN=$({cli_command()} admin-token --data-dir {data_dir})"


def _announce_token(settings: Settings, generated: str | None) -> None:
    """The line to paste goes to stdout on its own, plain; a JSON log line on stderr says what
    it is. The token itself is never in a log line (log shippers keep those)."""
    from tensor_registry_server.core.logs import json_line

    hint = token_hint(settings, generated)
    fields: dict[str, str] = {"event": "admin_token_hint", "export": hint}
    if generated:
        # Printed once, on first start; only its hash is stored.
        message = (
            "Bootstrap admin token printed once, on its own line on stdout "
            "(export TENSOR_REGISTRY_TOKEN=trg_...): store it now"
        )
        fields = {"event": "bootstrap_admin_token"}
    elif settings.bootstrap_admin_token():
        message = f"The admin token is the one TENSOR_REGISTRY_ADMIN_TOKEN gave: {hint}"
    else:
        message = (
            "No token printed (this database has tokens): use the one printed at its first "
            f"start, or mint an admin token with the same settings: {hint}"
        )
    level = "warning" if generated else "info"
    line = json_line(
        level=level, logger="tensor_registry", created=time.time(), message=message, **fields
    )
    print(line, file=sys.stderr, flush=True)
    print(hint, flush=True)


def _announce_public_url(settings: Settings) -> None:
    if not settings.public_url_derived:
        return
    log = logging.getLogger("tensor_registry.serve")
    if settings.host.strip("[]") in ("", "0.0.0.0", "::"):
        log.warning(
            "public_url is not set: signed URLs will use %s (this machine's name, because "
            "serve listens on all addresses). Set TENSOR_REGISTRY_PUBLIC_URL to the URL "
            "serving nodes reach (a load balancer, TLS) if that is not it.",
            settings.public_url,
        )
    else:
        log.info("public_url is not set: signed URLs use %s", settings.public_url)
