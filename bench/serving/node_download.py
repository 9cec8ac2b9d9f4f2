"""What one node's download of one file costs: the library's ``download()`` against curl and
against an earlier revision's ``download()``, same file, same nginx, same run.

``tensor_registry.api.download.download`` is what every pull, agent pre-pull and node-cache
fill runs. On a host that runs many nodes (the fleet bench: 64 agents on two cores) its CPU per
file is the fleet's bound, so each arm records the client's CPU seconds (user + system, from
``rusage``) as well as wall seconds. nginx (Debian package, ``sendfile on``) serves the file on
loopback. Arms, interleaved round by round, the order rotating, each writing a fresh file:

- ``download 8``: ``download(url, target, size=...)``, its defaults (8 parallel ranges for a
  file of 64 MB or more), sha256 included;
- ``download 1``: the same with ``readers=1`` (one GET, hashed on the fly);
- ``old 8`` / ``old 1`` (with ``--old REV``): REV's ``tensor_registry/api/download.py``, loaded
  from git beside today's library (before the nineteenth session it read through httpx);
- ``curl``: ``curl -s -o FILE URL``, one GET, no hash (the peer: a C client's floor).

``--together 8 64``: then N processes at once, each running ``download()`` (``--readers``) of
the file into a file of its own and nothing else, wall and CPU of all of them: the floor under
bench/fleet/fleet.py on this host (its agents do this and more: resolve, verify, check in).

    .venv/bin/python bench/serving/node_download.py --size-mb 120 --rounds 8 --old 998fe52
    .venv/bin/python bench/serving/node_download.py --size-mb 120 --rounds 0 --together 8 64
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import nginx  # noqa: E402
from tensor_registry.api.download import download  # noqa: E402
from tensor_registry.formats.digests import sha256_file  # noqa: E402


def _old_download(rev: str) -> Callable[..., str]:
    """REV's download() (its module text from git, run beside today's library)."""
    text = subprocess.run(
        ["git", "show", f"{rev}:tensor_registry/api/download.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="old-download-"))
    (folder / "old_download.py").write_text(text)
    spec = importlib.util.spec_from_file_location("old_download", folder / "old_download.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.download  # type: ignore[no-any-return]


def _cpu(who: int) -> float:
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--old", help="an earlier revision whose download() to run beside")
    parser.add_argument("--together", type=int, nargs="*", default=[], help="N at once")
    parser.add_argument("--readers", type=int, default=2, help="each one's, with --together")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="node-download-"))
    source = work / "www" / "model.tensors"
    source.parent.mkdir()
    size = args.size_mb * 1_000_000
    with source.open("wb") as out:
        for _ in range(size // 1_000_000):
            out.write(os.urandom(1_000_000))
    port = _free_port()
    conf = f"server {{ listen 127.0.0.1:{port}; root {source.parent}; sendfile on; }}"

    expected = sha256_file(source)

    def _check(digest: str) -> None:
        assert digest == expected, "the download's sha256 differs from the file's"

    arms: dict[str, Callable[[str, Path], None]] = {
        "download 8": lambda url, target: _check(download(url, target, size=size)),
        "download 1": lambda url, target: _check(download(url, target, size=size, readers=1)),
        "curl": lambda url, target: subprocess.run(
            ["curl", "-s", "-o", str(target), url], check=True
        ),
    }
    if args.old:
        import httpx

        old = _old_download(args.old)

        def old_arm(readers: int) -> Callable[[str, Path], None]:
            def run(url: str, target: Path) -> None:
                with httpx.Client() as client:
                    _check(old(client, url, target, size=size, readers=readers))

            return run

        arms["old 8"], arms["old 1"] = old_arm(8), old_arm(1)
    figures: dict[str, dict[str, list[float]]] = {a: {"cpu_s": [], "wall_s": []} for a in arms}
    names = list(arms)
    with nginx.running(conf, port, workers="auto"):
        url = f"http://127.0.0.1:{port}/model.tensors"
        for round_ in range(args.rounds + 1):  # round 0 warms the page cache and is not kept
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in order:
                target = work / f"out-{name.replace(' ', '-')}"
                target.unlink(missing_ok=True)
                who = resource.RUSAGE_CHILDREN if name == "curl" else resource.RUSAGE_SELF
                cpu, wall = _cpu(who), time.perf_counter()
                arms[name](url, target)
                wall, cpu = time.perf_counter() - wall, _cpu(who) - cpu
                assert target.stat().st_size == size
                if round_:
                    figures[name]["cpu_s"].append(cpu)
                    figures[name]["wall_s"].append(wall)
        together = [_together(url, work, size, n, args.readers) for n in args.together]
    result: dict[str, Any] = {"size_mb": args.size_mb, "rounds": args.rounds, "old": args.old}
    result["together"] = together
    for row in together:
        print(
            f"{row['n']} at once, readers {row['readers']}: {row['wall_s']:.2f} s, "
            f"{row['cpu_s']:.1f} CPU-s ({row['cpu_s'] / row['n']:.3f} each, process start "
            "included)"
        )
    if args.rounds:
        _table(figures, args.size_mb, args.rounds, result)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def _table(
    figures: dict[str, dict[str, list[float]]], size_mb: int, rounds: int, result: dict[str, Any]
) -> None:
    curl_cpu = statistics.median(figures["curl"]["cpu_s"])
    print(f"{size_mb} MB from nginx on loopback, {rounds} rounds (median [min-max])")
    print("| arm | CPU s | wall s | CPU ÷ curl's |")
    print("|---|---|---|---|")
    for name, got in figures.items():
        cpu, wall = statistics.median(got["cpu_s"]), statistics.median(got["wall_s"])
        print(
            f"| {name} | {cpu:.3f} [{min(got['cpu_s']):.3f}-{max(got['cpu_s']):.3f}] "
            f"| {wall:.3f} [{min(got['wall_s']):.3f}-{max(got['wall_s']):.3f}] "
            f"| {cpu / curl_cpu:.2f} |"
        )
        result[name] = {**got, "cpu_median_s": cpu, "wall_median_s": wall}


_ONE = """
import sys
from pathlib import Path
from tensor_registry.api.download import download
target = Path(sys.argv[2])
download(sys.argv[1], target, size=int(sys.argv[3]), readers=int(sys.argv[4]))
target.unlink()
"""


def _together(url: str, work: Path, size: int, n: int, readers: int) -> dict[str, Any]:
    """``n`` processes downloading the file at once: their wall clock and CPU together."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cpu, wall = _cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _ONE, url, str(work / f"together-{i}"), str(size), str(readers)],
            env=env,
        )
        for i in range(n)
    ]
    failed = [p.pid for p in procs if p.wait() != 0]
    assert not failed, f"downloads failed: {failed}"
    wall, cpu = time.perf_counter() - wall, _cpu(resource.RUSAGE_CHILDREN) - cpu
    return {"n": n, "readers": readers, "wall_s": wall, "cpu_s": cpu}


if __name__ == "__main__":
    raise SystemExit(main())
