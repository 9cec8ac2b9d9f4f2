"""The layer rule, checked on the source: imports point down, `app/` never imports `workers/`,
and `app/client/` imports nothing server-side.

Every `import`/`from … import` in app/ and workers/ is read with `ast` (also the ones inside
functions and `TYPE_CHECKING` blocks: a lazy import is still a dependency). The layers, lowest
first — a module may import its own layer or a lower one:

  0 core         settings, db, errors, logging, auth, storage, crypto, pagination … (infrastructure)
  1 checkpoints  Hugging Face / safetensors validation, no torch
  2 domains      models, versions, aliases, artifacts, tokens, audit, keys, fleet, system
  3 jobs         the job tables, service and lifecycle (drives artifact and version rows)
  4 serving      resolve, blobs (read every domain to answer a load)
  5 entry        main, server_cli, openapi, middleware, migrate, tables (wire everything)

docs/architecture.md explains where each concern lives.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CORE, CHECKPOINTS, DOMAINS, JOBS, SERVING, ENTRY = range(6)

# Most specific prefix wins.
LAYERS: dict[str, int] = {
    "app.core": CORE,
    "app.settings": CORE,
    "app.db": CORE,
    "app.errors": CORE,
    "app.logs": CORE,
    "app.context": CORE,
    "app.crypto": CORE,
    "app.paths": CORE,
    "app.pagination": CORE,
    "app.http": CORE,
    "app.schemas": CORE,
    "app.metrics": CORE,
    "app.auth": CORE,
    "app.deps": CORE,
    "app.storage": CORE,
    "app.checkpoints": CHECKPOINTS,
    "app.models": DOMAINS,
    "app.versions": DOMAINS,
    "app.aliases": DOMAINS,
    "app.artifacts": DOMAINS,
    "app.tokens": DOMAINS,
    "app.audit": DOMAINS,
    "app.keys": DOMAINS,
    "app.fleet": DOMAINS,
    "app.system": DOMAINS,
    "app.jobs": JOBS,
    "app.resolve": SERVING,
    "app.blobs": SERVING,
    "app.main": ENTRY,
    "app.server_cli": ENTRY,
    "app.openapi": ENTRY,
    "app.middleware": ENTRY,
    "app.migrate": ENTRY,
    "app.tables": ENTRY,
    "app": CORE,  # the package itself: only __version__
}

# Edges that break the rule today and are being removed; the list only shrinks.
KNOWN_UPWARD: set[tuple[str, str]] = {
    ("app.artifacts.router", "app.jobs.models"),
    ("app.artifacts.router", "app.jobs.router"),
    ("app.artifacts.router", "app.jobs.schemas"),
    ("app.artifacts.service", "app.jobs.models"),
    ("app.artifacts.service", "app.jobs.service"),
    ("app.auth", "app.tokens.models"),
    ("app.storage.sweep", "app.artifacts.models"),
    ("app.storage.sweep", "app.versions.models"),
    ("app.system.metrics", "app.jobs.models"),
    ("app.system.metrics", "app.jobs.service"),
    ("app.versions.importer", "app.jobs.models"),
    ("app.versions.service", "app.jobs.models"),
}
# The same for app → workers and client → server (measured at the start of issue 11).
KNOWN_APP_TO_WORKERS: set[tuple[str, str]] = set()
KNOWN_CLIENT_TO_SERVER: set[tuple[str, str]] = {
    ("app.client.cli", "app.server_cli"),
}
KNOWN_TASKS_MAIN = (False, False)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of the app/workers modules `path` imports (relative imports resolved)."""
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
        found.update(n for n in names if n.split(".")[0] in ("app", "workers"))
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
        if importer.startswith("app.client"):
            continue
        for imported in imports_of(path):
            if imported.startswith(("workers", "app.client")):
                continue  # their own rules below
            low, high = layer_of(importer), layer_of(imported)
            assert low is not None and high is not None, (importer, imported)
            if high > low:
                found.add((importer, imported))
    return found


def test_every_app_module_has_a_layer() -> None:
    unplaced = [
        module_name(p)
        for p in sources("app")
        if not module_name(p).startswith("app.client") and layer_of(module_name(p)) is None
    ]
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
        for p in sources("app/client")
        for imported in imports_of(p)
        # `app` itself is only __version__, shared by both installs.
        if not imported.startswith("app.client") and imported != "app"
    )
    assert found == sorted(KNOWN_CLIENT_TO_SERVER)


def test_server_imports_of_the_client_are_only_its_shared_formats() -> None:
    # The server may read the client's wire formats (the layout manifest it also writes),
    # never its HTTP client or CLI.
    shared = {"app.client.layout"}
    found = sorted(
        (module_name(p), imported)
        for p in sources("app") + sources("workers")
        if not module_name(p).startswith("app.client")
        for imported in imports_of(p)
        if imported.startswith("app.client") and imported not in shared
    )
    assert found == []


def test_worker_tasks_and_main_do_not_import_each_other() -> None:
    tasks = imports_of(ROOT / "workers" / "tasks.py")
    main = imports_of(ROOT / "workers" / "main.py")
    assert ("workers.main" in tasks, "workers.tasks" in main) == KNOWN_TASKS_MAIN
