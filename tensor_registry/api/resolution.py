"""The resolve answer: one GET /api/v1/resolve reply (`Resolution`, its files) and model refs.

Plain data with the bounds a node applies to the server's advice; `client.py` asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tensor_registry.api.errors import InvalidRequest
from tensor_registry.formats.paths import require_relative_paths

MAX_READERS = 64


def _bounded(value: Any, low: int, high: int, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return max(low, min(high, value))


def parse_model_ref(text: str) -> tuple[str, str]:
    """'acme/llama:prod' -> ('acme/llama', 'prod'); no ':' means 'latest'."""
    name, sep, ref = text.partition(":")
    if name.count("/") != 1 or not all(name.split("/")):
        raise InvalidRequest(
            f"{text!r} is not NAMESPACE/NAME[:REF]", code="invalid_model_ref", status=None
        )
    return name, (ref if sep and ref else "latest")


@dataclass(frozen=True)
class ResolvedFile:
    path: str
    size: int
    sha256: str
    url: str
    kind: str

    @property
    def is_weights(self) -> bool:
        return self.kind == "weights"


@dataclass
class Resolution:
    """One answer of GET /api/v1/resolve, plus how to ask again (URLs expire)."""

    data: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return str(self.data["model"])

    @property
    def version(self) -> int:
        return int(self.data["version"])

    @property
    def artifact(self) -> dict[str, Any]:
        return dict(self.data["artifact"])

    @property
    def artifact_id(self) -> str:
        return str(self.data["artifact"]["id"])

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.data["artifact"]["tensor_parallel_size"])

    @property
    def encrypted(self) -> bool:
        return bool(self.data["artifact"]["encryption"]["enabled"])

    @property
    def files(self) -> list[ResolvedFile]:
        """The answer's files; every path passes the shared relative-path rule (no two the
        same) and every size is a non-negative integer, or ``UnsafePath`` / ``InvalidRequest``
        before anything is read or written (tensor_registry/formats/paths.py)."""
        return self.check_files()

    def check_files(self) -> list[ResolvedFile]:
        listed = self.data.get("files")
        if not isinstance(listed, list):
            raise InvalidRequest("the resolve answer lists no files", code="bad_answer")
        files = [
            ResolvedFile(f["path"], int(f["size"]), f["sha256"], f["url"], f["kind"])
            for f in listed
        ]
        require_relative_paths([f.path for f in files], what="a file path in the resolve answer")
        if any(f.size < 0 for f in files):
            raise InvalidRequest("the resolve answer lists a negative size", code="bad_answer")
        return files

    @property
    def tensorizer_uri(self) -> str:
        return str(self.data["tensorizer_uri"])

    def rank_uri(self, rank: int = 0) -> str:
        uris = self.data["tensorizer_uris"]
        if not 0 <= rank < len(uris):
            raise InvalidRequest(
                f"rank {rank} is outside tensor_parallel_size {len(uris)}", code="invalid_rank"
            )
        return str(uris[rank])

    @property
    def encryption_key_url(self) -> str | None:
        return self.data.get("encryption_key_url")

    @property
    def expires_at(self) -> datetime:
        return datetime.fromisoformat(str(self.data["expires_at"]).replace("Z", "+00:00"))

    def expires_within(self, seconds: float) -> bool:
        return (self.expires_at - datetime.now(UTC)).total_seconds() < seconds

    # The answer's advice is unsigned: what a node takes from it is bounded here, and whether
    # hashes are checked is what the node asked (the registry's default: on), so a proxy can
    # neither turn verification off nor ask for 100 000 readers (docs/trust.md).

    @property
    def num_readers(self) -> int:
        return _bounded(self.data["deserializer"].get("num_readers"), 1, MAX_READERS, 4)

    @property
    def verify_hash(self) -> bool:
        return str(self.params.get("verify_hash", "true")).lower() not in ("false", "0")

    @property
    def engine_advice(self) -> dict[str, Any]:
        """The answer's ``engine`` block with every number bounded."""
        advice = dict(self.data.get("engine") or {})
        advice["connections"] = _bounded(advice.get("connections"), 1, MAX_READERS, 16)
        advice["block_bytes"] = _bounded(advice.get("block_bytes"), 1 << 20, 256 << 20, 64 << 20)
        fraction = advice.get("register_fraction", 0.0)
        advice["register_fraction"] = (
            min(1.0, max(0.0, float(fraction))) if isinstance(fraction, int | float) else 0.0
        )
        advice["verify"] = self.verify_hash
        return advice

    @property
    def vllm_extra_config(self) -> dict[str, Any]:
        return dict(self.data["vllm"]["model_loader_extra_config"])

    @property
    def vllm_args(self) -> list[str]:
        return list(self.data["vllm"]["args"])
