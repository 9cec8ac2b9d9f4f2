"""Why the engine's two local paths do not add up: each resource alone, then together.

On a page-cached file (``--size-gb``, written here), each step timed, no DMA unless it says so:

1. pin (``cudaHostRegister``, read-only) the whole mmap'd file from one thread, in slices;
2. the same split over 2 and 4 threads of one process, and over 2 and 4 processes (each
   with its own CUDA context, started and warmed before the clock): does pinning scale
   anywhere?
3. ``preadv`` of the file into pinned buffers on 8 and 15 threads alone (page cache →
   pinned), into torch's pinned buffers and into a ring in transparent huge pages;
4. faulting the mapping in on 1/4/8 threads (``MADV_POPULATE_READ``), then pinning it;
5. 3 and 1 at once, on two halves of the file: how much each slows the other; then each of
   them while a pinned → device copy loop keeps the DMA engine busy.

    python3 bench/engine/pin_check.py --size-gb 8 --out $OUT     # on a CUDA machine

Prints GB/s per step and writes ``pin_check.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GB = 1e9
SLICE = 256 << 20
BLOCK = 64 << 20


HUGE = 2 << 20
MADV_HUGEPAGE = 14


class HugeBuffers:
    """``count`` buffers of ``size`` bytes in one anonymous mapping backed by transparent huge
    pages where the kernel gives them (``MADV_HUGEPAGE``), touched, then pinned with
    ``cudaHostRegister``: the page-cache copies into them walk one TLB entry per 2 MiB instead
    of per 4 KiB (on the H200 host measured: no faster; kept here, not in the engine)."""

    def __init__(self, count: int, size: int) -> None:
        import ctypes
        import mmap

        from tensor_registry.engine.pinned import cuda_runtime_library as cudart

        self.size = -(-size // HUGE) * HUGE
        length = count * self.size + HUGE
        self.raw = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.raw))
        self.base = -(-base // HUGE) * HUGE
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise(self.base, count * self.size, MADV_HUGEPAGE)  # advice: failure is fine
        ctypes.memset(self.base, 0, count * self.size)
        err = cudart().cudaHostRegister(self.base, count * self.size, 1)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister failed: {err}")

    def address(self, index: int) -> int:
        return self.base + index * self.size


def _pin_range(path: str, start: int, end: int) -> tuple[float, Any]:
    """Pin [start, end) of the file in slices; returns (seconds, the mapping to release)."""
    from tensor_registry.engine.pinned import RegisteredFile

    fd = os.open(path, os.O_RDONLY)
    reg = RegisteredFile(fd, start, end)
    t = time.perf_counter()
    for s in range(start, end, SLICE):
        reg.pin(s, min(end, s + SLICE))
    seconds = time.perf_counter() - t
    os.close(fd)
    return seconds, reg


def _process_pin(path: str, start: int, end: int, ready: Any, go: Any, out: Any) -> None:
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    from tensor_registry.engine.pinned import cuda_runtime_library

    cuda_runtime_library()
    ready.wait()
    go.wait()
    t = time.perf_counter()
    seconds, reg = _pin_range(path, start, end)
    out.put((t, time.perf_counter(), seconds))
    reg.close()


def _parts(size: int, n: int) -> list[tuple[int, int]]:
    step = -(-size // n // BLOCK) * BLOCK
    return [(s, min(size, s + step)) for s in range(0, size, step)]


def pin_threads(path: str, size: int, n: int) -> float:
    regs = []
    t = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        for _, reg in pool.map(lambda p: _pin_range(path, *p), _parts(size, n)):
            regs.append(reg)
    seconds = time.perf_counter() - t
    for reg in regs:
        reg.close()
    return size / seconds / GB


def pin_processes(path: str, size: int, n: int) -> float:
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Barrier(n + 1), ctx.Barrier(n + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_process_pin, args=(path, a, b, ready, go, out))
        for a, b in _parts(size, n)
    ]
    for p in procs:
        p.start()
    ready.wait()
    go.wait()
    spans = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    seconds = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    return size / seconds / GB


def pread_pinned(path: str, start: int, end: int, threads: int, buffers: list[Any]) -> float:
    from tensor_registry.engine.pinned import memview_at

    fd = os.open(path, os.O_RDONLY)
    blocks = iter(range(start, end, BLOCK))
    lock = threading.Lock()

    def worker(k: int) -> None:
        view = memview_at(buffers[k].data_ptr(), BLOCK)
        while True:
            with lock:
                s = next(blocks, None)
            if s is None:
                return
            n = min(end, s + BLOCK) - s
            got = 0
            while got < n:
                got += os.preadv(fd, [view[got:n]], s + got)

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(worker, range(threads)))
    seconds = time.perf_counter() - t
    os.close(fd)
    return (end - start) / seconds / GB


class DmaLoop:
    """Pinned → device copies of ``chunk`` bytes kept ``depth`` deep on one stream, from a thread
    of their own, until stopped. Each finished copy is stamped (host time), so the rate over
    any window can be read afterwards; each issuing call is timed too (does it wait for the
    driver while another thread pins?)."""

    def __init__(self, depth: int, chunk: int = 256 << 20) -> None:
        import torch

        self.depth, self.chunk = depth, chunk
        self.src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
        self.dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        self.stop = threading.Event()
        self.done: list[float] = []
        self.issue: list[tuple[float, float]] = []
        self.primed = threading.Event()  # the queue was full once: the window may open

    def _run(self) -> None:
        import torch

        stream = torch.cuda.Stream()
        pending: list[Any] = []
        k = 0
        parts = (1 << 30) // self.chunk
        with torch.cuda.stream(stream):
            while not self.stop.is_set() or pending:
                if not self.stop.is_set() and len(pending) < self.depth:
                    a = (k % parts) * self.chunk
                    t = time.perf_counter()
                    self.dst[a : a + self.chunk].copy_(
                        self.src[a : a + self.chunk], non_blocking=True
                    )
                    event = torch.cuda.Event()
                    event.record(stream)
                    self.issue.append((t, time.perf_counter() - t))
                    pending.append(event)
                    k += 1
                    continue
                self.primed.set()
                pending.pop(0).synchronize()
                self.done.append(time.perf_counter())

    def __enter__(self) -> DmaLoop:
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        self.primed.wait(60)
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        self.thread.join()

    def copies(self, n: int) -> None:
        """Return once ``n`` more copies have finished (a window measured in copies)."""
        target = len(self.done) + n
        while len(self.done) < target and self.thread.is_alive():
            time.sleep(0.001)

    def rate(self, t0: float, t1: float) -> float:
        n = sum(1 for t in self.done if t0 <= t < t1)
        return n * self.chunk / (t1 - t0) / GB

    def worst_issue(self, t0: float, t1: float) -> float:
        return max((d for t, d in self.issue if t0 <= t < t1), default=0.0)


def dma_checks(path: str, size: int, log: dict[str, Any]) -> None:
    """Does pinning slow the DMA engine itself, or only the issuing of copies? The copy loop
    at depth 1 (issue, wait, issue: what pin_check measured before) and at depth 8 (2 GiB
    queued ahead), alone and while one thread pins the file (in this process, then in another
    process with its own CUDA context)."""
    for depth in (1, 8):
        with DmaLoop(depth) as loop:
            t0 = time.perf_counter()
            loop.copies(80)  # 20 GiB: ≈ 0.4 s at 55 GB/s
            t1 = time.perf_counter()
        log[f"dma_depth{depth}_alone"] = loop.rate(t0, t1)
        with DmaLoop(depth) as loop:
            t0 = time.perf_counter()
            log[f"dma_depth{depth}_pin_gbps"] = pin_threads(path, size, 1)
            t1 = time.perf_counter()
        log[f"dma_depth{depth}_while_pinning"] = loop.rate(t0, t1)
        log[f"dma_depth{depth}_worst_issue_ms_while_pinning"] = loop.worst_issue(t0, t1) * 1e3
        ctx = mp.get_context("spawn")
        ready, go, out = ctx.Barrier(2), ctx.Barrier(2), ctx.Queue()
        proc = ctx.Process(target=_process_pin, args=(path, 0, size, ready, go, out))
        proc.start()
        ready.wait()
        with DmaLoop(depth) as loop:
            go.wait()
            start, end, seconds = out.get(timeout=300)
        proc.join()
        log[f"dma_depth{depth}_other_process_pin_gbps"] = size / seconds / GB
        log[f"dma_depth{depth}_while_other_process_pins"] = loop.rate(start, end)
        log[f"dma_depth{depth}_worst_issue_ms_other_process"] = loop.worst_issue(start, end) * 1e3
    for key in sorted(k for k in log if k.startswith("dma_")):
        print(f"{key:48s} {log[key]:.2f}", flush=True)


def _meminfo(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-gb", type=float, default=8)
    parser.add_argument("--path", default="/tmp/pin-check.bin")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument(
        "--dma-only", action="store_true", help="only the DMA-while-pinning checks (dma_checks)"
    )
    args = parser.parse_args()

    import torch

    path = args.path
    size = int(args.size_gb * GB) // BLOCK * BLOCK
    if not os.path.exists(path) or os.path.getsize(path) != size:
        with open(path, "wb") as fh:
            chunk = os.urandom(BLOCK)
            for _ in range(size // BLOCK):
                fh.write(chunk)
    with open(path, "rb") as fh:
        while fh.read(BLOCK):
            pass
    torch.empty(1, device="cuda")
    log: dict[str, Any] = {"bytes": size, "cpus": len(os.sched_getaffinity(0))}
    log["kernel"] = os.uname().release
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    log["thp"] = thp.read_text().strip() if thp.exists() else "absent"
    dma_checks(path, size, log)
    if args.dma_only:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "pin_check.json").write_text(json.dumps(log, indent=1))
        return 0
    log["pin_1_thread"] = pin_threads(path, size, 1)
    log["pin_1_thread_again"] = pin_threads(path, size, 1)
    for n in (2, 4):
        log[f"pin_{n}_threads"] = pin_threads(path, size, n)
    for n in (2, 4):
        log[f"pin_{n}_processes"] = pin_processes(path, size, n)
    buffers = [torch.empty(BLOCK, dtype=torch.uint8, pin_memory=True) for _ in range(16)]
    for threads in (8, 15):
        log[f"pread_pinned_{threads}_threads"] = pread_pinned(path, 0, size, threads, buffers)
    # Page-cache copies into a ring in transparent huge pages (tensor_registry.engine.pinned).
    from tensor_registry.engine.pinned import RegisteredFile, _host_view

    huge = HugeBuffers(16, BLOCK)
    huge_views = [_host_view(huge.address(i), BLOCK) for i in range(16)]
    log["anon_huge_pages_kb"] = _meminfo("AnonHugePages")
    for threads in (8, 15):
        log[f"pread_huge_ring_{threads}_threads"] = pread_pinned(path, 0, size, threads, huge_views)
    # Faulting the mapping in (parallel) before the driver pins it (serial).
    for threads in (1, 4, 8):
        fd = os.open(path, os.O_RDONLY)
        reg = RegisteredFile(fd, 0, size)
        t = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            ok = all(pool.map(lambda p, r=reg: r.populate(*p), _parts(size, threads * 4)))
        log[f"populate_{threads}_threads"] = size / (time.perf_counter() - t) / GB if ok else 0.0
        t = time.perf_counter()
        for s in range(0, size, SLICE):
            reg.pin(s, min(size, s + SLICE))
        log[f"pin_after_populate_{threads}"] = size / (time.perf_counter() - t) / GB
        reg.close()
        os.close(fd)
    half = size // 2 // BLOCK * BLOCK
    results: dict[str, float] = {}

    def pin_half() -> None:
        seconds, reg = _pin_range(path, half, size)
        results["pin"] = (size - half) / seconds / GB
        reg.close()

    pinner = threading.Thread(target=pin_half)
    t = time.perf_counter()
    pinner.start()
    results["pread"] = pread_pinned(path, 0, half, 15, buffers)
    pinner.join()
    log["together_wall_gbps"] = size / (time.perf_counter() - t) / GB
    log["together_pin_gbps"] = results["pin"]
    log["together_pread_gbps"] = results["pread"]
    # The DMA engine busy meanwhile (a pinned → device copy loop on its own stream): does it
    # slow the page-cache copies, the pinning, or neither?
    src = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    stop = threading.Event()
    copied = [0]

    def dma_loop() -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not stop.is_set():
                dst.copy_(src, non_blocking=True)
                stream.synchronize()
                copied[0] += src.numel()

    for name, step in (
        ("pread_15_threads_with_dma", lambda: pread_pinned(path, 0, size, 15, buffers)),
        ("pin_1_thread_with_dma", lambda: pin_threads(path, size, 1)),
    ):
        stop.clear()
        copied[0] = 0
        loop = threading.Thread(target=dma_loop)
        t = time.perf_counter()
        loop.start()
        log[name] = step()
        stop.set()
        loop.join()
        log[name.replace("_with_dma", "_dma_gbps")] = copied[0] / (time.perf_counter() - t) / GB
    for key, value in log.items():
        print(f"{key:28s} {value:.2f}" if isinstance(value, float) else f"{key:28s} {value}")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "pin_check.json").write_text(json.dumps(log, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
