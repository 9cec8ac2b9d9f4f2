"""The node's side of warm state: pick the bundle that matches this node, check its signed
statement, download it bounded, restore it under VLLM_CACHE_ROOT, and after vLLM started tell
hit from miss (docs/warm-state.md).

``restore_for`` is what ``tensor-registry warm-restore`` (and a bench, before `vllm serve`)
calls; it leaves a small state file in the cache root (``.tensor-registry-warm.json``: the
bundle, its key and factors, the hash directories present right after the restore) that
``report`` reads after vLLM started (``tensor-registry warm-report``) to decide and check in.

Trust (SECURITY.md rule 8): the bundle is chosen and checked by its signed statement, never by
the unsigned resolve answer: the signature must verify with the node's trusted keys (pinned or
configured, as for manifests), the statement must name this artifact, and the tar's size and
sha256 must be the signed ones before a byte of it is unpacked. When the node has no trusted
keys and none can be pinned, restoring is refused (fail closed) unless ``allow_unsigned``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensor_registry.api.download import download as download_file
from tensor_registry.api.errors import ChecksumMismatch
from tensor_registry.formats.signed_manifest import ManifestError, verify
from tensor_registry.formats.warm import (
    BUNDLE_FILE,
    WARM_PREDICATE_TYPE,
    WarmFormatError,
    WarmKey,
    differences,
    normalize_serve_args,
)
from tensor_registry.formats.warm_bundle import (
    WarmBundleError,
    gpu_capability,
    hash_dirs,
    installed_version,
    restore,
)
from tensor_registry.warm.observe import Outcome, observe

STATE_FILE = ".tensor-registry-warm.json"
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
MAX_STATEMENT_BYTES = 1 << 20
# What a restore may unpack at most, whatever the statement says (a bundle is tens to hundreds
# of MB for one model; a few GB with autotuning).
DEFAULT_MAX_BYTES = 16 << 30


def default_cache_root() -> Path:
    """Where vLLM looks: VLLM_CACHE_ROOT, else $XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    configured = os.environ.get(CACHE_ROOT_ENV)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "vllm"


def node_key(
    *,
    model: str,
    dtype: str,
    tensor_parallel_size: int,
    serve_args: Iterable[str] = (),
    gpu: str | None = None,
) -> WarmKey:
    """The key this node will start vLLM with (versions from the installed packages)."""
    return WarmKey(
        vllm_version=installed_version("vllm"),
        torch_version=installed_version("torch"),
        gpu=gpu or gpu_capability(),
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        model=model,
        serve_args=tuple(normalize_serve_args(serve_args)),
    )


@dataclass
class Restored:
    bundle_id: str | None
    artifact_id: str
    differed: list[str]  # key parts that differ (a miss is expected when not empty)
    dirs: list[str] = field(default_factory=list)
    state_file: Path | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "bundle_id": self.bundle_id,
            "artifact_id": self.artifact_id,
            "expect": "hit" if self.bundle_id and not self.differed else "miss",
            "differed": self.differed,
            "dirs": self.dirs,
            "state_file": str(self.state_file) if self.state_file else None,
        }


def choose(
    bundles: Iterable[Mapping[str, Any]], mine: WarmKey
) -> tuple[Mapping[str, Any] | None, list[str]]:
    """The listed bundle whose key matches ``mine`` (newest first as listed), else the closest
    one (fewest differing parts) and what differs; (None, [reason]) when none is listed."""
    best: tuple[Mapping[str, Any] | None, list[str]] = (None, ["no warm bundle for this artifact"])
    for entry in bundles:
        try:
            theirs = WarmKey.from_dict(entry.get("key") or {})
        except WarmFormatError:
            continue
        diff = differences(theirs, mine)
        if not diff:
            return entry, []
        if best[0] is None or len(diff) < len(best[1]):
            best = (entry, diff)
    return best


def check_statement(
    entry: Mapping[str, Any], keys: Mapping[str, bytes], *, artifact_id: str
) -> dict[str, Any]:
    """The bundle's signed predicate, once its signature verifies and it names this artifact
    and this bundle; raises WarmBundleError."""
    raw = str(entry.get("statement") or "").encode()
    if not raw or len(raw) > MAX_STATEMENT_BYTES:
        raise WarmBundleError("unsigned_bundle", "the warm bundle carries no signed statement")
    try:
        signed = verify(raw, keys, predicate_type=WARM_PREDICATE_TYPE)
    except ManifestError as exc:
        raise WarmBundleError(exc.code, f"the warm bundle's statement: {exc.message}") from None
    predicate = signed.predicate
    bound = predicate.get("bundle") or {}
    if str(bound.get("artifact_id")) != artifact_id or str(bound.get("id")) != str(entry.get("id")):
        raise WarmBundleError(
            "statement_mismatch",
            f"the signed statement is for bundle {bound.get('id')} of artifact "
            f"{bound.get('artifact_id')}, not bundle {entry.get('id')} of {artifact_id}",
        )
    files = signed.files
    if BUNDLE_FILE not in files:
        raise WarmBundleError("statement_mismatch", f"the signed statement lists no {BUNDLE_FILE}")
    return predicate


def _download_bundle(url: str, target: Path, *, size: int, sha256: str) -> None:
    """``url`` into ``target`` as every signed file is downloaded (tensor_registry/api/
    download.py: at most ``size`` bytes, idle timeout, deadline, resumed after a drop), then
    its sha256 checked."""
    try:
        actual = download_file(url, target, size=size)
    except ChecksumMismatch as exc:
        raise WarmBundleError("content_mismatch", f"the bundle: {exc.detail}") from None
    if actual != sha256:
        raise WarmBundleError(
            "content_mismatch",
            f"the bundle's {size} bytes have sha256 {actual}; signed: {sha256}",
        )


def restore_for(
    answer: Mapping[str, Any],
    mine: WarmKey,
    cache_root: Path,
    *,
    keys: Mapping[str, bytes] | None,
    allow_unsigned: bool = False,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Restored:
    """Restore the bundle of the resolve ``answer`` that matches ``mine`` into ``cache_root``.
    A bundle whose key differs is not restored (vLLM would not use it): the outcome says what
    differs. Raises WarmBundleError when a bundle fails a trust check."""
    artifact_id = str((answer.get("artifact") or {}).get("id"))
    entry, differed = choose(answer.get("warm_bundles") or [], mine)
    cache_root.mkdir(parents=True, exist_ok=True)
    if entry is None or differed:
        result = Restored(str(entry["id"]) if entry else None, artifact_id, differed)
        result.state_file = _write_state(cache_root, result, entry, predicate=None)
        return result
    if keys:
        predicate = check_statement(entry, keys, artifact_id=artifact_id)
        signed = next(f for f in predicate["files"] if f["path"] == BUNDLE_FILE)
        size, sha256 = int(signed["size"]), str(signed["sha256"])
        signed_key = WarmKey.from_dict(predicate.get("key") or {})
        late = differences(signed_key, mine)
        if late:
            raise WarmBundleError(
                "statement_mismatch",
                "the signed key differs from the listed one: " + "; ".join(late),
            )
    elif allow_unsigned:
        predicate = {"cache": entry.get("cache") or {}}
        size, sha256 = int(entry["size"]), str(entry["sha256"])
    else:
        raise WarmBundleError(
            "untrusted_signing_key",
            "no trusted registry key to check the warm bundle with (pin the registry's keys "
            "with `tensor-registry trust`); refusing to restore unsigned compile caches",
        )
    if size > max_bytes:
        raise WarmBundleError("bundle_too_large", f"the bundle has {size} bytes, above {max_bytes}")
    part = cache_root / f".warm-download-{uuid.uuid4().hex}.tar"
    try:
        _download_bundle(str(entry["url"]), part, size=size, sha256=sha256)
        dirs = restore(part, cache_root, max_bytes=max_bytes)
    finally:
        part.unlink(missing_ok=True)
    result = Restored(str(entry["id"]), artifact_id, [], dirs)
    result.state_file = _write_state(cache_root, result, entry, predicate=predicate)
    return result


def _write_state(
    cache_root: Path,
    result: Restored,
    entry: Mapping[str, Any] | None,
    *,
    predicate: Mapping[str, Any] | None,
) -> Path:
    cache = (predicate or {}).get("cache") or {}
    state = {
        "bundle_id": result.bundle_id,
        "artifact_id": result.artifact_id,
        "differed": result.differed,
        "bundle_dirs": list(cache.get("dirs") or []),
        "bundle_factors": dict(cache.get("factors") or {}),
        "before": sorted(hash_dirs(cache_root)),
        "model": (entry or {}).get("model"),
    }
    path = cache_root / STATE_FILE
    staging = path.with_name(f".{STATE_FILE}.{uuid.uuid4().hex}")
    staging.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(staging, path)
    return path


def report(cache_root: Path, *, log_text: str | None = None) -> tuple[dict[str, Any], Outcome]:
    """After vLLM started: the restore's state and the hit or miss (module docstring)."""
    path = cache_root / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise WarmBundleError(
            "no_restore", f"no warm restore recorded in {cache_root} ({exc})"
        ) from None
    if not state.get("bundle_dirs"):
        return state, Outcome(
            "miss", list(state.get("differed") or ["no warm bundle was restored"])
        )
    outcome = observe(
        cache_root,
        bundle_dirs=state["bundle_dirs"],
        bundle_factors=state.get("bundle_factors") or {},
        before=state.get("before") or [],
        key_differences=state.get("differed") or [],
        log_text=log_text,
    )
    return state, outcome


def checkin_entry(state: Mapping[str, Any], outcome: Outcome) -> dict[str, Any]:
    """The check-in's ``warm`` field of a ``loaded`` entry (tensor_registry/checkins.py)."""
    return {
        "bundle_id": state.get("bundle_id"),
        "result": outcome.result,
        "differed": [d[:300] for d in outcome.differed[:16]],
        "used": [u[:300] for u in outcome.used[:16]],
    }
