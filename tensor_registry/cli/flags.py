"""The CLI's shared argument vocabulary: connection flags, artifact filters, `--json`, `--yes`,
and the checks of NS/NAME[:REF] that argparse cannot make.

Flags follow vLLM's vocabulary (`--tensor-parallel-size`/`-tp`, `--dtype`) so that a command the
web UI or the docs print runs here unchanged, and what `pull` prints runs in vLLM.

The server URL and token come from --url/--token, else TENSOR_REGISTRY_URL/TENSOR_REGISTRY_TOKEN,
else what `tensor-registry login` stored (tensor_registry/config.py; read there because the client
runs without the server's settings machinery).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import InvalidRequest
from tensor_registry.api.resolution import parse_model_ref
from tensor_registry.formats.variant import DTYPES, FORMATS

if TYPE_CHECKING:
    SubParsers = argparse._SubParsersAction[argparse.ArgumentParser]


class UsageError(Exception):
    """Bad arguments that argparse cannot see (exit 2)."""


def connection_parser() -> argparse.ArgumentParser:
    """--url/--token, shared by every command that talks to the registry."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=None,
        help="registry URL, 'host:port' is fine (default: $TENSOR_REGISTRY_URL, then the "
        "`login` file, then http://127.0.0.1:8000)",
    )
    common.add_argument(
        "--token",
        default=None,
        help="API token (default: $TENSOR_REGISTRY_TOKEN, then the `login` file)",
    )
    return common


def add_tensor_parallel_size(parser: argparse.ArgumentParser, **kwargs: Any) -> None:
    parser.add_argument(
        "-tp",
        "--tensor-parallel-size",
        dest="tp",
        type=int,
        metavar="N",
        help="tensor-parallel size, as vLLM's flag",
        **kwargs,
    )
    # The first spelling, kept so existing scripts run.
    parser.add_argument("--tp", dest="tp", type=int, help=argparse.SUPPRESS)


def add_encrypted(
    parser: argparse.ArgumentParser,
    help: str = "only encrypted (--encrypted) or only plain (--no-encrypted) artifacts "
    "(the resolve API's `encrypted` filter); default: either",
) -> None:
    """--encrypted/--no-encrypted: the variant's encryption, None when not given."""
    parser.add_argument(
        "--encrypted",
        dest="encrypted",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=help,
    )
    # Earlier spellings, kept so existing scripts run.
    parser.add_argument(
        "--unencrypted", dest="encrypted", action="store_false", help=argparse.SUPPRESS
    )
    parser.add_argument("--encrypt", dest="encrypted", action="store_true", help=argparse.SUPPRESS)


def add_variant_flags(parser: argparse.ArgumentParser, *, make: bool = False) -> None:
    """--dtype, --format, -tp/--tensor-parallel-size, --encrypted/--no-encrypted: one variant.

    Every command that names or chooses a variant spells it this way (tests/client/
    test_flag_vocabulary.py walks every parser); not given, each is None (any, or the
    command's own default). ``make``: the command makes that variant (tensorize), so dtype and
    format are required and --encrypted means "encrypt the weights"."""
    parser.add_argument("--dtype", choices=DTYPES, required=make, help="weights dtype")
    parser.add_argument(
        "--format", choices=FORMATS, required=make, help="hf or vllm (vLLM's own layout)"
    )
    add_tensor_parallel_size(parser)
    if make:
        add_encrypted(parser, "encrypt the weights (a key per artifact)")
    else:
        add_encrypted(parser)


def add_keyfile(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """--keyfile PATH: the key file of an encrypted artifact on this node."""
    parser.add_argument(
        "--keyfile",
        type=Path,
        default=None,
        metavar="PATH",
        help=help
        or "this node's own key file (32 bytes) for an encrypted artifact: the registry is not "
        "asked for the key, so the token needs no keys:read",
    )


def artifact_choice_parser() -> argparse.ArgumentParser:
    """NS/NAME[:REF] and the filters that pick one artifact of it (resolve, pull, vllm-args)."""
    choice = argparse.ArgumentParser(add_help=False)
    choice.add_argument("model", metavar="NS/NAME[:REF]", help="model, optionally :alias|:N")
    add_variant_flags(choice)
    choice.add_argument("--ttl", type=int, help="lifetime of the signed URLs, seconds")
    choice.add_argument("--num-readers", type=int, help="tensorizer readers to advise")
    return choice


def resolve_filters(args: argparse.Namespace) -> dict[str, Any]:
    """What the flags of artifact_choice_parser() ask of `client.resolve`."""
    return {
        **variant_filters(args),
        "ttl": args.ttl,
        "num_readers": args.num_readers,
    }


def variant_filters(args: argparse.Namespace) -> dict[str, Any]:
    """What the flags of add_variant_flags() ask of `client.resolve`."""
    return {
        "dtype": args.dtype,
        "format": args.format,
        "tensor_parallel_size": args.tp,
        "encrypted": args.encrypted,
    }


def allow_unsigned_flag(parser: argparse.ArgumentParser) -> None:
    """`--allow-unsigned`: the explicit opt-out of fail-closed verification (an artifact
    without a signed manifest is refused once the registry's keys are pinned or trusted keys
    are configured; tensor_registry/trust/). Same name on every command that verifies."""
    parser.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="accept an artifact without a signed manifest although this registry's keys "
        "are pinned (or TENSOR_REGISTRY_TRUSTED_KEYS is set); "
        "also TENSOR_REGISTRY_ALLOW_UNSIGNED=1",
    )


def add_checkin_flag(parser: argparse.ArgumentParser) -> None:
    """`--no-checkin`: the opt-out of the check-in a command sends when it is done
    (tensor_registry/checkins.py). Same name on every command that checks in."""
    parser.add_argument(
        "--no-checkin",
        action="store_true",
        help="do not tell the registry about this node and what it did (POST "
        "/api/v1/nodes/checkin, sent when done, 2 s timeout, never fails the command); "
        "also TENSOR_REGISTRY_NO_CHECKIN=1",
    )


def require_flag(args: argparse.Namespace) -> bool | None:
    """``require`` for tensor_registry.trust.verify_resolution from `--allow-unsigned`:
    False (accept unsigned) when given, else None (the fail-closed default)."""
    return False if getattr(args, "allow_unsigned", False) else None


def json_flag() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parent


def yes_flag() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    return parent


def command_group(sub: SubParsers, name: str, help: str) -> SubParsers:
    """`tensor-registry NAME COMMAND`: a group of subcommands (models, alias, jobs, ...)."""
    parser = sub.add_parser(name, help=help, description=help)
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


def model_ref(text: str) -> tuple[str, str]:
    try:
        return parse_model_ref(text)
    except InvalidRequest as exc:
        raise UsageError(exc.detail) from exc


def model_only(text: str) -> str:
    name, _ = model_ref(text)
    if ":" in text:
        raise UsageError(f"{text!r}: give NS/NAME without a :REF here")
    return name


def confirm(args: argparse.Namespace, what: str) -> None:
    """Deleting asks on a terminal and needs --yes (yes_flag()) elsewhere: a script never
    deletes by accident."""
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise UsageError(f"deleting {what} needs --yes when there is no terminal to ask")
    answer = input(f"Delete {what}? This cannot be undone. [y/N] ")
    if answer.strip().lower() not in ("y", "yes"):
        raise UsageError("not deleted")
