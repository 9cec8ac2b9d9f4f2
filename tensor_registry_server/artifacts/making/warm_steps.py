"""Making a warm bundle (the worker's side of a warm job; docs/warm-state.md).

Steps, each a function here so the job handler
(tensor_registry_server/jobs/artifacts/making/warm_job.py)
stays glue:

1. ``lay_out_model``: the artifact's config and tokenizer files (no weights) at
   ``WARM_MODEL_ROOT/<artifact id>``: vLLM hashes the model string it is given, so the path is
   part of the key and is recorded;
2. ``serve_once``: `vllm serve` that path with ``--load-format dummy`` (compilation depends on the
   model's config, dtype, parallelism and the serve arguments, never on weight values: no weights
   are read and no key is needed), ``VLLM_CACHE_ROOT`` a fresh directory, the artifact's dtype
   and tensor-parallel size and the requested serve arguments; wait for ``/health``, send one
   completion (what makes vLLM compile and capture everything it would for a first request),
   then stop its whole process group. Its environment carries none of the registry's settings
   (SECURITY.md rule 5);
3. ``pack_into``: the cache root's ``torch_compile_cache`` as a tar into storage
   (tensor_registry/formats/warm_bundle.py), bounded by ``worker.warm_max_bundle_bytes``;
4. ``warm_key``: the key parts, read from this worker's installed packages and GPU.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import httpx

from tensor_registry.formats.paths import check_relative_path
from tensor_registry.formats.warm import WarmKey
from tensor_registry.formats.warm_bundle import Packed, gpu_capability, installed_version, pack
from tensor_registry_server.storage.base import Storage

SERVED_NAME = "warm"
# Files of an artifact that vLLM does not need to build the model with dummy weights.
WEIGHT_SUFFIXES = (".tensors", ".safetensors", ".bin")
SKIPPED_FILES = {"manifest.sig.json", "model.sig", "layout.json"}
MAX_LOG_BYTES = 4 << 20
# Environment a vLLM child never gets: the registry's settings and storage credentials.
_PRIVATE_ENV = ("TENSOR_REGISTRY_", "AWS_", "REDIS_", "DATABASE_")


class WarmMakingError(Exception):
    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


def model_dir(root: Path, artifact_id: object) -> Path:
    return root / str(artifact_id)


def lay_out_model(storage: Storage, files: Iterable[tuple[str, str]], dest: Path) -> list[str]:
    """Copy the non-weight files (path, storage key) of an artifact to ``dest`` (made afresh)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    copied = []
    for path, key in files:
        if path in SKIPPED_FILES or path.endswith(WEIGHT_SUFFIXES):
            continue
        if check_relative_path(path) is not None or "/" in path:
            continue  # flat files only, as vLLM expects them
        with storage.open_source(key) as source, (dest / path).open("wb") as out:
            shutil.copyfileobj(source, out, 1 << 20)
        copied.append(path)
    if "config.json" not in copied:
        raise WarmMakingError("no_config", "the artifact has no config.json for vLLM to build")
    return copied


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _vllm_command() -> list[str]:
    script = Path(sys.executable).with_name("vllm")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def child_env(cache_root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_ENV)}
    env["VLLM_CACHE_ROOT"] = str(cache_root)
    return env


def _tail(path: Path, limit: int = MAX_LOG_BYTES) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - limit))
        return fh.read().decode("utf-8", "replace")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue


def serve_once(
    model: Path,
    *,
    cache_root: Path,
    dtype: str,
    tensor_parallel_size: int,
    serve_args: list[str],
    log_path: Path,
    timeout: float,
    check: Callable[[str], None],
) -> str:
    """Start vLLM, wait until it serves, send one completion, stop it; vLLM's log (its tail).
    ``check(stage)`` is called while waiting (the job's cancel check: it raises to stop)."""
    port = _free_port()
    cmd = [
        *_vllm_command(),
        "serve",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--load-format",
        "dummy",
        "--served-model-name",
        SERVED_NAME,
        *serve_args,
    ]
    cache_root.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(cache_root),
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise WarmMakingError(
                    "vllm_failed",
                    f"vLLM exited with {proc.returncode} before serving: "
                    + _tail(log_path, 2000).strip()[-1500:],
                )
            if time.monotonic() > deadline:
                raise WarmMakingError("vllm_timeout", f"vLLM did not serve within {timeout:.0f}s")
            check("start")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        check("request")
        answer = httpx.post(
            f"{base}/v1/completions",
            json={"model": SERVED_NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0},
            timeout=max(60.0, deadline - time.monotonic()),
        )
        if answer.status_code != 200:
            raise WarmMakingError(
                "vllm_failed",
                f"vLLM answered the request with {answer.status_code}: {answer.text[:500]}",
            )
    finally:
        _stop(proc)
    return _tail(log_path)


def pack_into(storage: Storage, key: str, cache_root: Path, *, max_bytes: int) -> Packed:
    """The cache root's compile cache as a tar under ``key``; committed when whole."""
    sink = storage.open_sink(key)
    try:
        packed = pack(cache_root, sink, max_bytes=max_bytes)  # type: ignore[arg-type]
        stored = sink.commit()
    except BaseException:
        sink.abort()
        raise
    if (stored.size, stored.sha256) != (packed.size, packed.sha256):
        raise WarmMakingError("bundle_mismatch", "storage recorded other bytes than were packed")
    return packed


def warm_key(
    *, model: Path, dtype: str, tensor_parallel_size: int, serve_args: list[str]
) -> WarmKey:
    return WarmKey(
        vllm_version=installed_version("vllm"),
        torch_version=installed_version("torch"),
        gpu=gpu_capability(),
        tensor_parallel_size=tensor_parallel_size,
        dtype=dtype,
        model=str(model),
        serve_args=tuple(serve_args),
    )


def cache_facts(packed: Packed, logged: list[str] | None) -> dict[str, Any]:
    return {"dirs": packed.dirs, "factors": packed.factors, "logged": logged or []}
