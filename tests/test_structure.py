"""The code's shape, checked so that it stays as docs/architecture.md describes it.

- No function in tensor_registry_server/, tensor_registry_server/jobs/worker/ or tensor_registry/
runs
over MAX_FUNCTION_LINES lines unless
  LONG_FUNCTIONS names it with the reason it is one piece; an entry whose function got shorter
  (or went) must leave the list too.
- docs/architecture.md's table of files over LARGE_FILE_LINES lines names exactly those files,
  each with its line count within a tenth of the real one, and its list of long functions is
  LONG_FUNCTIONS: the doc cannot go stale without this test failing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tensor_registry_server", "tensor_registry")
# Alembic's revisions are a history, not product code.
NOT_PRODUCT = ROOT / "tensor_registry_server" / "migrations"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

MAX_FUNCTION_LINES = 80
LARGE_FILE_LINES = 400
MAX_FILE_LINES = 600
# Product files: the Python of both packages and the web UI's own files (no build step).
PRODUCT_SUFFIXES = {".py", ".js", ".css", ".html"}

# Qualified name (module.Class.function) → why it stays one function.
LONG_FUNCTIONS: dict[str, str] = {
    "tensor_registry_server.middleware.RequestContextMiddleware.__call__": (
        "one ASGI call: the request id, access log, metrics and the disconnect watch wrap the "
        "same send/receive pair and must see every message in order"
    ),
    "tensor_registry_server.resolve.choice._explain_miss": (
        "the 404 that says why nothing matched: each filter's miss is one branch of one answer"
    ),
    "tensor_registry_server.artifacts.tensorize.request_tensorize": (
        "the tensorize request's checks in the order the API documents them, then one insert"
    ),
    "tensor_registry_server.resolve.render.render": (
        "the resolve answer, field by field, on the hot path (no intermediate objects)"
    ),
    "tensor_registry_server.aliases.service.set_alias": (
        "one alias move: If-Match, the version check, the default variant, the history row, "
        "the revision the signed binding names and the alias.moved event, in one transaction"
    ),
    "tensor_registry_server.main.create_app": (
        "the app factory: every router, middleware, error handler and lifespan task wired in "
        "one place a reader can scan"
    ),
    "tensor_registry_server.webhooks.delivery.Deliverer._record": (
        "one delivery's outcome: its log row, the next try's backoff, the disable rule and its "
        "event, written together"
    ),
    "tensor_registry.cli.trust_commands.register": (
        "argparse declarations of the trust command group, one sub-command after another"
    ),
    "tensor_registry.trust.binding.check_binding": (
        "the signed binding's checks in the order a reader verifies them: signature, identity, "
        "freshness with the skew allowance, each field against the request, rollback state"
    ),
}


def _functions() -> dict[str, int]:
    """Every function and method: qualified name → lines (nested ones named under their
    enclosing function)."""
    found: dict[str, int] = {}

    def walk(node: ast.AST, prefix: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = [*prefix, child.name]
                found[".".join(name)] = (child.end_lineno or child.lineno) - child.lineno + 1
                walk(child, name)
            elif isinstance(child, ast.ClassDef):
                walk(child, [*prefix, child.name])
            else:
                walk(child, prefix)

    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(NOT_PRODUCT):
                continue
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            walk(
                ast.parse(path.read_text(), filename=str(path)), [module.removesuffix(".__init__")]
            )
    return found


def _product_file_lines() -> dict[str, int]:
    return {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*"))
        if path.suffix in PRODUCT_SUFFIXES and not path.is_relative_to(NOT_PRODUCT)
    }


def _large_files() -> dict[str, int]:
    return {path: n for path, n in _product_file_lines().items() if n > LARGE_FILE_LINES}


def test_no_product_file_runs_over_the_limit() -> None:
    """One concern per file: past MAX_FILE_LINES a file holds two, whatever its language."""
    files = _product_file_lines()
    assert any(path.endswith(".js") for path in files)  # the UI is counted, not only Python
    over = {path: n for path, n in files.items() if n > MAX_FILE_LINES}
    assert over == {}, f"over {MAX_FILE_LINES} lines: split them (docs/architecture.md)"


def _doc_section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_no_function_runs_over_the_limit_unless_listed_with_its_reason() -> None:
    long = {name for name, lines in _functions().items() if lines > MAX_FUNCTION_LINES}
    assert sorted(long - LONG_FUNCTIONS.keys()) == [], (
        f"over {MAX_FUNCTION_LINES} lines: split it, or list it in LONG_FUNCTIONS with why"
    )
    assert sorted(LONG_FUNCTIONS.keys() - long) == [], "no longer long: drop it from the list"
    assert all(len(reason) > 20 for reason in LONG_FUNCTIONS.values())


def test_the_architecture_doc_names_the_large_files_with_their_sizes() -> None:
    rows = re.findall(r"^\| `([^`]+)` \| (\d+) \|", _doc_section("Large files"), re.MULTILINE)
    documented = {path: int(lines) for path, lines in rows}
    actual = _large_files()
    assert sorted(documented) == sorted(actual)
    stale = {
        path: (documented[path], lines)
        for path, lines in actual.items()
        if abs(documented[path] - lines) > lines / 10
    }
    assert stale == {}, "docs/architecture.md's line counts (doc, code) drifted"


def test_the_architecture_doc_lists_the_long_functions() -> None:
    named = set(re.findall(r"^- `([\w.]+)`", _doc_section("Long functions"), re.MULTILINE))
    assert sorted(named) == sorted(LONG_FUNCTIONS)
