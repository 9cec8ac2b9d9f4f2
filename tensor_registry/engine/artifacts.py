"""Artifact-level loading: resolve, check the signed manifest, pick the rank's file and where
to read it, load it with the engine or fall back to tensorizer.

The node cache's copy is read when it holds the file for this compatibility key, else the
signed URL. An expired URL during a load re-resolves once and starts again. Encrypted artifacts
and artifacts without a manifest load through tensorizer's reader
(tensor_registry.tensorizer_load) and say so in ``LoadResult.path`` and ``reason``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensor_registry.api.client import (
    RegistryClient,
    RegistryError,
    SignatureExpired,
)
from tensor_registry.api.resolution import Resolution, parse_model_ref
from tensor_registry.engine.cpu import load_file_cpu, load_url_cpu, usable_cores
from tensor_registry.engine.cuda import load_cuda
from tensor_registry.engine.sources import BLOCK_BYTES, DEFAULT_CONNECTIONS
from tensor_registry.formats import layout as layouts
from tensor_registry.formats.layout import FileLayout, LayoutError
from tensor_registry.loading import LoadOptions, rank_file
from tensor_registry.node_cache import NodeCache
from tensor_registry.tensorizer_load import load_state_dict


@dataclass
class LoadResult:
    tensors: dict[str, Any]
    path: str  # "engine", or "tensorizer" (the fallback; ``reason`` says why)
    source: str  # "file" or "url"
    device: str
    verified: bool
    bytes: int
    seconds: float
    reason: str | None = None
    # Seconds per step, and "digest_on" ("device", "host" or "none") for CUDA engine loads.
    phases: dict[str, Any] = field(default_factory=dict)
    # The signing key's id when the artifact's signed manifest verified; None: unsigned.
    signed_by: str | None = None
    # What the load resolved to (for check-ins: tensor_registry/checkins.py).
    model: str | None = None
    version: int | None = None
    artifact_id: str | None = None

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


# Parsed layout manifests by sha256 (a few, per process): a node loading the same artifact
# again neither fetches nor parses it again. The sha256 is the resolve answer's, bound to the
# signed manifest, and the bytes were checked against it when fetched.
_layouts: dict[str, layouts.ArtifactLayout] = {}
LAYOUTS_KEPT = 8


def fetch_layout(client: RegistryClient, resolution: Resolution) -> layouts.ArtifactLayout | None:
    """The artifact's layout manifest, or None for an artifact published without one."""
    entry = next((f for f in resolution.files if f.path == layouts.LAYOUT_FILE), None)
    if entry is None:
        return None
    known = _layouts.get(entry.sha256)
    if known is not None:
        return known
    if entry.size > 64 << 20:
        raise LayoutError("bad_layout", f"layout manifest of {entry.size} bytes is implausible")
    parsed = layouts.loads(client.fetch_resolved_file(entry, "layout manifest"))
    while len(_layouts) >= LAYOUTS_KEPT:
        _layouts.pop(next(iter(_layouts)))
    _layouts[entry.sha256] = parsed
    return parsed


def load_artifact(
    model: str | Resolution,
    ref: str | None = None,
    *,
    client: RegistryClient | None = None,
    rank: int = 0,
    device: Any = "cpu",
    verify: bool | None = None,
    cache: NodeCache | None = None,
    connections: int | None = None,
    readers: int | None = None,
    register_fraction: float | None = None,
    trusted_keys: list[str] | None = None,
    require_signed: bool | None = None,
    key: bytes | None = None,
    options: LoadOptions | None = None,
    **filters: Any,
) -> LoadResult:
    """Resolve (unless given a Resolution), then load rank ``rank``'s file onto ``device``.

    First the artifact's signed manifest is checked (tensor_registry.trust: signature by a trusted
    key, this artifact, exactly these files); every byte is then checked against it while it
    loads. Nothing is returned when any check fails.

    Reads the node cache's copy when it holds the file (``cache``, default the standard one),
    else the signed URL. Falls back to tensorizer's reader for encrypted artifacts and ones
    without a layout manifest; ``LoadResult.path`` and ``reason`` say which and why.
    ``key``: the node's own key of an encrypted artifact; the registry is then not asked for
    one (the resolve carries ``key_url=false``), so the token needs no ``keys:read``.

    ``options``: tensor_registry.loading.LoadOptions (``verify``, ``readers`` or its older name
    ``connections``, ``register_fraction`` given here override it); unset, the readers come
    from the advice and the pinning from what the node measures (tensor_registry.engine.plan).
    """
    opts = (options or LoadOptions()).given(
        verify=verify, readers=readers or connections, register_fraction=register_fraction
    )
    started = time.perf_counter()
    if key is not None:
        filters.setdefault("key_url", False)
    owned = client is None
    client = client or RegistryClient()
    try:
        if isinstance(model, Resolution):
            resolution = model
        else:
            name, parsed = parse_model_ref(model)
            # What the node is, so the registry's engine advice fits it.
            filters.setdefault("gpu", str(device).startswith("cuda"))
            filters.setdefault("cpu_count", usable_cores())
            resolution = client.resolve(name, ref or parsed, **filters)
        if resolution.params and resolution.expires_within(30.0):
            resolution = client.resolve_again(resolution)
        resolved_s = time.perf_counter() - started
        for attempt in (1, 2):
            try:
                result = _load_resolved(
                    client,
                    resolution,
                    rank=rank,
                    device=device,
                    options=opts,
                    cache=cache if cache is not None else NodeCache(),
                    trusted_keys=trusted_keys,
                    require_signed=require_signed,
                    key=key,
                )
                result.phases["resolve_s"] = resolved_s
                result.model, result.version = resolution.model, resolution.version
                result.artifact_id = resolution.artifact_id
                return result
            except SignatureExpired:
                if attempt == 2 or not resolution.params:
                    raise
                resolution = client.reresolve(resolution)
        raise AssertionError("unreachable")
    finally:
        if owned:
            client.close()


def _advice(resolution: Resolution) -> dict[str, Any]:
    return resolution.engine_advice  # bounded: the answer is unsigned


def _load_resolved(
    client: RegistryClient,
    resolution: Resolution,
    *,
    rank: int,
    device: Any,
    options: LoadOptions,
    cache: NodeCache,
    trusted_keys: list[str] | None = None,
    require_signed: bool | None = None,
    key: bytes | None = None,
) -> LoadResult:
    from tensor_registry.trust import verify_resolution

    t0 = time.perf_counter()
    signed = verify_resolution(client, resolution, trusted=trusted_keys, require=require_signed)
    phases: dict[str, Any] = {"signature": time.perf_counter() - t0}
    signed_by = signed.key_id if signed is not None else None
    marked = time.perf_counter()
    manifest, reason = _layout_or_reason(client, resolution)
    phases["layout"] = time.perf_counter() - marked
    marked = time.perf_counter()
    verify = options.verify
    if manifest is None:
        tensors = _tensorizer_fallback(
            client, resolution, rank, device, options, cache, trusted_keys, require_signed, key
        )
        phases["read"] = time.perf_counter() - marked
        size = sum(f.size for f in resolution.files if f.path == rank_file(resolution, rank))
        return LoadResult(
            tensors=tensors,
            path="tensorizer",
            source="file",
            bytes=size,
            seconds=time.perf_counter() - t0,
            reason=reason,
            device=str(device),
            verified=verify,
            phases=phases,
            signed_by=signed_by,
        )
    file = manifest.file(rank_file(resolution, rank))
    entry = next(f for f in resolution.files if f.path == file.path)
    if entry.sha256 != file.sha256 or entry.size != file.size:
        raise LayoutError("bad_layout", f"the layout manifest describes another {file.path}")
    # A node-cache file serves only the compatibility key it was fetched for (fail closed).
    compatible = cache.contains(
        entry.sha256, entry.size, compatibility_key=resolution.data.get("compatibility_key")
    )
    local = cache.path(entry.sha256) if compatible else None
    tensors = _engine_load(
        file, local, entry.url, _advice(resolution), device=device, options=options, phases=phases
    )
    phases["read"] = time.perf_counter() - marked
    return LoadResult(
        tensors=tensors,
        path="engine",
        source="file" if local is not None else "url",
        bytes=file.size,
        seconds=time.perf_counter() - t0,
        device=str(device),
        verified=verify,
        phases=phases,
        signed_by=signed_by,
    )


def _layout_or_reason(
    client: RegistryClient, resolution: Resolution
) -> tuple[layouts.ArtifactLayout | None, str | None]:
    """The artifact's layout manifest, or why the engine cannot load it."""
    if resolution.encrypted:
        return None, "encrypted artifact: tensorizer decrypts it"
    manifest = fetch_layout(client, resolution)
    if manifest is None:
        return None, "the artifact has no layout manifest (publish or backfill one)"
    return manifest, None


def _tensorizer_fallback(
    client: RegistryClient,
    resolution: Resolution,
    rank: int,
    device: Any,
    options: LoadOptions,
    cache: NodeCache,
    trusted_keys: list[str] | None,
    require_signed: bool | None,
    key: bytes | None = None,
) -> dict[str, Any]:
    # tensorizer checks only its own per-tensor hashes: load_state_dict fetches the file
    # through the node cache first, which keeps a download only if its sha256 is the one
    # the signed manifest binds, so altered bytes fail there, before any tensor.
    tensors = load_state_dict(
        resolution,
        client=client,
        rank=rank,
        device=device,
        options=options,
        cache=cache,
        trusted_keys=trusted_keys,
        require_signed=require_signed,
        key=key,
    )
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
    return tensors


def _engine_load(
    file: FileLayout,
    local: Path | None,
    url: str,
    advice: dict[str, Any],
    *,
    device: Any,
    options: LoadOptions,
    phases: dict[str, Any],
) -> dict[str, Any]:
    """One file by the engine: the node cache's copy when ``local``, else the signed URL;
    the readers and a URL's block the caller did not set come from the resolve answer's
    advice. Whether to pin a node-cache file in place is the node's (the engine measures it:
    tensor_registry.engine.plan), not the registry's: the answer's ``register_fraction`` is
    not read."""
    block_bytes = int(advice.get("block_bytes") or BLOCK_BYTES)
    if str(device).startswith("cuda"):
        return load_cuda(
            file,
            path=local,
            url=None if local is not None else url,
            device=device,
            # The advice's block is a URL's range block; a local file keeps the engine's own.
            options=options.given(
                readers=options.readers or int(advice.get("connections") or 16),
                block_bytes=options.block_bytes or (block_bytes if local is None else None),
            ),
            phases=phases,
        )
    if local is not None:
        return load_file_cpu(local, file, verify=options.verify)
    return load_url_cpu(
        url,
        file,
        verify=options.verify,
        connections=int(options.readers or advice.get("connections") or DEFAULT_CONNECTIONS),
        block_bytes=options.block_bytes or block_bytes,
    )


def copy_into_module(module: Any, tensors: dict[str, Any], *, strict: bool = True) -> Any:
    """Copy loaded tensors into ``module``'s parameters and buffers in place (same names)."""
    import torch

    state = module.state_dict(keep_vars=True)
    missing = [name for name in state if name not in tensors]
    if strict and missing:
        raise RegistryError(
            f"the artifact lacks {len(missing)} of the module's tensors: {missing[:3]}",
            code="tensors_missing",
        )
    with torch.no_grad():
        for name, target in state.items():
            if name in tensors:
                target.data.copy_(tensors[name])
    return module


def result_json(result: LoadResult) -> str:
    return json.dumps(
        {
            "path": result.path,
            "source": result.source,
            "device": result.device,
            "verified": result.verified,
            "bytes": result.bytes,
            "seconds": round(result.seconds, 4),
            "gbps": round(result.gbps, 3),
            "reason": result.reason,
            "signed_by": result.signed_by,
            "tensors": len(result.tensors),
            "phases": phase_seconds(result),
            "engine": {
                k: round(v, 4) if isinstance(v, float) else v
                for k, v in result.phases.items()
                if k not in STEPS
            },
        }
    )


# The steps of a load, in order; with "other" (resolving, bookkeeping) they sum to its seconds.
STEPS = ("signature", "layout", "read")


def phase_seconds(result: LoadResult) -> dict[str, float]:
    """Seconds per step of ``result``, rounded, plus ``other``: what the steps do not cover, so
    the values add up to the rounded ``seconds`` exactly. (The engine's own marks, seconds
    since its start rather than durations, are reported apart.)"""
    steps = {k: round(float(result.phases.get(k, 0.0)), 4) for k in STEPS}
    steps["other"] = round(max(0.0, round(result.seconds, 4) - sum(steps.values())), 4)
    return steps
