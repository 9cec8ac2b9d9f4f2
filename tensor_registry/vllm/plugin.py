"""vLLM model-loader plugin: ``--load-format tensor-registry`` loads through the load engine.

vLLM runs every ``vllm.general_plugins`` entry point in each of its processes (API server and
every tensor-parallel worker) before it builds a model; ours, :func:`register`, adds
:data:`LOAD_FORMAT` to vLLM's table of load formats (``register_model_loader``). Then::

    vllm serve MODEL_DIR --load-format tensor-registry \\
        --model-loader-extra-config '{"model": "acme/llama:prod"}'

builds the model from MODEL_DIR's config.json as usual and, in each rank's process, resolves
the artifact, loads that rank's file with :func:`tensor_registry.engine.load_artifact` onto the
device vLLM built the model on, and fills the model:

- ``vllm`` format (tensorizer's vLLM layout: vLLM's own parameter names, already fused and
  sharded per rank): copied into the model's parameters and buffers in place; names and shapes
  must match exactly.
- ``hf`` format (the Hugging Face state dict, one file): handed to ``model.load_weights(...)``,
  the model's own weight loader, which fuses and shards for the rank — what vLLM's default
  loader does with safetensors files.

vLLM logs its load config, extra config included, so no secret may travel in it: the token
comes from ``TENSOR_REGISTRY_TOKEN`` or the ``login`` file (tensor_registry.config), and an extra
config carrying a ``token`` (or a URL with user info) is refused before anything is sent.

vLLM and torch are imported only when vLLM calls us: the light client never needs them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tensor_registry import checkins
from tensor_registry.api.client import (
    InvalidRequest,
    NoMatchingArtifact,
    RegistryClient,
    RegistryError,
)
from tensor_registry.api.resolution import Resolution, parse_model_ref

LOAD_FORMAT = "tensor-registry"
CONFIG_CODE = "invalid_loader_config"

# Every key the extra config may hold; anything else is refused (a typo must not be ignored).
EXTRA_CONFIG_KEYS = {"model", "url", "dtype", "format", "verify", "cache_dir", "checkin"}
# Keys someone might try for credentials: refused with a pointer to where the token belongs.
SECRET_KEYS = {"token", "api_token", "api_key", "authorization", "password", "secret"}

log = logging.getLogger("tensor_registry.vllm")

_registered: type | None = None
_lock = threading.Lock()


@dataclass(frozen=True)
class LoaderOptions:
    """What ``--model-loader-extra-config`` says (never a secret)."""

    model: str
    ref: str
    url: str | None = None
    dtype: str | None = None
    format: str | None = None
    verify: bool = True
    cache_dir: Path | None = None
    # Check in each rank's load (tensor_registry/checkins.py); also TENSOR_REGISTRY_NO_CHECKIN.
    checkin: bool = True


def _invalid(detail: str) -> InvalidRequest:
    return InvalidRequest(detail, code=CONFIG_CODE, status=None)


def parse_extra_config(extra: Mapping[str, Any] | str | None) -> LoaderOptions:
    """Check ``--model-loader-extra-config``: ``model`` required, known keys only, no secrets."""
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except ValueError:
            raise _invalid("--model-loader-extra-config is not JSON") from None
    if not isinstance(extra, Mapping) or not extra:
        raise _invalid(
            f"--load-format {LOAD_FORMAT} needs --model-loader-extra-config "
            '\'{"model": "NAMESPACE/NAME[:REF]"}\''
        )
    secrets = sorted(k for k in extra if str(k).lower() in SECRET_KEYS)
    if secrets:
        raise _invalid(
            f"--model-loader-extra-config must not carry credentials ({', '.join(secrets)}): "
            "vLLM logs it. Set TENSOR_REGISTRY_TOKEN or run `tensor-registry login` instead."
        )
    unknown = sorted(str(k) for k in extra if k not in EXTRA_CONFIG_KEYS)
    if unknown:
        raise _invalid(
            f"unknown --model-loader-extra-config keys {unknown}; "
            f"known: {sorted(EXTRA_CONFIG_KEYS)}"
        )
    model = extra.get("model")
    if not isinstance(model, str) or len(model) > 512:
        raise _invalid('"model" must be a string NAMESPACE/NAME[:REF]')
    try:
        name, ref = parse_model_ref(model)
    except InvalidRequest as exc:
        raise _invalid(exc.detail) from None
    url = extra.get("url")
    if url is not None:
        if not isinstance(url, str) or len(url) > 2048:
            raise _invalid('"url" must be the registry URL, a string')
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _invalid('"url" must be an http(s) URL of the registry')
        if parts.username is not None or parts.password is not None:
            raise _invalid('"url" must not carry credentials: vLLM logs it')
        if parts.query:
            raise _invalid('"url" must not carry a query string')
    for key in ("dtype", "format"):
        value = extra.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > 32):
            raise _invalid(f'"{key}" must be a short string')
    if extra.get("format") not in (None, "hf", "vllm"):
        raise _invalid('"format" must be "hf" or "vllm"')
    verify = extra.get("verify", True)
    if not isinstance(verify, bool):
        raise _invalid('"verify" must be true or false')
    checkin = extra.get("checkin", True)
    if not isinstance(checkin, bool):
        raise _invalid('"checkin" must be true or false')
    cache_dir = extra.get("cache_dir")
    if cache_dir is not None and (not isinstance(cache_dir, str) or len(cache_dir) > 4096):
        raise _invalid('"cache_dir" must be a path')
    return LoaderOptions(
        model=name,
        ref=ref,
        url=url,
        dtype=extra.get("dtype"),
        format=extra.get("format"),
        verify=verify,
        cache_dir=Path(cache_dir) if cache_dir else None,
        checkin=checkin,
    )


def extra_config_for(resolution: Resolution, *, url: str | None = None) -> dict[str, Any]:
    """The extra config that makes every rank resolve ``resolution``'s artifact: the version
    number (an alias could move between two ranks' resolves), its dtype and format."""
    artifact = resolution.artifact
    extra: dict[str, Any] = {
        "model": f"{resolution.model}:{resolution.version}",
        "dtype": artifact["dtype"],
        "format": artifact["format"],
    }
    if url:
        extra["url"] = url
    return extra


def vllm_args(resolution: Resolution, *, url: str | None = None) -> list[str]:
    """``vllm serve`` arguments that load ``resolution``'s artifact through this plugin."""
    args = [
        "--load-format",
        LOAD_FORMAT,
        "--model-loader-extra-config",
        json.dumps(extra_config_for(resolution, url=url), separators=(",", ":")),
    ]
    if resolution.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(resolution.tensor_parallel_size)]
    args += ["--dtype", str(resolution.artifact["dtype"])]
    return args


class SignedURLFilter(logging.Filter):
    """Cuts the query off signed URLs in log records (httpx logs every request's URL at INFO;
    a vLLM deployment that logs the root logger at INFO would write signatures, the key URL's
    among them, into its logs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_without_signature(arg) for arg in record.args)
        record.msg = _without_signature(record.msg)
        return True


def _without_signature(value: Any) -> Any:
    if isinstance(value, str):
        text = value
    elif hasattr(value, "query"):  # an httpx.URL
        text = str(value)
    else:
        return value
    if "sig=" not in text:
        return value
    return " ".join(
        word.split("?", 1)[0] + "?…" if "sig=" in word else word for word in text.split(" ")
    )


_SIGNED_URL_FILTER = SignedURLFilter()


def _quiet_signed_urls() -> None:
    for name in ("httpx", "httpcore", "tensorizer"):
        logging.getLogger(name).addFilter(_SIGNED_URL_FILTER)  # no-op when already there


def _client(options: LoaderOptions) -> RegistryClient:
    from tensor_registry.config import connection

    # Token: TENSOR_REGISTRY_TOKEN, else the `login` file; never the (logged) extra config.
    _quiet_signed_urls()
    found = connection(options.url, None)
    return RegistryClient(found.url, found.token)


def _dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def resolve_for_rank(
    client: RegistryClient,
    options: LoaderOptions,
    *,
    world_size: int | None,
    dtype: str | None,
    gpu: bool,
) -> Resolution:
    """The artifact for a ``world_size``-way vLLM: a ``vllm``-format one with exactly that many
    rank files, else (no format asked) an ``hf`` one, which every rank loads whole.
    ``world_size`` None (not known yet): the newest of the asked format, any size."""
    from tensor_registry.engine.cpu import usable_cores

    common = {"dtype": options.dtype or dtype, "gpu": gpu, "cpu_count": usable_cores()}
    tries: list[tuple[str | None, int | None]]
    if world_size is None:
        tries = [(options.format, None)]
    elif options.format == "hf":
        tries = [("hf", 1)]
    elif options.format == "vllm":
        tries = [("vllm", world_size)]
    else:
        tries = [("vllm", world_size), ("hf", 1)]
    for index, (fmt, tp) in enumerate(tries):
        try:
            resolution = client.resolve(
                options.model, options.ref, format=fmt, tensor_parallel_size=tp, **common
            )
        except NoMatchingArtifact:
            if index == len(tries) - 1:
                raise
            continue
        return resolution
    raise AssertionError("unreachable")


def copy_in_place(model: Any, tensors: Mapping[str, Any]) -> int:
    """Copy ``tensors`` into ``model``'s parameters and buffers of the same names, in place.
    The names and shapes must match exactly both ways (a vllm-format file is the model)."""
    import torch

    targets = dict(model.named_parameters())
    targets.update(model.named_buffers())
    missing = sorted(set(targets) - set(tensors))
    unexpected = sorted(set(tensors) - set(targets))
    if missing or unexpected:
        raise RegistryError(
            f"the artifact's tensors are not this model's parameters: missing {missing[:3]} "
            f"({len(missing)}), unexpected {unexpected[:3]} ({len(unexpected)}); was it "
            "serialized for this architecture and tensor-parallel size?",
            code="tensors_mismatch",
        )
    with torch.no_grad():
        for name, target in targets.items():
            source = tensors[name]
            if tuple(source.shape) != tuple(target.shape):
                raise RegistryError(
                    f"{name}: the artifact has shape {tuple(source.shape)}, the model "
                    f"{tuple(target.shape)}",
                    code="tensors_mismatch",
                )
            target.copy_(source)
    return len(targets)


def load_hf_weights(model: Any, tensors: Mapping[str, Any], *, quantized: bool) -> None:
    """Hand Hugging Face-named tensors to the model's own ``load_weights``; like vLLM's default
    loader, a model that reports what it loaded must have loaded every parameter."""
    loaded = model.load_weights(iter(tensors.items()))
    if loaded is None or quantized:
        return
    filled = set(loaded)
    left = sorted(name for name, _ in model.named_parameters() if name not in filled)
    if left:
        raise RegistryError(
            f"the artifact did not fill {len(left)} of the model's parameters: {left[:3]}",
            code="tensors_missing",
        )


def _model_device(model: Any) -> Any:
    for tensor in model.parameters():
        return tensor.device
    for tensor in model.buffers():
        return tensor.device
    return "cpu"


def load_into_vllm_model(model: Any, model_config: Any, options: LoaderOptions) -> dict[str, Any]:
    """Resolve, load this rank's file with the engine and fill ``model``, then check in what
    happened (or why it failed: the failure is raised all the same); returns the summary
    (for vLLM's log: never a URL or a token)."""
    from vllm.distributed import get_tensor_model_parallel_rank

    started = time.perf_counter()
    rank = int(get_tensor_model_parallel_rank())
    with _client(options) as client:
        try:
            summary = _load_rank(client, model, model_config, options)
        except Exception as exc:
            _check_in(client, options, {"rank": rank}, time.perf_counter() - started, str(exc))
            raise
        _check_in(client, options, summary, time.perf_counter() - started, None)
    log.info("tensor-registry: loaded %s", json.dumps(summary))
    return summary


def _check_in(
    client: RegistryClient,
    options: LoaderOptions,
    summary: dict[str, Any],
    seconds: float,
    error: str | None,
) -> None:
    from tensor_registry.node_cache import NodeCache

    if not options.checkin:
        return
    entry = checkins.load_entry(
        by="vllm",
        model=str(summary.get("model") or options.model),
        ref=options.ref,
        artifact_id=summary.get("artifact"),
        version=summary.get("version"),
        path=str(summary.get("path") or "none"),
        seconds=seconds,
        gbps=summary.get("gbps"),
        verified=bool(summary.get("verified")),
        rank=summary.get("rank"),
        error=error,
    )
    cache = NodeCache(options.cache_dir)
    checkins.report(client, cache.root, entry, cached=cache.artifacts(), say=log.warning)


def _load_rank(
    client: RegistryClient, model: Any, model_config: Any, options: LoaderOptions
) -> dict[str, Any]:
    """This rank's file, resolved, loaded by the engine and copied into ``model``."""
    from vllm.distributed import (
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    from tensor_registry.engine import load_artifact
    from tensor_registry.node_cache import NodeCache

    rank = int(get_tensor_model_parallel_rank())
    world_size = int(get_tensor_model_parallel_world_size())
    device = _model_device(model)
    resolution = resolve_for_rank(
        client,
        options,
        world_size=world_size,
        dtype=_dtype_name(getattr(model_config, "dtype", None)),
        gpu=str(device).startswith("cuda"),
    )
    artifact = resolution.artifact
    fmt = str(artifact["format"])
    tp = resolution.tensor_parallel_size
    quantized = getattr(model_config, "quantization", None) is not None
    if fmt == "vllm" and quantized:
        # A vllm-format file holds weights vLLM had already post-processed (repacked for
        # the quantization kernel); vLLM's own tensorizer loader skips post-processing
        # for them, the inherited load_model here would run it a second time.
        raise RegistryError(
            "vllm-format artifacts of quantized models are not loaded by this plugin; "
            "use --load-format tensorizer (tensor-registry vllm-args) for them",
            code="unsupported_artifact",
        )
    if (fmt == "vllm" and tp != world_size) or (fmt == "hf" and tp != 1):
        raise RegistryError(
            f"artifact {resolution.artifact_id} is {fmt}/tp{tp}; a {world_size}-way vLLM "
            "needs a vllm-format artifact with as many ranks, or an hf one",
            code="tensor_parallel_mismatch",
        )
    result = load_artifact(
        resolution,
        client=client,
        rank=rank if fmt == "vllm" else 0,
        device=device,
        verify=options.verify,
        cache=NodeCache(options.cache_dir) if options.cache_dir else None,
    )
    if fmt == "vllm":
        copy_in_place(model, result.tensors)
    else:
        load_hf_weights(model, result.tensors, quantized=quantized)
    # The engine's allocation holds the rank's weights a second time: give it back now,
    # before vLLM measures free memory for its KV cache.
    result.tensors.clear()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    summary = {
        "model": resolution.model,
        "version": resolution.version,
        "artifact": resolution.artifact_id,
        "format": fmt,
        "rank": rank,
        "path": result.path,
        "source": result.source,
        "verified": result.verified,
        "bytes": result.bytes,
        "gbps": round(result.gbps, 3),
        "reason": result.reason,
    }
    return summary


def prefetch(options: LoaderOptions, *, world_size: int | None, dtype: str | None) -> int:
    """Bring the artifact's weight files into the node cache; returns the bytes downloaded."""
    from tensor_registry.node_cache import NodeCache

    cache = NodeCache(options.cache_dir) if options.cache_dir else NodeCache()
    downloaded = 0
    with _client(options) as client:
        resolution = resolve_for_rank(
            client, options, world_size=world_size, dtype=dtype, gpu=False
        )
        # Recorded under the answer's compatibility key, the one the engine's reuse checks.
        compatibility = resolution.data.get("compatibility_key")
        for entry in resolution.files:
            if entry.is_weights and not cache.contains(
                entry.sha256, entry.size, compatibility_key=compatibility
            ):
                cache.fetch(
                    entry.url,
                    sha256=entry.sha256,
                    size=entry.size,
                    compatibility_key=compatibility,
                )
                downloaded += entry.size
        weights = [(f.sha256, f.size) for f in resolution.files if f.is_weights]
        cache.record_artifact(resolution.artifact_id, weights)
    return downloaded


def loader_class() -> type:
    """The ``BaseModelLoader`` subclass (built on first use: vLLM is imported only here)."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class TensorRegistryLoader(BaseModelLoader):
        """``--load-format tensor-registry``: weights from the registry through the engine."""

        def __init__(self, load_config: Any) -> None:
            super().__init__(load_config)
            # Checked at construction, so a bad config fails before the model is built.
            self.options = parse_extra_config(
                getattr(load_config, "model_loader_extra_config", None)
            )

        def download_model(self, model_config: Any) -> None:
            from vllm.distributed import get_tensor_model_parallel_world_size

            world_size: int | None
            try:
                world_size = int(get_tensor_model_parallel_world_size())
            except (AssertionError, RuntimeError):  # no parallel group in this process yet
                world_size = None
            prefetch(
                self.options,
                world_size=world_size,
                dtype=_dtype_name(getattr(model_config, "dtype", None)),
            )

        def load_weights(self, model: Any, model_config: Any) -> None:
            load_into_vllm_model(model, model_config, self.options)

    TensorRegistryLoader.__module__ = __name__
    TensorRegistryLoader.__qualname__ = "TensorRegistryLoader"
    return TensorRegistryLoader


def register() -> None:
    """The ``vllm.general_plugins`` entry point: add :data:`LOAD_FORMAT` to vLLM's loaders.
    vLLM may call it more than once per process; only the first call registers."""
    global _registered
    with _lock:
        if _registered is not None:
            return
        from vllm.model_executor.model_loader import register_model_loader

        cls = loader_class()
        register_model_loader(LOAD_FORMAT)(cls)
        _registered = cls
