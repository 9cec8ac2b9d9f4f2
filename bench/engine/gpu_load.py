"""GPU load: a tensorizer artifact into CUDA memory, from a local file and from a signed URL.

    python bench/engine/gpu_load.py --size-gb 10            # on a GPU machine
    python bench/engine/gpu_load.py                         # no GPU: a small CPU sanity run

Writes ``--size-gb`` of random bfloat16 tensors with tensorizer, then, in the same run and
interleaved (best of ``--runs``):

- baseline: a plain copy of the same number of bytes from pinned host memory to the GPU
  (``cuda_tensor.copy_(pinned, non_blocking=True)``): the host-to-device ceiling;
- local file: ``TensorDeserializer(path, device="cuda", num_readers=N)``;
- signed URL: ``TensorDeserializer(url, device="cuda", num_readers=N)`` over loopback (tensorizer's
  curl reader), and — when ``tensor_registry`` is importable — through the client's in-process
  reader (``tensor_registry.tensorizer_stream.HTTPRangeStream``). The URL
  is the registry's own signed blob URL when the registry's packages are importable
  (``--server registry``), otherwise a signed URL of a small built-in HTTP/1.1 range server
  (``--server builtin``: exp/sig HMAC like the registry's, ``Accept-Ranges``, 206, sendfile) —
  the GPU machine may have torch but not the registry's server stack.

Every load ends with ``torch.cuda.synchronize()``. Prints GB/s and the ratio of each to the
pinned-memory copy; ``--verify-hash`` adds tensorizer's per-tensor hash checks. The file is
in the page cache (just written): this measures the loader and the transport, not the disk.

Needs torch and tensorizer (``PYTHONPATH`` may point at a folder holding tensorizer and its
pure-Python dependencies).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import hmac
import http.server
import os
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

GB = 1_000_000_000
TENSOR_BYTES = 256 * 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# The built-in signed range server


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # tensorizer's curl reader wants "HTTP/1.1 2xx"
    root: Path
    secret: bytes

    def log_message(self, *_: Any) -> None:
        return None

    def _refuse(self, status: int, text: str) -> None:
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        exp, sig = query.get("exp", [""])[0], query.get("sig", [""])[0]
        expected = hmac.new(self.secret, f"{parts.path}\n{exp}".encode(), hashlib.sha256)
        if not exp.isdigit() or not hmac.compare_digest(expected.hexdigest(), sig):
            return self._refuse(403, "signature_invalid")
        if int(exp) < time.time():
            return self._refuse(403, "signature_expired")
        path = (self.root / parts.path.lstrip("/")).resolve()
        if self.root not in path.parents or not path.is_file():
            return self._refuse(404, "not found")
        size = path.stat().st_size
        start, end = 0, size - 1
        ranged = self.headers.get("Range")
        if ranged and ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start = int(first)
            end = min(int(last), size - 1) if last else size - 1
        self.send_response(206 if ranged else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        self.wfile.flush()
        # tensorizer's readers close early (BrokenPipe/ConnectionReset): that is normal.
        with open(path, "rb") as fh, contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.connection.sendfile(fh, start, end - start + 1)


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    request_queue_size = 128


@contextmanager
def builtin_server(root: Path) -> Iterator[Callable[[str], str]]:
    secret = os.urandom(32)
    handler = type("Handler", (_Handler,), {"root": root.resolve(), "secret": secret})
    server = _Server(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]

    def sign(relative: str, ttl: int = 3600) -> str:
        path = "/" + relative
        exp = str(int(time.time()) + ttl)
        sig = hmac.new(secret, f"{path}\n{exp}".encode(), hashlib.sha256).hexdigest()
        return f"http://{host}:{port}{path}?exp={exp}&sig={sig}"

    try:
        yield sign
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def registry_server(root: Path) -> Iterator[Callable[[str], str]]:
    """A real `tensor-registry serve` whose local storage holds the file; signs blob URLs."""
    from bench.common import serve_no_worker
    from tensor_registry_server.storage.signing import blob_url

    key = "bench-gpu-signing-key-0123456789abcdefghijklmnopqrstuvwxyz"
    env = {
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": key,
        "TENSOR_REGISTRY_STORAGE__LOCAL_ROOT": str(root),
    }
    with serve_no_worker(root.parent / "registry-data", env) as url:

        def sign(relative: str, ttl: int = 3600) -> str:
            return blob_url(url, key.encode(), storage="local", key=relative, ttl=ttl)

        yield sign


def _client_transport_importable() -> bool:
    """The client's in-process HTTP reader needs only httpx beside tensorizer."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    try:
        import tensor_registry.tensorizer_stream  # noqa: F401
    except Exception:
        return False
    return True


def _registry_importable() -> bool:
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    try:
        import tensor_registry_server.main
        import tensor_registry_server.storage.signing  # noqa: F401
    except Exception:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Measurements


def write_artifact(path: Path, total_bytes: int, device: str) -> int:
    """Random bfloat16 tensors of ``TENSOR_BYTES`` each, ~``total_bytes`` in all."""
    import torch
    from tensorizer import TensorSerializer

    path.parent.mkdir(parents=True, exist_ok=True)
    elements = TENSOR_BYTES // 2
    count = max(1, total_bytes // TENSOR_BYTES)
    serializer = TensorSerializer(str(path))
    generator = torch.Generator(device=device).manual_seed(0)
    try:
        for i in range(count):
            tensor = torch.randn(elements, generator=generator, device=device).to(torch.bfloat16)
            serializer.write_state_dict({f"model.layers.{i}.weight": tensor.cpu()})
    finally:
        serializer.close()
    return count * TENSOR_BYTES


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def tensorizer_load(
    source: str, device: str, readers: int, verify: bool, in_process: bool = False
) -> int:
    from tensorizer import TensorDeserializer

    stream: Any = source
    if in_process:
        from tensor_registry.tensorizer_stream import HTTPRangeStream

        stream = HTTPRangeStream(source)
    deserializer = TensorDeserializer(
        stream, device=device, num_readers=readers, verify_hash=verify
    )
    try:
        sync(device)
        loaded = sum(t.numel() * t.element_size() for t in deserializer.values())
    finally:
        deserializer.close()
    del deserializer
    return loaded


class PinnedCopy:
    """The same number of bytes, host (pinned) to device, as one copy."""

    def __init__(self, nbytes: int, device: str) -> None:
        import torch

        pin = device.startswith("cuda")
        self.host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        self.host.fill_(7)
        self.target = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.device = device

    def __call__(self) -> int:
        self.target.copy_(self.host, non_blocking=True)
        sync(self.device)
        return int(self.host.numel())

    def close(self) -> None:
        del self.host, self.target


def best(runs: int, fns: dict[str, Callable[[], int]]) -> dict[str, tuple[float, int]]:
    import torch

    results: dict[str, tuple[float, int]] = {}
    for _ in range(runs):
        for name, fn in fns.items():
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            started = time.perf_counter()
            moved = fn()
            seconds = time.perf_counter() - started
            if name not in results or seconds < results[name][0]:
                results[name] = (seconds, moved)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, default=None, help="default 10 (GPU), 0.5 (CPU)")
    parser.add_argument("--readers", type=int, nargs="+", default=[16])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--verify-hash", action="store_true")
    parser.add_argument("--server", choices=["auto", "registry", "builtin"], default="auto")
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: tmp)")
    args = parser.parse_args()

    import torch

    if torch.cuda.is_available():
        device = "cuda:0"
        size_gb = args.size_gb if args.size_gb is not None else 10.0
        print(f"device: {torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs")
    else:
        device = "cpu"
        size_gb = args.size_gb if args.size_gb is not None else 0.5
        print(
            "NOTICE: no CUDA device; this is a CPU sanity run of the same code paths "
            "(the GB/s are not GPU figures)."
        )
    client_transport = _client_transport_importable()
    server = args.server
    if server == "auto":
        server = "registry" if _registry_importable() else "builtin"

    work = Path(tempfile.mkdtemp(prefix="bench-gpu-", dir=args.dir))
    try:
        storage = work / "storage"
        relative = "artifacts/00000000-0000-4000-8000-000000000001/model.tensors"
        path = storage / relative
        started = time.perf_counter()
        nbytes = write_artifact(path, int(size_gb * GB), "cuda" if device != "cpu" else "cpu")
        file_size = path.stat().st_size
        print(
            f"artifact: {nbytes / GB:.2f} GB of bfloat16 tensors in a {file_size / GB:.2f} GB "
            f"tensorizer file, written in {time.perf_counter() - started:.1f} s; "
            f"verify_hash={args.verify_hash}; server={server}; best of {args.runs}"
        )
        with open(path, "rb") as fh:  # into the page cache, once, before any timing
            while fh.read(64 << 20):
                pass
        serve = registry_server if server == "registry" else builtin_server
        with serve(storage) as sign:
            url = sign(relative)
            baseline = PinnedCopy(nbytes, device)
            fns: dict[str, Callable[[], int]] = {"pinned copy": baseline}
            for readers in args.readers:
                fns[f"local file, {readers} readers"] = lambda r=readers: tensorizer_load(
                    str(path), device, r, args.verify_hash
                )
                fns[f"signed URL, {readers} readers"] = lambda r=readers: tensorizer_load(
                    url, device, r, args.verify_hash
                )
                if client_transport:
                    fns[f"signed URL, {readers} r., client"] = lambda r=readers: tensorizer_load(
                        url, device, r, args.verify_hash, in_process=True
                    )
            results = best(args.runs, fns)
            baseline.close()
        base_rate = results["pinned copy"][1] / results["pinned copy"][0]
        print(f"{'method':<30}{'seconds':>10}{'GB/s':>10}{'vs pinned copy':>16}")
        for name, (seconds, moved) in results.items():
            rate = moved / seconds
            print(f"{name:<30}{seconds:>10.3f}{rate / GB:>10.2f}{rate / base_rate:>15.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
