"""One vocabulary: dtypes, formats and event types are spelled once, in tensor_registry/formats/,
and every other place reads them from there (the API's schemas, the CLI, the worker, the agent,
and the web UI through /ui/js/vocabulary.js). A second list of them anywhere fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import httpx

from tensor_registry.formats.events import EVENT_TYPES, WATCH_EVENT_TYPES
from tensor_registry.formats.variant import DTYPES, FORMATS
from tensor_registry_server.core.schemas import Dtype, Format

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "tensor_registry" / "formats"
WORDS = {"dtypes": set(DTYPES), "formats": set(FORMATS), "event types": set(EVENT_TYPES)}


def _python_sources() -> list[Path]:
    skip = (HOME, ROOT / "tensor_registry_server" / "migrations")
    return sorted(
        p
        for package in ("tensor_registry", "tensor_registry_server")
        for p in (ROOT / package).rglob("*.py")
        if not any(p.is_relative_to(s) for s in skip)
    )


def _which(values: list[str]) -> str | None:
    """The vocabulary a literal of two or more strings spells, if all its strings are one's."""
    if len(set(values)) < 2:
        return None
    return next((name for name, words in WORDS.items() if set(values) <= words), None)


def _python_copies(path: Path, root: Path = ROOT) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        elts: list[ast.expr] = []
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        values = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(values) == len(elts) and (which := _which(values)):
            found.append(f"{path.relative_to(root)}:{node.lineno}: {which} {values}")
    return found


def _js_copies(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    found = []
    for match in re.finditer(r"\[([^\[\]]*)\]", text):
        values = re.findall(r"""["']([\w.]+)["']""", match.group(1))
        if (which := _which(values)) is not None:
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{path.relative_to(root)}:{line}: {which} {values}")
    return found


def test_no_product_file_spells_the_vocabulary_again() -> None:
    copies = [c for p in _python_sources() for c in _python_copies(p)]
    copies += [
        c
        for p in sorted((ROOT / "tensor_registry_server" / "ui").rglob("*.js"))
        for c in _js_copies(p)
    ]
    assert copies == []


def test_the_copy_detector_finds_a_copy(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('X = ("bfloat16", "float16")\nY = {"hf": 1, "vllm": 2}\n')
    assert len(_python_copies(planted, tmp_path)) == 2
    js = tmp_path / "planted.js"
    js.write_text('const EVENTS = ["alias.moved", "artifact.ready"];\n')
    assert len(_js_copies(js, tmp_path)) == 1


def test_the_apis_types_are_the_vocabularys() -> None:
    from typing import get_args

    assert get_args(Dtype) == DTYPES and get_args(Format) == FORMATS
    assert set(WATCH_EVENT_TYPES) <= set(EVENT_TYPES)


async def test_the_web_ui_reads_the_vocabulary_from_the_server(client: httpx.AsyncClient) -> None:
    r = await client.get("/ui/js/vocabulary.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
    for name, values in (("DTYPES", DTYPES), ("FORMATS", FORMATS), ("EVENT_TYPES", EVENT_TYPES)):
        listed = re.search(rf"export const {name} = Object\.freeze\((\[.*?\])\);", r.text)
        assert listed is not None and tuple(ast.literal_eval(listed.group(1))) == values
