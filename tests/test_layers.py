"""The layer rule, checked on the source: imports point down, `app/` never imports `workers/`,
and `tensor_registry/` imports nothing server-side.

Every `import`/`from … import` in app/ and workers/ is read with `ast` (also the ones inside
functions and `TYPE_CHECKING` blocks: a lazy import is still a dependency). The layers, lowest
first — a module may import its own layer or a lower one:

  0 core         settings, db, errors, logging, storage, key wrapping, queue, fetch …
  1 checkpoints  Hugging Face / safetensors validation, no torch
  2 tables       every domain's ORM tables (app/<domain>/tables.py): rows only, no behaviour
  3 access       who asks (app.auth: tokens → principals, one principal cache) and the record of
                 what they did (app.audit.service.record); both read their own tables
  4 jobs         the job service and lifecycle: every transition of a job and of the artifact
                 and version rows it drives (called by the API and by the workers); the pool
                 of workers that runs them (app.worker_pool: heartbeat rows, routing); the
                 orphan sweep
  5 domains      models, versions, aliases, artifacts, tokens, audit, key_delivery, system
  6 serving      resolve, blobs (read every domain to answer a load)
  7 entry        main, server_cli, openapi, middleware, migrate, tables (wire everything)

docs/architecture.md explains where each concern lives.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CORE, CHECKPOINTS, TABLES, ACCESS, JOBS, DOMAINS, SERVING, ENTRY = range(8)

DOMAIN_PACKAGES = (
    "models",
    "versions",
    "aliases",
    "artifacts",
    "tokens",
    "audit",
    "key_delivery",
    "worker_pool",
    "system",
    "jobs",
    "webhooks",
    "nodes",
)

# Most specific prefix wins.
LAYERS: dict[str, int] = {
    "app.core": CORE,
    "app.settings": CORE,
    "app.db": CORE,
    "app.errors": CORE,
    "app.logs": CORE,
    "app.context": CORE,
    "app.key_wrapping": CORE,
    "app.paths": CORE,
    "app.pagination": CORE,
    "app.bounded_json": CORE,
    "app.etags": CORE,
    "app.schemas": CORE,
    "app.metrics": CORE,
    "app.auth": ACCESS,
    "app.audit.service": ACCESS,
    "app.deps": CORE,
    "app.storage": CORE,
    "app.checkpoints": CHECKPOINTS,
    "app.models": DOMAINS,
    "app.versions": DOMAINS,
    "app.aliases": DOMAINS,
    "app.artifacts": DOMAINS,
    "app.tokens": DOMAINS,
    "app.audit": DOMAINS,
    "app.key_delivery": DOMAINS,
    "app.worker_pool": JOBS,
    "app.system": DOMAINS,
    # Signed artifact manifests: the signing keys, the statement, the public-keys route.
    "app.trust": DOMAINS,
    "app.jobs": JOBS,
    # The events stream and webhooks: read the outbox (app.core.events_outbox) and nothing else.
    "app.events": DOMAINS,
    "app.webhooks": DOMAINS,
    "app.nodes": DOMAINS,
    **{f"app.{domain}.tables": TABLES for domain in DOMAIN_PACKAGES},
    "app.resolve": SERVING,
    "app.blobs": SERVING,
    "app.main": ENTRY,
    "app.server_cli": ENTRY,
    "app.openapi": ENTRY,
    "app.middleware": ENTRY,
    "app.migrate": ENTRY,
    "app.tables": ENTRY,
    "app": CORE,  # the package itself: only __version__ (the library's)
}

# Upward edges allowed (each with the reason it is right); issue 11 started with 20.
KNOWN_UPWARD: set[tuple[str, str]] = set()
# app → workers: 2 at the start of issue 11.
KNOWN_APP_TO_WORKERS: set[tuple[str, str]] = set()
# The library imports nothing of the server: `tensor-registry` offers the server's commands
# through the `tensor_registry.commands` entry point the server's distribution declares.
KNOWN_CLIENT_TO_SERVER: set[tuple[str, str]] = set()
KNOWN_TASKS_MAIN = (False, False)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of the app/workers/tensor_registry modules `path` imports (relative
    imports resolved)."""
    module = module_name(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from app.x import y` may name a submodule y: count it as app.x.y when it is one.
            names = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                is_module = (ROOT / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    ROOT / Path(*sub.split(".")) / "__init__.py"
                ).exists()
                names.append(sub if is_module else target)
        else:
            continue
        found.update(n for n in names if n.split(".")[0] in ("app", "workers", "tensor_registry"))
    return found


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        layer = LAYERS.get(".".join(parts[:end]))
        if layer is not None:
            return layer
    return None


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for path in sources("app"):
        importer = module_name(path)
        for imported in imports_of(path):
            if imported.startswith(("workers", "tensor_registry")):
                continue  # their own rules below
            low, high = layer_of(importer), layer_of(imported)
            assert low is not None and high is not None, (importer, imported)
            if high > low:
                found.add((importer, imported))
    return found


def test_every_app_module_has_a_layer() -> None:
    unplaced = [module_name(p) for p in sources("app") if layer_of(module_name(p)) is None]
    assert unplaced == []


def test_no_import_points_up() -> None:
    found = upward_imports()
    assert sorted(found - KNOWN_UPWARD) == [], "new upward imports"
    assert sorted(KNOWN_UPWARD - found) == [], "gone: remove them from KNOWN_UPWARD"


def test_app_never_imports_workers() -> None:
    found = sorted(
        (module_name(p), imported)
        for p in sources("app")
        for imported in imports_of(p)
        if imported.split(".")[0] == "workers"
    )
    assert found == sorted(KNOWN_APP_TO_WORKERS)


def test_client_imports_nothing_server_side() -> None:
    found = sorted(
        (module_name(p), imported)
        for p in sources("tensor_registry")
        for imported in imports_of(p)
        if not imported.startswith("tensor_registry")
    )
    assert found == sorted(KNOWN_CLIENT_TO_SERVER)


def test_server_imports_of_the_client_are_only_its_shared_formats() -> None:
    # The server reads and writes the wire formats it shares with the library
    # (tensor_registry.formats: the layout manifest, the signed statements, the variant) and
    # takes the release number from it; never its HTTP client, CLI or engine.
    shared = ("tensor_registry.formats", "tensor_registry.version")
    found = sorted(
        (module_name(p), imported)
        for p in sources("app") + sources("workers")
        for imported in imports_of(p)
        if imported.startswith("tensor_registry") and not imported.startswith(shared)
    )
    assert found == []


def test_worker_tasks_and_main_do_not_import_each_other() -> None:
    tasks = imports_of(ROOT / "workers" / "tasks.py")
    main = imports_of(ROOT / "workers" / "main.py")
    assert ("workers.main" in tasks, "workers.tasks" in main) == KNOWN_TASKS_MAIN


STATE_ENUMS = {"JobStatus", "ArtifactStatus", "VersionStatus"}
# The one writer of job states and the artifact/version states a job drives.
STATE_WRITER = "app.jobs.lifecycle"
# A user finalizing their own draft (no job involved) freezes it where the versions domain
# checks the draft: that one write of VersionStatus.READY is the versions service's.
OTHER_STATE_WRITES = {("app.versions.service", "VersionStatus")}


def _state_writes(path: Path) -> set[str]:
    """Enums whose values ``path`` writes to a row: ``.values(status=E.X)``, ``Row(status=E.X)``
    or ``row.status = E.X``."""

    def enum_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return node.value.id if node.value.id in STATE_ENUMS else None
        return None

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            writes_row = (isinstance(func, ast.Attribute) and func.attr == "values") or (
                isinstance(func, ast.Name) and func.id in {"Job", "Artifact", "Version"}
            )
            if writes_row:
                for kw in node.keywords:
                    if kw.arg == "status" and (enum := enum_of(kw.value)):
                        found.add(enum)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                is_status = isinstance(target, ast.Attribute) and target.attr == "status"
                if is_status and (enum := enum_of(node.value)):
                    found.add(enum)
    return found


def test_job_states_have_one_writer() -> None:
    found = sorted(
        (module_name(p), enum)
        for p in sources("app") + sources("workers")
        if module_name(p) != STATE_WRITER
        for enum in _state_writes(p)
    )
    assert found == sorted(OTHER_STATE_WRITES)
