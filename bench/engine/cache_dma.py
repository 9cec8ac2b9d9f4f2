"""Does the device copy of a freshly read piece cost the host's memory a third pass? (issue 12)

    python3 bench/engine/cache_dma.py --size-gb 10 --out $OUT        # GPU machine, nothing to carry

Reading a cached file through the host into pinned memory — ``preadv``, or a loopback TCP
receive from a ``sendfile`` sender — moves every byte through host memory twice (read out of
the page cache, written into the buffer), and the copy engine's device copy reads it a third
time. If the host's memory bandwidth is what holds the ring path and the signed-URL path, a
device copy issued while the piece is still in the CPU's last-level cache could be served from
there: smaller pieces, copied at once, would then load almost as fast as the host reads alone.

For each piece size, T threads each read their contiguous share of the file a piece at a time
into ``depth`` pinned slots of their own and, in the ``+ device`` arms, copy each piece to its
place in one device allocation on the thread's stream as soon as it is read (a slot is reused
once its copy's event has passed). Arms: ``pread`` and ``tcp`` (T loopback connections, the
senders ``os.sendfile`` in threads of this process, the receivers ``recv_into`` with
``MSG_WAITALL``), each host only and ``+ device``. Baseline: one pinned → device copy of the
same size. Best of ``--runs``; writes cache_dma.json.

``--submit torch`` issues each copy through torch (``copy_``, an event per piece: its
per-copy cost swamps pieces of a few MiB); ``ctypes`` calls the CUDA runtime directly through
the engine's tensor_registry/engine/copies.py (one reused event per slot, the GIL released in
each call).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

GB = 1e9
MIB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import bench_dirs, failed_arm  # noqa: E402  (after the path)
from bench.engine.url_ceiling import run_threads, tcp_pairs  # noqa: E402


def shares(size: int, threads: int, piece: int) -> list[tuple[int, int]]:
    share = -(-size // threads // piece) * piece
    return [(min(size, i * share), min(size, (i + 1) * share)) for i in range(threads)]


class Slots:
    """Per thread: ``depth`` pinned slots of ``piece`` bytes and a stream."""

    def __init__(self, torch: Any, threads: int, depth: int, piece: int) -> None:
        self.torch, self.depth, self.piece = torch, depth, piece
        self.host = [
            torch.empty(depth * piece, dtype=torch.uint8, pin_memory=True) for _ in range(threads)
        ]
        self.views = [memoryview(h.numpy()).cast("B") for h in self.host]
        self.streams = [torch.cuda.Stream() for _ in range(threads)]
        self.rt: Any = None

    def direct(self) -> None:
        """Submit through the engine's ctypes runtime (tensor_registry/engine/copies.py): one
        event per slot, made once."""
        from tensor_registry.engine.copies import runtime

        self.rt = runtime()
        assert self.rt is not None, "no CUDA runtime library"
        self.events = [[self.rt.event() for _ in range(self.depth)] for _ in self.host]


def transfer(
    torch: Any,
    slots: Slots,
    device: Any,
    i: int,
    part: tuple[int, int],
    fill: Callable[[memoryview, int], None],
) -> None:
    """Thread ``i``: fill each piece of ``part`` into the next slot, then (``device`` not None)
    copy it to its place on the device at once."""
    start, end = part
    piece, depth = slots.piece, slots.depth
    host, view, stream = slots.host[i], slots.views[i], slots.streams[i]
    if slots.rt is not None:
        rt, handle, base = slots.rt, stream.cuda_stream, host.data_ptr()
        target = device.data_ptr() if device is not None else 0
        used = [False] * depth
        for k, offset in enumerate(range(start, end, piece)):
            n = min(piece, end - offset)
            slot = k % depth
            event = slots.events[i][slot]
            if used[slot]:
                rt.wait(event)
            fill(view[slot * piece : slot * piece + n], offset)
            if device is not None:
                rt.copy(target + offset, base + slot * piece, n, handle)
                rt.record(event, handle)
                used[slot] = True
        stream.synchronize()
        return
    events: list[Any] = [None] * depth
    for k, offset in enumerate(range(start, end, piece)):
        n = min(piece, end - offset)
        slot = k % depth
        if events[slot] is not None:
            events[slot].synchronize()
        fill(view[slot * piece : slot * piece + n], offset)
        if device is not None:
            with torch.cuda.stream(stream):
                device[offset : offset + n].copy_(
                    host[slot * piece : slot * piece + n], non_blocking=True
                )
                event = torch.cuda.Event()
                event.record(stream)
                events[slot] = event
    stream.synchronize()


def pread_arm(torch: Any, path: Path, size: int, slots: Slots, device: Any, threads: int) -> None:
    fd = os.open(path, os.O_RDONLY)

    def fill(buffer: memoryview, offset: int) -> None:
        got = 0
        while got < len(buffer):
            n = os.preadv(fd, [buffer[got:]], offset + got)
            if n <= 0:
                raise OSError(f"short read at {offset + got}")
            got += n

    parts = shares(size, threads, slots.piece)
    try:
        run_threads(threads, lambda i: transfer(torch, slots, device, i, parts[i], fill))
    finally:
        os.close(fd)


def tcp_arm(torch: Any, path: Path, size: int, slots: Slots, device: Any, threads: int) -> None:
    clients, senders = tcp_pairs(threads)
    parts = shares(size, threads, slots.piece)
    fd = os.open(path, os.O_RDONLY)

    def send(i: int) -> None:
        start, end = parts[i]
        while start < end:
            start += os.sendfile(senders[i].fileno(), fd, start, end - start)
        senders[i].shutdown(socket.SHUT_WR)

    def receive(i: int) -> None:
        sock = clients[i]

        def fill(buffer: memoryview, offset: int) -> None:
            got = 0
            while got < len(buffer):
                n = sock.recv_into(buffer[got:], len(buffer) - got, socket.MSG_WAITALL)
                if not n:
                    raise OSError("connection closed early")
                got += n

        transfer(torch, slots, device, i, parts[i], fill)

    try:
        run_threads(2 * threads, lambda i: send(i // 2) if i % 2 else receive(i // 2))
    finally:
        os.close(fd)
        for s in clients + senders:
            s.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=10)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[16])
    parser.add_argument("--pieces-mib", type=float, nargs="+", default=[64, 16, 4, 1])
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["pread", "tcp"])
    parser.add_argument("--submit", choices=["torch", "ctypes"], default="ctypes")
    parser.add_argument("--workdir", default="/tmp/cache-dma")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    import torch

    work, out = bench_dirs(args.workdir, args.out)
    path = work / "data.bin"
    block = os.urandom(64 * MIB)
    with path.open("wb") as fh:
        for _ in range(int(args.size_gb * GB) // len(block)):
            fh.write(block)
    size = path.stat().st_size
    with path.open("rb") as fh:  # the page cache holds it all before timing
        while fh.read(64 * MIB):
            pass
    device = torch.empty(size, dtype=torch.uint8, device="cuda")
    rows: dict[str, Any] = {}

    def arm(name: str, fn: Callable[[], None]) -> None:
        best = None
        for _ in range(args.runs):
            torch.cuda.synchronize()
            cpu = os.times()
            started = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            used = os.times()
            cpu_s = used.user + used.system - cpu.user - cpu.system
            if best is None or seconds < best["seconds"]:
                best = {"seconds": seconds, "gbps": size / seconds / GB, "cpu_s": cpu_s}
        assert best is not None
        rows[name] = best
        print(f"{name:34s} {best['gbps']:6.2f} GB/s  cpu {best['cpu_s']:.2f} s", flush=True)

    host: Any = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    arm("pinned copy", lambda: device.copy_(host, non_blocking=True))
    host = None
    first, last = (
        torch.frombuffer(bytearray(b), dtype=torch.uint8).cuda()
        for b in (block[:4096], block[-4096:])
    )
    for threads in args.threads:
        for mib in args.pieces_mib:
            piece = int(mib * MIB)
            slots = Slots(torch, threads, args.depth, piece)
            if args.submit == "ctypes":
                slots.direct()
            for mode in args.modes:
                run = pread_arm if mode == "pread" else tcp_arm
                for dma in (False, True):
                    name = f"{mode} {threads}x{mib:g}M" + (" + device" if dma else "")
                    try:
                        arm(
                            name,
                            lambda run=run, dma=dma, slots=slots, threads=threads: run(
                                torch, path, size, slots, device if dma else None, threads
                            ),
                        )
                        if dma and not (
                            torch.equal(device[:4096], first) and torch.equal(device[-4096:], last)
                        ):
                            raise AssertionError("the device holds other bytes")
                    except Exception as exc:
                        failed_arm(rows, name, exc)
    (out / "cache_dma.json").write_text(json.dumps({"bytes": size, "rows": rows}, indent=1))
    base = rows["pinned copy"]["gbps"]
    print("\n| arm | GB/s | x pinned copy | CPU s |\n|---|---|---|---|")
    for name, row in rows.items():
        if "gbps" in row:
            print(f"| {name} | {row['gbps']:.1f} | {row['gbps'] / base:.2f} | {row['cpu_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
