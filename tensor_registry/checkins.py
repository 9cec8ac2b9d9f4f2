"""Check-ins: what this node tells the registry (``POST /api/v1/nodes/checkin``, docs/events.md).

One home for every entry point that reports: the agent (its watches, every minute and on each
change), ``tensor-registry load`` / ``bench-load`` and ``pull`` (once, when they finish or fail)
and the vLLM plugin (once per rank's load). All of them report the same node:

- ``node_id``: ``TENSOR_REGISTRY_NODE_ID`` when set (a pod's name, say), else made once and kept
  in the node cache's folder (``CACHE/node-id``), the one place every process of the node
  shares. An agent that kept one in its state dir before (``STATE_DIR/node-id``) hands it over.
- ``hostname``, ``agent_version`` (this library's release), ``gpus`` (the NVIDIA driver's list,
  no CUDA library needed), ``cached`` (artifacts whose files the node cache holds whole).
- ``loaded``: for a load or pull, one entry (:func:`load_entry`): who (``by``), the model, the
  ref it asked for and the version and artifact it resolved to, the ``path`` it took (``engine``,
  ``tensorizer``, ``pull``), seconds, GB/s, whether bytes were verified, and ``error`` when it
  failed. Each entry carries a fresh ``id``: the registry counts a load once, however often the
  same check-in is repeated.

A one-shot check-in (:func:`report`) never fails nor noticeably slows what it reports on: it is
sent after the work and given ``TIMEOUT_SECONDS`` in all (each step's timeout bounds a thread that
is then left behind, so a registry that takes the connection and never answers costs no more),
and any error is one line on stderr. A token without the ``resolve`` scope gets that line once per
process. ``TENSOR_REGISTRY_NO_CHECKIN=1`` (or ``--no-checkin``) sends nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tensor_registry.api.client import PermissionDenied, RegistryClient, RegistryError
from tensor_registry.version import __version__

CHECKIN_PATH = "/api/v1/nodes/checkin"
NODE_ID_FILE = "node-id"
NODE_ID_ENV = "TENSOR_REGISTRY_NODE_ID"
OPT_OUT_ENV = "TENSOR_REGISTRY_NO_CHECKIN"
TIMEOUT_SECONDS = 2.0
MAX_ERROR_CHARS = 500
# What the registry keeps of one load entry's free text (tensor_registry_server/nodes/schemas.py
# bounds them).
MAX_REF_CHARS = 64
# What the registry takes in one check-in (tensor_registry_server/nodes/schemas.py): longer lists
# are cut here.
MAX_WATCHES = 32
MAX_CACHED = 256

_scope_warned = threading.Event()


def enabled() -> bool:
    """False when ``TENSOR_REGISTRY_NO_CHECKIN`` is set to 1/true/yes (the node opted out)."""
    return os.environ.get(OPT_OUT_ENV, "").strip().lower() not in ("1", "true", "yes")


def node_id(cache_root: Path, *, legacy: Path | None = None) -> str:
    """This node's stable id: ``TENSOR_REGISTRY_NODE_ID``, else ``cache_root/node-id`` (made
    once; two processes making it at once agree on the first one written). ``legacy``: an
    older file to adopt when the shared one does not exist yet (the agent's state dir)."""
    configured = os.environ.get(NODE_ID_ENV, "").strip()
    if configured:
        return configured
    path = cache_root / NODE_ID_FILE
    with contextlib.suppress(FileNotFoundError):
        existing = _read_id(path)
        if existing:
            return existing
    made = ""
    if legacy is not None:
        with contextlib.suppress(OSError):
            made = _read_id(legacy)
    made = made or uuid.uuid4().hex
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{NODE_ID_FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
    staging.write_text(made + "\n")
    try:
        os.link(staging, path)  # fails if another process got there first: keep theirs
    except FileExistsError:
        return _read_id(path) or made
    finally:
        staging.unlink(missing_ok=True)
    return made


def _read_id(path: Path) -> str:
    """The id a file holds (the registry takes at most 64 characters; a longer one is refused
    there, and said in the warning)."""
    with path.open("rb") as fh:
        return fh.read(256).decode("utf-8", "replace").strip()


def hostname() -> str:
    return socket.gethostname()[:255]


def gpus() -> list[dict[str, Any]]:
    """The NVIDIA GPUs the driver lists (no CUDA library needed); [] elsewhere."""
    found = []
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            fields = dict(
                line.split(":", 1) for line in info.read_text().splitlines() if ":" in line
            )
        except OSError:
            continue
        found.append({"name": fields.get("Model", "unknown").strip()[:255]})
    return found


def body(
    node: str,
    *,
    watches: list[dict[str, Any]] | None = None,
    cached: list[str] | None = None,
    loaded: list[dict[str, Any]] | None = None,
    stopped: bool = False,
) -> dict[str, Any]:
    """A check-in. A field left out (None) is left as the registry has it: the agent sends
    ``watches``, a load sends ``loaded``, and neither erases what the other reported.
    ``stopped``: the agent's last check-in as it stops (the registry stops counting it)."""
    out: dict[str, Any] = {
        "node_id": node,
        "hostname": hostname(),
        "agent_version": __version__,
        "gpus": gpus(),
    }
    for key, value in (("watches", watches), ("cached", cached), ("loaded", loaded)):
        if value is not None:
            out[key] = value
    if stopped:
        out["stopped"] = True
    return out


def load_entry(
    *,
    by: str,
    model: str,
    ref: str | None,
    path: str,
    seconds: float,
    verified: bool,
    artifact_id: str | None = None,
    version: int | None = None,
    gbps: float | None = None,
    rank: int | None = None,
    error: str | None = None,
    warm: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One ``loaded`` entry: a load (``by`` load, bench-load, vllm) or a pull, done or failed;
    ``warm`` (path ``warm``): a restored warm bundle's hit or miss (tensor_registry/warm/)."""
    entry: dict[str, Any] = {
        "id": uuid.uuid4().hex,
        "by": by,
        "model": model,
        "ref": ref[:MAX_REF_CHARS] if ref else None,
        "artifact_id": artifact_id,
        "version": version,
        "path": path,
        "seconds": round(max(seconds, 0.0), 4),
        "gbps": float(f"{gbps:.6g}") if gbps is not None else None,  # 6 significant digits
        "verified": verified,
        "rank": rank,
        "error": one_line(error)[:MAX_ERROR_CHARS] if error else None,
    }
    if warm is not None:
        entry["warm"] = warm
    return entry


def post(client: RegistryClient, checkin: dict[str, Any]) -> None:
    """Send one check-in within ``TIMEOUT_SECONDS`` a step; raises what the client raises."""
    client.request("POST", CHECKIN_PATH, json=checkin, timeout=httpx.Timeout(TIMEOUT_SECONDS))


def warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def report(
    client: RegistryClient,
    cache_root: Path,
    entry: dict[str, Any],
    *,
    cached: list[str] | None = None,
    say: Callable[[str], None] = warn,
) -> bool:
    """Check in once after a load or pull (``entry`` from :func:`load_entry`); True when the
    registry took it. Never raises: an error is one line through ``say``."""
    if not enabled():
        return False
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            post(client, body(node_id(cache_root), cached=cached, loaded=[entry]))
            outcome.append(None)
        except BaseException as exc:  # handed to the caller's thread below
            outcome.append(exc)

    sender = threading.Thread(target=send, name="checkin", daemon=True)
    sender.start()
    sender.join(TIMEOUT_SECONDS)
    if not outcome:
        say(f"check-in unanswered after {TIMEOUT_SECONDS:g} s; set {OPT_OUT_ENV}=1 to stop trying")
        return False
    try:
        if outcome[0] is not None:
            raise outcome[0]
        return True
    except PermissionDenied as exc:
        if not _scope_warned.is_set():
            _scope_warned.set()
            say(
                f"check-in refused ({exc.code or exc.status}): this token may not check in "
                f"(it needs the 'resolve' scope on the model's namespace); set {OPT_OUT_ENV}=1 "
                "to stop trying"
            )
    except (RegistryError, OSError, ValueError) as exc:
        say(f"check-in failed ({one_line(str(exc))[:200]}); set {OPT_OUT_ENV}=1 to stop trying")
    return False


def one_line(text: str) -> str:
    return " ".join(text.split())
