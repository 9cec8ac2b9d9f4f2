"""One flag vocabulary across every command: each option is spelled the same way and means the
same thing wherever it appears, and the variant flags come as one set. Walks every argparse
parser `tensor-registry` builds (tensor_registry/cli and the server's commands)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tensor_registry.cli.main import build_parser
from tensor_registry.formats.variant import DTYPES, FORMATS

# Options whose value sets differ by what they filter, and why.
CHOICES_DIFFER = {"--status": "a job's statuses (jobs ls) or an artifact's (artifacts ls)"}
VARIANT = {"--dtype", "--format", "--tensor-parallel-size", "--encrypted"}
# What the shared vocabulary means, exactly: (dest, action, type, choices, default, spellings).
VOCABULARY: dict[str, tuple[str, str, Any, Any, Any, set[str]]] = {
    "--dtype": ("dtype", "_StoreAction", None, tuple(DTYPES), None, {"--dtype"}),
    "--format": ("format", "_StoreAction", None, tuple(FORMATS), None, {"--format"}),
    "--tensor-parallel-size": (
        "tp", "_StoreAction", int, None, None, {"-tp", "--tensor-parallel-size"}
    ),
    "--encrypted": (
        "encrypted", "BooleanOptionalAction", None, None, None, {"--encrypted", "--no-encrypted"}
    ),
    "--keyfile": ("keyfile", "_StoreAction", Path, None, None, {"--keyfile"}),
    "--url": ("url", "_StoreAction", None, None, None, {"--url"}),
    "--token": ("token", "_StoreAction", None, None, None, {"--token"}),
    "--json": ("json", "_StoreTrueAction", None, None, False, {"--json"}),
    "--yes": ("yes", "_StoreTrueAction", None, None, False, {"-y", "--yes"}),
}  # fmt: skip


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    def walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, Any]]:
        yield path, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}".strip())

    yield from walk(build_parser(), "")


def options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    for action in parser._actions:
        if action.option_strings and not isinstance(
            action, argparse._HelpAction | argparse._VersionAction
        ):
            yield action


def test_every_option_is_spelled_and_means_the_same_everywhere() -> None:
    seen: dict[str, dict[tuple[Any, ...], list[str]]] = {}
    walked = 0
    for path, parser in parsers():
        walked += 1
        for action in options(parser):
            if action.help == argparse.SUPPRESS:
                continue  # an earlier spelling kept for old scripts
            for option in action.option_strings:
                assert re.fullmatch(r"--[a-z0-9]+(-[a-z0-9]+)*|-[a-z]{1,2}", option), (path, option)
                meaning = (
                    action.dest,
                    action.nargs == 0,
                    action.type,
                    None if option in CHOICES_DIFFER else tuple(action.choices or ()),
                    frozenset(action.option_strings),
                )
                seen.setdefault(option, {}).setdefault(meaning, []).append(path)
    assert walked > 40
    differing = {o: m for o, m in seen.items() if len(m) > 1}
    assert differing == {}, differing


def test_the_shared_vocabulary_is_exact_and_variants_come_as_a_set() -> None:
    commands_with_variants = set()
    for path, parser in parsers():
        by_option = {o: a for a in options(parser) for o in a.option_strings}
        for option, (dest, kind, typ, choices, default, spellings) in VOCABULARY.items():
            action = by_option.get(option)
            if action is None:
                continue
            assert action.dest == dest, (path, option)
            assert type(action).__name__ == kind, (path, option, type(action).__name__)
            assert action.type == typ and (action.choices and tuple(action.choices)) == choices, (
                path,
                option,
            )
            assert action.default == default, (path, option, action.default)
            assert set(action.option_strings) == spellings, (path, option)
        present = VARIANT & set(by_option)
        if present:
            # Whoever takes one variant flag takes them all: a variant is named one way.
            assert present == VARIANT, (path, sorted(present))
            commands_with_variants.add(path)
    assert {
        "resolve", "pull", "vllm-args", "load", "bench-load", "tensorize", "export"
    } <= commands_with_variants, commands_with_variants  # fmt: skip


def test_old_spellings_still_parse_to_the_same_values() -> None:
    parser = build_parser()
    old = parser.parse_args(["tensorize", "acme/m", "--dtype", "float16", "--format", "hf",
                             "--encrypt", "--tp", "2"])  # fmt: skip
    new = parser.parse_args(["tensorize", "acme/m", "--dtype", "float16", "--format", "hf",
                             "--encrypted", "-tp", "2"])  # fmt: skip
    assert (old.encrypted, old.tp) == (new.encrypted, new.tp) == (True, 2)
    plain = parser.parse_args(["load", "acme/m", "--unencrypted"])
    assert plain.encrypted is False
    assert parser.parse_args(["load", "acme/m", "--no-encrypted"]).encrypted is False
    assert parser.parse_args(["pull", "acme/m", "--dest", "d", "--keyfile", "k"]).keyfile == Path(
        "k"
    )
