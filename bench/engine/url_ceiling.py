"""The signed-URL load against what loopback TCP can carry on the same host (issue 12).

    python3 bench/engine/url_ceiling.py --size-gb 10 --out $OUT          # GPU machine (carry .whl)
    .venv/bin/python bench/engine/url_ceiling.py --size-gb 0.5 --cpu     # anywhere: host arms only

One file in the page cache (on a GPU machine a tensorizer file with its layout manifest, else
random bytes), read every way below, each timed from the first request to the last byte in
place, best of ``--runs``; CPU seconds of this process and of the serving process beside each.

Host arms (no GPU work; each thread reads into its own 64 MiB buffer, pinned on a GPU machine):

- ``pread N``: N threads ``preadv`` 64 MiB blocks: the page cache → host memory copy ceiling;
- ``tcp N`` / ``tcp-plain N``: N loopback TCP connections inside this process, one thread on
  each side: the sender ``os.sendfile``s its part of the file, the receiver ``recv_into``s it
  (``MSG_WAITALL`` 64 MiB at a time / plain receives): what loopback TCP carries with no HTTP
  and no Python in the data path; ``tcp-serve N``: the sender as serve's sendfile threads send
  (tensor_registry_server/blobs/sendfile.py ``sendfile_blocking``; its first version, a
  non-blocking socket
  polled when full, carried 25.5 GB/s where ``tcp 24`` carried 35.5); ``tcp-lowat=K N``: as
  ``tcp N`` with SO_RCVLOWAT K KiB on the receiving sockets (the thread sleeps until that much
  is queued instead of waking for every segment);
- ``http SERVER N``: N threads of the engine's own range reader (``HTTPRangeReader``, 64 MiB
  ranges) against ``builtin`` (bench/engine/gpu_load.py's threaded server: ``socket.sendfile`` on
  each connection's thread), ``serve`` (a real ``tensor-registry serve``: sendfile on its pool
  threads, ``http.sendfile_threads`` as by default) and ``serve-loop`` (the same with
  ``sendfile_threads`` 0: every sendfile on the event loop's one thread, as before).

GPU arms: ``pinned copy`` (one pinned → device copy of the file's bytes: the issue's baseline)
and ``engine SERVER N`` (``load_cuda`` over the signed URL, verified on the device unless the
arm says ``unverified``, one range request per span of blocks unless it says ``request per
block`` (one connection per reader, each block asked once the last one is read), each reader's
next span asked on a second connection while the current one's last block arrives unless it says
``one connection``; each arm's first load compared with the source tensors).

``--lowat-kib``: the ``tcp-lowat`` arms' values. (Run 30 also ran the range reader and the
engine under each, with the engine receiving bodies under SO_RCVLOWAT at commit 561a17d: bare
TCP gained, the engine did not, and that option was backed out; bench/results/engine.md.)

Prints one line per arm and a table (GB/s, x pinned copy or x pread); writes url_ceiling.json.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 1e9
BLOCK = 64 << 20
SENDFILE_THREADS = 32  # serve's default (tensor_registry_server.settings.HttpSettings)


class Buffers:
    """One 64 MiB buffer per thread: pinned host memory on a GPU machine, else plain."""

    def __init__(self, count: int, pinned: bool) -> None:
        if pinned:
            import torch

            self.keep = [
                torch.empty(BLOCK, dtype=torch.uint8, pin_memory=True) for _ in range(count)
            ]
            self.views = [memoryview(t.numpy()).cast("B") for t in self.keep]
        else:
            self.keep = [bytearray(BLOCK) for _ in range(count)]
            self.views = [memoryview(b) for b in self.keep]


def run_threads(count: int, work: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def each(i: int) -> None:
        try:
            work(i)
        except BaseException as exc:  # reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=each, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class Blocks:
    """The file's 64 MiB blocks, handed out in order to whichever thread asks."""

    def __init__(self, size: int) -> None:
        self.size, self.next = size, 0
        self.lock = threading.Lock()

    def take(self) -> tuple[int, int] | None:
        with self.lock:
            if self.next >= self.size:
                return None
            start = self.next
            self.next = min(self.size, start + BLOCK)
            return start, self.next


def pread_arm(path: Path, size: int, buffers: Buffers) -> Callable[[int], None]:
    def run(threads: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        blocks = Blocks(size)

        def work(i: int) -> None:
            view = buffers.views[i]
            while (claim := blocks.take()) is not None:
                start, end = claim
                got = 0
                while got < end - start:
                    n = os.preadv(fd, [view[got : end - start]], start + got)
                    if n <= 0:
                        raise OSError(f"short read at {start + got}")
                    got += n

        try:
            run_threads(threads, work)
        finally:
            os.close(fd)

    return run


def tcp_pairs(count: int) -> tuple[list[socket.socket], list[socket.socket]]:
    """``count`` loopback TCP connections: (the connecting ends, the accepted ends)."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=count)
    port = listener.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    senders = [listener.accept()[0] for _ in range(count)]
    listener.close()
    return clients, senders


def tcp_arm(
    path: Path,
    size: int,
    buffers: Buffers,
    waitall: bool,
    serve_thread: bool = False,
    lowat: int = 0,
) -> Callable[[int], None]:
    def run(connections: int) -> None:
        clients, senders = tcp_pairs(connections)
        for client in clients:  # the senders shut down at the end: their FIN wakes a receiver
            if lowat:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
        share = -(-size // connections // BLOCK) * BLOCK
        parts = [(min(size, i * share), min(size, (i + 1) * share)) for i in range(connections)]
        fd = os.open(path, os.O_RDONLY)

        def send(i: int) -> None:
            start, end = parts[i]
            sock = senders[i]
            if serve_thread:  # as serve's sendfile threads send (from an asyncio socket)
                from tensor_registry_server.blobs.sendfile import sendfile_blocking

                sock.setblocking(False)
                start += sendfile_blocking(sock.fileno(), fd, start, end - start, 60.0)
                sock.setblocking(True)
            while start < end:
                start += os.sendfile(sock.fileno(), fd, start, end - start)
            sock.shutdown(socket.SHUT_WR)

        def receive(i: int) -> None:
            start, end = parts[i]
            view, sock = buffers.views[i], clients[i]
            left = end - start
            while left:
                want = min(left, BLOCK)
                got = 0
                while got < want:
                    if waitall:
                        n = sock.recv_into(view[got:want], want - got, socket.MSG_WAITALL)
                    else:
                        n = sock.recv_into(view[got:want])
                    if not n:
                        raise OSError("connection closed early")
                    got += n
                left -= want

        try:
            run_threads(2 * connections, lambda i: send(i // 2) if i % 2 else receive(i // 2))
        finally:
            os.close(fd)
            for s in clients + senders:
                s.close()

    return run


def http_arm(url: str, size: int, buffers: Buffers) -> Callable[[int], None]:
    from tensor_registry.engine.sources import HTTPRangeReader

    def run(connections: int) -> None:
        blocks = Blocks(size)
        readers = [HTTPRangeReader(url, size) for _ in range(connections)]

        def work(i: int) -> None:
            view, read = buffers.views[i], readers[i]
            while (claim := blocks.take()) is not None:
                start, end = claim
                if read(start, view[: end - start]) != end - start:
                    raise OSError(f"short range at {start}")

        try:
            run_threads(connections, work)
        finally:
            for r in readers:
                r.close()

    return run


@contextlib.contextmanager
def serve(root: Path, name: str, threads: int) -> Iterator[tuple[str, int]]:
    """A real `tensor-registry serve` whose local storage holds ``name``: (signed URL, pid)."""
    from bench.common import serve_no_worker, server_pid
    from tensor_registry_server.storage.signing import blob_url

    key = "bench-url-ceiling-signing-key-0123456789abcdefghijklmnopqrstuvwxyz"
    env = {
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": key,
        "TENSOR_REGISTRY_STORAGE__LOCAL_ROOT": str(root),
        "TENSOR_REGISTRY_HTTP__SENDFILE_THREADS": str(threads),
    }
    data = root.parent / f"registry-data-{threads}"
    with serve_no_worker(data, env) as base:
        yield blob_url(base, key.encode(), storage="local", key=name, ttl=3600), server_pid(base)


@contextlib.contextmanager
def builtin(root: Path, name: str) -> Iterator[tuple[str, int]]:
    from bench.engine.gpu_load import builtin_server

    with builtin_server(root) as sign:
        yield sign(name), os.getpid()


def cpu_seconds(pid: int) -> float:
    if pid == os.getpid():
        t = os.times()
        return t.user + t.system
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def main() -> int:
    from bench.common import bench_dirs, failed_arm

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--connections", type=int, nargs="+", default=[8, 12, 16])
    parser.add_argument("--servers", nargs="+", default=["builtin", "serve", "serve-loop"])
    parser.add_argument("--block-mib", type=int, nargs="+", default=[64], help="engine blocks")
    parser.add_argument("--lowat-kib", type=int, nargs="+", default=None, help="see above")
    parser.add_argument("--cpu", action="store_true", help="host arms only, plain buffers")
    parser.add_argument("--workdir", default="/tmp/url-ceiling")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    work, out = bench_dirs(args.workdir, args.out)
    gpu = not args.cpu
    log: dict[str, Any] = {"cpus": len(os.sched_getaffinity(0)), "argv": sys.argv[1:]}
    name = "artifacts/bench/model.tensors"  # a key with the artifact scope signed URLs carry
    path = work / name
    path.parent.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    manifest = None
    t = time.perf_counter()
    if gpu:
        from bench.engine.engine_gpu import make_state, write_artifact

        state = make_state(int(args.size_gb * GB))
        manifest = write_artifact(path, state)
    else:
        with path.open("wb") as fh:
            for _ in range(max(1, int(args.size_gb * GB) // BLOCK)):
                fh.write(os.urandom(BLOCK))
        with path.open("rb") as fh:  # every byte in the page cache before timing
            while fh.read(BLOCK):
                pass
    size = path.stat().st_size
    log.update(bytes=size, write_s=time.perf_counter() - t)
    print(f"{size / GB:.2f} GB in the page cache ({log['write_s']:.1f} s)", flush=True)
    buffers = Buffers(max(args.connections), pinned=gpu)
    rows: dict[str, dict[str, Any]] = {}
    phases: dict[str, Any] = {}  # the engine's own accounting of its last load

    def arm(name: str, fn: Callable[[], Any], server_pid: int | None = None) -> None:
        best: dict[str, Any] | None = None
        try:
            for run in range(args.runs):
                gc.collect()
                if gpu:
                    import torch

                    torch.cuda.synchronize()
                phases.clear()
                mine, theirs = cpu_seconds(os.getpid()), cpu_seconds(server_pid or os.getpid())
                started = time.perf_counter()
                loaded = fn()
                if gpu:
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - started
                cpu = cpu_seconds(os.getpid()) - mine
                server = (
                    (cpu_seconds(server_pid) - theirs)
                    if server_pid not in (None, os.getpid())
                    else 0.0
                )
                if run == 0 and isinstance(loaded, dict) and state:
                    import torch

                    bad = [k for k in state if not torch.equal(loaded[k], state[k])]
                    if bad or set(loaded) != set(state):
                        raise AssertionError(f"loaded tensors differ from the source: {bad[:3]}")
                del loaded
                if best is None or seconds < best["seconds"]:
                    best = {"seconds": seconds, "cpu_s": cpu, "server_cpu_s": server}
                    best["phases"] = {
                        k: round(v, 3) if isinstance(v, float) else v
                        for k, v in phases.items()
                        if k.startswith("readers_") or k in ("ring_buffers", "copied_s")
                    }
        except Exception as exc:
            failed_arm(rows, name, exc)
            return
        assert best is not None
        best["gbps"] = size / best["seconds"] / GB
        rows[name] = best
        print(
            f"{name:34s} {best['gbps']:6.2f} GB/s  cpu {best['cpu_s']:.2f} s"
            f"  server cpu {best['server_cpu_s']:.2f} s  {best['phases'] or ''}",
            flush=True,
        )

    if gpu:
        import torch

        host = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(7)
        device = torch.empty(size, dtype=torch.uint8, device="cuda")

        def pinned_copy() -> None:
            device.copy_(host, non_blocking=True)

        arm("pinned copy", pinned_copy)
        del host, device
        torch.cuda.empty_cache()

    for n in args.connections:
        arm(f"pread {n}", lambda n=n: pread_arm(path, size, buffers)(n))
    for n in args.connections:
        arm(f"tcp {n}", lambda n=n: tcp_arm(path, size, buffers, waitall=True)(n))
    last = args.connections[-1]
    for kib in args.lowat_kib or []:
        for n in args.connections:
            arm(
                f"tcp-lowat={kib}K {n}",
                lambda n=n, kib=kib: tcp_arm(path, size, buffers, True, lowat=kib << 10)(n),
            )
    arm(f"tcp-plain {last}", lambda: tcp_arm(path, size, buffers, waitall=False)(last))
    arm(f"tcp-serve {last}", lambda: tcp_arm(path, size, buffers, True, serve_thread=True)(last))
    for server in args.servers:
        opened = (
            builtin(work, name)
            if server == "builtin"
            else serve(work, name, 0 if server == "serve-loop" else SENDFILE_THREADS)
        )
        try:
            with opened as (url, pid):
                for n in args.connections:
                    arm(f"http {server} {n}", lambda n=n: http_arm(url, size, buffers)(n), pid)
                if not gpu:
                    continue
                from tensor_registry.engine import cuda as engine_cuda

                def engine_load(n: int, verify: bool, block: int, spans: bool, ahead: bool) -> Any:
                    # The URL readers' measurement switches are load options.
                    return engine_cuda.load_cuda(
                        manifest,
                        url=url,
                        device="cuda",
                        verify=verify,
                        readers=n,
                        block_bytes=block << 20,
                        digest_on="device",
                        url_spans=spans,
                        url_ahead=ahead,
                        phases=phases,
                    )

                for block in args.block_mib:
                    for n in args.connections:
                        first = n == args.connections[0] and block == args.block_mib[0]
                        for verify, spans, ahead in (
                            (
                                (True, True, True),
                                (False, True, True),
                                (True, False, False),
                                (True, True, False),
                            )
                            if first
                            else ((True, True, True), (True, True, False))
                        ):
                            arm(
                                f"engine {server} {n}"
                                + ("" if block == 64 else f" block={block}M")
                                + ("" if verify else " unverified")
                                + ("" if spans else " request per block")
                                + ("" if ahead or not spans else " one connection"),
                                lambda n=n, v=verify, b=block, s=spans, a=ahead: engine_load(
                                    n, v, b, s, a
                                ),
                                pid,
                            )
        except Exception as exc:  # a server that did not start: its arms are missing
            rows[f"server {server}"] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()

    log["rows"] = rows
    (out / "url_ceiling.json").write_text(json.dumps(log, indent=1))
    base_name = "pinned copy" if gpu else f"pread {args.connections[-1]}"
    base = rows.get(base_name, {}).get("gbps")
    print(f"\n| arm | GB/s | x {base_name} | client CPU s | server CPU s |\n|---|---|---|---|---|")
    for name, row in rows.items():
        if "gbps" in row:
            ratio = f"{row['gbps'] / base:.2f}" if base else "-"
            print(
                f"| {name} | {row['gbps']:.1f} | {ratio} | {row['cpu_s']:.2f} |"
                f" {row['server_cpu_s']:.2f} |"
            )
        else:
            print(f"| {name} | {row['error'][:70]} | - | - | - |")
    return 0 if all("gbps" in row for row in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
