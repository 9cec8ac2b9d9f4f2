"""Load resolved weights straight from their signed URLs with tensorizer.

    from app.client import load_state_dict, load_into_module
    state = load_state_dict("acme/llama:prod", dtype="bfloat16")          # {name: tensor}
    load_into_module(model, "acme/llama:prod", format="hf")             # in place

tensorizer streams the file over HTTP with ``num_readers`` parallel range readers (the
registry's advice unless given), checks every tensor's hash (``verify_hash``, on unless turned
off) and decrypts with the artifact's key fetched from the signed key URL. If the URLs expired
before the load started, the client resolves once more and retries; an altered URL, a missing
``keys:read`` scope and a wrong key each raise their own error.

tensorizer (and torch) are imported only when loading, so the base client installs without them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from app.client.api import (
    ChecksumMismatch,
    KeyAccessRequired,
    RegistryClient,
    RegistryError,
    Resolution,
    SignatureExpired,
    WrongKey,
    parse_model_ref,
)

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


def _open(
    client: RegistryClient,
    resolution: Resolution,
    *,
    rank: int,
    device: Any,
    dtype: Any,
    num_readers: int | None,
    verify_hash: bool | None,
    transport: str,
    local_file: Path | None = None,
) -> TensorDeserializer:
    from tensorizer import DecryptionParams, TensorDeserializer

    encryption = None
    if resolution.encrypted:
        if not resolution.encryption_key_url:
            raise KeyAccessRequired(
                f"artifact {resolution.artifact_id} is encrypted and this token may not read "
                "its key",
                status=403,
            )
        encryption = DecryptionParams.from_key(client.fetch_key(resolution.encryption_key_url))
    uri = resolution.rank_uri(rank)
    source: Any = uri
    if local_file is not None:
        source = str(local_file)  # already fetched and sha256-checked (app.client.engine)
    elif transport == "python":
        from app.client.transport import HTTPRangeStream

        source = HTTPRangeStream(uri)
    elif transport != "curl":
        raise ValueError(f"transport must be 'python' or 'curl', not {transport!r}")
    return TensorDeserializer(
        source,
        device=device,
        dtype=_torch_dtype(dtype),
        filter_func=_skip_marker,
        num_readers=num_readers if num_readers is not None else resolution.num_readers,
        verify_hash=resolution.verify_hash if verify_hash is None else verify_hash,
        encryption=encryption,
    )


def _torch_dtype(dtype: Any) -> Any:
    if dtype is None or not isinstance(dtype, str):
        return dtype
    import torch

    found = getattr(torch, dtype, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"unknown torch dtype {dtype!r}")
    return found


def _with_fresh_urls(
    client: RegistryClient, resolution: Resolution, rank: int, work: Callable[[Resolution], T]
) -> T:
    """Run ``work``; on an expired URL resolve once more and run it again. Map tensorizer's
    errors to the client's."""
    from tensorizer import CryptographyError
    from tensorizer.serialization import HashMismatchError

    if resolution.params and resolution.expires_within(EXPIRY_MARGIN_SECONDS):
        resolution = client.reresolve(resolution)
    for attempt in (1, 2):
        try:
            return work(resolution)
        except CryptographyError as exc:
            if "not requested" in str(exc):
                raise KeyAccessRequired(str(exc), status=None) from exc
            raise WrongKey(
                f"artifact {resolution.artifact_id} does not decrypt with the key from the "
                f"registry ({exc}); the key or the stored bytes are wrong",
                status=None,
            ) from exc
        except HashMismatchError as exc:
            raise ChecksumMismatch(
                f"artifact {resolution.artifact_id}: a tensor failed hash verification ({exc})",
                status=None,
            ) from exc
        except (OSError, RuntimeError) as exc:
            # tensorizer reports HTTP failures as curl errors; ask the URL what it was.
            try:
                client.probe(resolution.rank_uri(rank))
            except SignatureExpired:
                if attempt == 1 and resolution.params:
                    resolution = client.reresolve(resolution)
                    continue
                raise
            except RegistryError as err:
                raise err from exc
            raise
    raise AssertionError("unreachable")


def _prepare(
    model: str | Resolution, ref: str | None, client: RegistryClient | None, filters: dict[str, Any]
) -> tuple[RegistryClient, bool, Resolution]:
    from app.client.trust import verify_resolution

    owned = client is None
    client = client or RegistryClient()
    try:
        if isinstance(model, Resolution):
            resolution = model
        else:
            name, parsed_ref = parse_model_ref(model)
            resolution = client.resolve(name, ref or parsed_ref, **filters)
        # The signed manifest binds the answer's files (docs/trust.md); tensorizer's reader
        # checks the streamed bytes only against the file's own hashes.
        verify_resolution(client, resolution)
        return client, owned, resolution
    except BaseException:
        if owned:
            client.close()
        raise


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
    transport: str = "python",
    local_file: Path | None = None,
    **filters: Any,
) -> dict[str, torch.Tensor]:
    """Every tensor of the resolved artifact (rank ``rank`` when tensor-parallel) by name.

    ``model`` is ``"ns/name[:ref]"`` or a Resolution. ``filters`` choose the artifact as in
    resolve (``dtype=``, ``format=``, ``tensor_parallel_size=``, ``encrypted=``, ``ttl=``…);
    ``cast_to`` converts on load instead. ``transport="python"`` (the default) reads the URL
    in process (app.client.transport); ``"curl"`` uses tensorizer's own curl reader, as vLLM
    does. ``local_file`` reads rank ``rank``'s file from that path instead of its URL (the
    caller checked its sha256 against the resolve answer).
    """
    client, owned, resolution = _prepare(model, ref, client, filters)

    def work(current: Resolution) -> dict[str, torch.Tensor]:
        deserializer = _open(
            client,
            current,
            rank=rank,
            device=device,
            dtype=cast_to,
            num_readers=num_readers,
            verify_hash=verify_hash,
            transport=transport,
            local_file=local_file,
        )
        try:
            return dict(deserializer.items())
        finally:
            deserializer.close()

    try:
        return _with_fresh_urls(client, resolution, rank, work)
    finally:
        if owned:
            client.close()


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
    transport: str = "python",
    **filters: Any,
) -> torch.nn.Module:
    """Load the resolved artifact into ``module`` in place (its parameter names must match:
    an ``hf``-format artifact for a transformers model). ``device`` defaults to the module's."""
    if device is None:
        first = next(module.parameters(), None)
        device = first.device if first is not None else "cpu"
    client, owned, resolution = _prepare(model, ref, client, filters)

    def work(current: Resolution) -> torch.nn.Module:
        deserializer = _open(
            client,
            current,
            rank=rank,
            device=device,
            dtype=None,
            num_readers=num_readers,
            verify_hash=verify_hash,
            transport=transport,
        )
        try:
            deserializer.load_into_module(module)
        finally:
            deserializer.close()
        return module

    try:
        return _with_fresh_urls(client, resolution, rank, work)
    finally:
        if owned:
            client.close()
