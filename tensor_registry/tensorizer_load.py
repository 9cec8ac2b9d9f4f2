"""Load resolved weights with tensorizer, after checking them against the signed manifest.

    from tensor_registry import load_state_dict, load_into_module
    state = load_state_dict("acme/llama:prod", dtype="bfloat16")          # {name: tensor}
    load_into_module(model, "acme/llama:prod", format="hf")             # in place

Fail closed (docs/trust.md): the resolve answer is first checked against the artifact's signed
manifest (signature by a trusted key, this artifact, exactly these files); the rank's file is
then fetched from its signed URL through the node cache (tensor_registry.node_cache), which keeps a
download only when its sha256 is the signed one, and tensorizer reads that verified local copy.
Bytes altered anywhere between storage and the node therefore fail before tensorizer reads one
— even a well-formed tensorizer file whose own per-tensor hashes match. tensorizer still checks
those hashes (``verify_hash``, the registry's advice unless given) and decrypts with the
artifact's key fetched from the signed key URL. If the URLs expired, the client resolves once
more (and checks the new answer again); a missing ``keys:read`` scope and a wrong key each
raise their own error.

tensorizer (and torch) are imported only when loading, so the base client installs without them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tensor_registry.api.client import (
    ChecksumMismatch,
    KeyAccessRequired,
    RegistryClient,
    SignatureExpired,
    WrongKey,
)
from tensor_registry.api.resolution import Resolution, parse_model_ref
from tensor_registry.loading import LoadOptions, rank_file
from tensor_registry.node_cache import NodeCache

if TYPE_CHECKING:
    import torch
    from tensorizer import TensorDeserializer

VLLM_MARKER = ".vllm_tensorized_marker"
# Re-resolve first when the URLs would expire this soon: a load must not start on borrowed time.
EXPIRY_MARGIN_SECONDS = 30.0

T = TypeVar("T")


def resolve(
    model: str,
    ref: str | None = None,
    *,
    client: RegistryClient | None = None,
    url: str | None = None,
    token: str | None = None,
    **filters: Any,
) -> Resolution:
    """GET /api/v1/resolve. ``model`` may carry the ref: ``"acme/llama:prod"``."""
    name, parsed_ref = parse_model_ref(model)
    owned = client is None
    client = client or RegistryClient(url, token)
    try:
        return client.resolve(name, ref or parsed_ref, **filters)
    finally:
        if owned:
            client.close()


def _skip_marker(name: str) -> bool:
    return name != VLLM_MARKER


def _fetch_verified(
    client: RegistryClient, resolution: Resolution, rank: int, cache: NodeCache
) -> Path:
    """Rank ``rank``'s file in the node cache. A download is kept only when it hashes to the
    sha256 of the resolve answer, which ``verify_resolution`` bound to the signed manifest."""
    path = rank_file(resolution, rank)
    entry = next(f for f in resolution.files if f.path == path)
    try:
        fetched, _ = cache.fetch(
            entry.url,
            sha256=entry.sha256,
            size=entry.size,
            compatibility_key=resolution.data.get("compatibility_key"),
        )
    except ChecksumMismatch as exc:
        raise ChecksumMismatch(
            f"artifact {resolution.artifact_id}: the bytes served for {path} are not the "
            f"signed ones ({exc}); nothing was loaded",
            status=None,
        ) from exc
    return fetched


def _open(
    client: RegistryClient,
    resolution: Resolution,
    path: Path,
    *,
    device: Any,
    dtype: Any,
    num_readers: int | None,
    verify_hash: bool | None,
    key: bytes | None = None,
) -> TensorDeserializer:
    from tensorizer import DecryptionParams, TensorDeserializer

    encryption = None
    if resolution.encrypted and key is not None:
        # The node's own key (--keyfile): the registry was not asked for it.
        encryption = DecryptionParams.from_key(key)
    elif resolution.encrypted:
        if not resolution.encryption_key_url:
            raise KeyAccessRequired(
                f"artifact {resolution.artifact_id} is encrypted and this token may not read "
                "its key",
                status=403,
            )
        encryption = DecryptionParams.from_key(client.fetch_key(resolution.encryption_key_url))
    return TensorDeserializer(
        str(path),
        device=device,
        dtype=_torch_dtype(dtype),
        filter_func=_skip_marker,
        num_readers=num_readers if num_readers is not None else resolution.num_readers,
        verify_hash=resolution.verify_hash if verify_hash is None else verify_hash,
        encryption=encryption,
    )


def _from_options(
    options: LoadOptions | None, num_readers: int | None, verify_hash: bool | None
) -> tuple[int | None, bool | None]:
    """tensorizer's ``num_readers`` and ``verify_hash``: the keywords given, else the options'
    ``readers`` and ``verify``, else (None) the resolve answer's advice."""
    if options is None:
        return num_readers, verify_hash
    return (
        num_readers if num_readers is not None else options.readers,
        verify_hash if verify_hash is not None else options.verify,
    )


def _torch_dtype(dtype: Any) -> Any:
    if dtype is None or not isinstance(dtype, str):
        return dtype
    import torch

    found = getattr(torch, dtype, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r}")
    return found


class _Load:
    """One load: the client, its verified resolve answer, and how to check a fresh one."""

    def __init__(
        self,
        model: str | Resolution,
        ref: str | None,
        client: RegistryClient | None,
        filters: dict[str, Any],
        *,
        trusted_keys: Iterable[str] | None,
        require_signed: bool | None,
    ) -> None:
        self.owned = client is None
        self.client = client or RegistryClient()
        self.trusted = list(trusted_keys) if trusted_keys is not None else None
        self.require = require_signed
        try:
            if isinstance(model, Resolution):
                resolution = model
            else:
                name, parsed_ref = parse_model_ref(model)
                resolution = self.client.resolve(name, ref or parsed_ref, **filters)
            if resolution.params and resolution.expires_within(EXPIRY_MARGIN_SECONDS):
                resolution = self.client.resolve_again(resolution)
            self.resolution = self.verified(resolution)
        except BaseException:
            self.close()
            raise

    def verified(self, resolution: Resolution) -> Resolution:
        from tensor_registry.trust import verify_resolution

        verify_resolution(self.client, resolution, trusted=self.trusted, require=self.require)
        return resolution

    def close(self) -> None:
        if self.owned:
            self.client.close()

    def run(self, work: Callable[[Resolution], T]) -> T:
        """Run ``work``; on an expired URL resolve once more, check the new answer and run it
        again. Map tensorizer's errors to the client's."""
        from tensorizer import CryptographyError
        from tensorizer.serialization import HashMismatchError

        resolution = self.resolution
        try:
            for attempt in (1, 2):
                try:
                    return work(resolution)
                except SignatureExpired:
                    if attempt == 2 or not resolution.params:
                        raise
                    resolution = self.verified(self.client.reresolve(resolution))
                except CryptographyError as exc:
                    if "not requested" in str(exc):
                        raise KeyAccessRequired(str(exc), status=None) from exc
                    raise WrongKey(
                        f"artifact {resolution.artifact_id} does not decrypt with the key "
                        f"({exc}); the key or the stored bytes are wrong",
                        status=None,
                    ) from exc
                except HashMismatchError as exc:
                    raise ChecksumMismatch(
                        f"artifact {resolution.artifact_id}: a tensor failed hash verification "
                        f"({exc})",
                        status=None,
                    ) from exc
            raise AssertionError("unreachable")
        finally:
            self.close()


def load_state_dict(
    model: str | Resolution,
    ref: str | None = None,
    *,
    client: RegistryClient | None = None,
    rank: int = 0,
    device: str | torch.device | None = "cpu",
    cast_to: str | torch.dtype | None = None,
    num_readers: int | None = None,
    verify_hash: bool | None = None,
    cache: NodeCache | None = None,
    trusted_keys: Iterable[str] | None = None,
    require_signed: bool | None = None,
    key: bytes | None = None,
    options: LoadOptions | None = None,
    **filters: Any,
) -> dict[str, torch.Tensor]:
    """Every tensor of the resolved artifact (rank ``rank`` when tensor-parallel) by name.

    ``model`` is ``"ns/name[:ref]"`` or a Resolution. ``filters`` choose the artifact as in
    resolve (``dtype=``, ``format=``, ``tensor_parallel_size=``, ``encrypted=``, ``ttl=``…);
    ``cast_to`` converts on load instead. The answer is checked against the signed manifest
    (``trusted_keys`` and ``require_signed`` as in tensor_registry.trust.verify_resolution), the
    file is fetched through ``cache`` (default: the standard node cache) and kept only if its
    sha256 is the signed one, then tensorizer reads it; any failure raises and returns nothing.
    (tensor_registry.engine falls back to this for encrypted artifacts and ones without a layout.)
    ``key``: the node's own key of an encrypted artifact (then resolve with ``key_url=False``:
    the registry is not asked for it). ``options`` (tensor_registry.loading.LoadOptions, the
    engine's type): its ``readers`` and ``verify`` stand for ``num_readers`` and
    ``verify_hash`` where those are not given.
    """
    num_readers, verify_hash = _from_options(options, num_readers, verify_hash)
    load = _Load(
        model, ref, client, filters, trusted_keys=trusted_keys, require_signed=require_signed
    )
    nodes = cache if cache is not None else NodeCache()

    def work(current: Resolution) -> dict[str, torch.Tensor]:
        path = _fetch_verified(load.client, current, rank, nodes)
        deserializer = _open(
            load.client,
            current,
            path,
            device=device,
            dtype=cast_to,
            num_readers=num_readers,
            verify_hash=verify_hash,
            key=key,
        )
        try:
            return dict(deserializer.items())
        finally:
            deserializer.close()

    return load.run(work)


def load_into_module(
    module: torch.nn.Module,
    model: str | Resolution,
    ref: str | None = None,
    *,
    client: RegistryClient | None = None,
    rank: int = 0,
    device: str | torch.device | None = None,
    num_readers: int | None = None,
    verify_hash: bool | None = None,
    cache: NodeCache | None = None,
    trusted_keys: Iterable[str] | None = None,
    require_signed: bool | None = None,
    key: bytes | None = None,
    options: LoadOptions | None = None,
    **filters: Any,
) -> torch.nn.Module:
    """Load the resolved artifact into ``module`` in place (its parameter names must match:
    an ``hf``-format artifact for a transformers model), checked as in load_state_dict first.
    ``device`` defaults to the module's; ``options`` as in load_state_dict."""
    num_readers, verify_hash = _from_options(options, num_readers, verify_hash)
    if device is None:
        first = next(module.parameters(), None)
        device = first.device if first is not None else "cpu"
    load = _Load(
        model, ref, client, filters, trusted_keys=trusted_keys, require_signed=require_signed
    )
    nodes = cache if cache is not None else NodeCache()

    def work(current: Resolution) -> torch.nn.Module:
        deserializer = _open(
            load.client,
            current,
            _fetch_verified(load.client, current, rank, nodes),
            device=device,
            dtype=None,
            num_readers=num_readers,
            verify_hash=verify_hash,
            key=key,
        )
        try:
            deserializer.load_into_module(module)
        finally:
            deserializer.close()
        return module

    return load.run(work)
