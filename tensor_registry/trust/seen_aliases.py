"""The newest alias move a node has been shown, per registry: what makes a replayed older
binding a rollback."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tensor_registry.config import config_dir
from tensor_registry.trust.clock import signed_time
from tensor_registry.trust.errors import TrustError
from tensor_registry.trust.state_files import read_state, write_state

SEEN_FILE = "seen-aliases.json"


class SeenAliases:
    """The newest move of each alias a node has been shown, per registry identity, in
    ``config_dir()/seen-aliases.json`` (mode 0600): ``{"registries": {ID: {"NS/NAME:ALIAS":
    {"moved_at", "revision", "version", "artifact"}}}}``. A signed binding whose alias move
    is older than the one recorded is a rollback (docs/trust.md)."""

    MAX_PER_REGISTRY = 10_000

    def __init__(self, root: Path | None = None) -> None:
        self.path = (root or config_dir()) / SEEN_FILE

    def check_and_record(
        self, registry_id: str, model: str, alias: Mapping[str, Any], *, version: int, artifact: str
    ) -> None:
        moved_at = signed_time(alias.get("moved_at"), "the alias's moved_at")
        revision = alias.get("revision")
        if not isinstance(revision, int):
            raise TrustError(
                "the signed binding's alias revision is not a number", code="bad_binding"
            )
        data = read_state(self.path)
        seen = data["registries"].setdefault(registry_id, {})
        name = f"{model}:{alias.get('name')}"
        before = seen.get(name)
        if isinstance(before, dict):
            older = (moved_at, revision) < (
                signed_time(before.get("moved_at"), "a recorded moved_at"),
                int(before.get("revision") or 0),
            )
            if older:
                raise TrustError(
                    f"alias rollback: {name} now points at version {version} (alias moved "
                    f"{alias.get('moved_at')}, revision {revision}), but this node already saw "
                    f"it move later, to version {before.get('version')} ({before.get('moved_at')}, "
                    f"revision {before.get('revision')}); an old answer was replayed. "
                    f"If the registry was restored on purpose, remove the entry from {self.path}",
                    code="alias_rollback",
                )
            if (moved_at, revision) == (
                signed_time(before.get("moved_at"), "a recorded moved_at"),
                int(before.get("revision") or 0),
            ):
                return
        if len(seen) >= self.MAX_PER_REGISTRY and name not in seen:
            seen.pop(next(iter(seen)))
        seen[name] = {
            "moved_at": alias.get("moved_at"),
            "revision": revision,
            "version": version,
            "artifact": artifact,
        }
        write_state(self.path, data)
