"""The CUDA load engine of another commit against this one, in one process on one host.

    python bench/engine/engine_ab.py --prepare REV  # here: REV's engine into .engine_ab/
    python3 bench/engine/engine_ab.py --out $OUT  # GPU machine (carry .engine_ab, .whl)

GPU hosts differ by a third in what they copy (bench/results/engine.md), so a change to the
engine is judged by loads of both versions on the same host, interleaved.

``--prepare`` writes REV's client package (from git) under ``.engine_ab/``, its engine
importable as ``engine_ab_old`` (git-ignored: name it in the device call's carry). The run
writes a 10 GB tensorizer file with its layout manifest (bench/engine/engine_gpu.py's tensors),
serves it with a real ``tensor-registry serve`` (bench/engine/url_ceiling.py), and for each arm
loads it ``--rounds`` times with each version, verified on the device, 12 readers, the order of
the two alternating from round to round; the first load of each is compared with the source
tensors. Prints the median GB/s of each and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
OLD = ROOT / ".engine_ab"
GB = 1e9


def prepare(rev: str) -> None:
    """REV's client package, with its engine importable as ``engine_ab_old``, under .engine_ab/.

    The engine imports its neighbours in the client (the layout format, the transport, trust),
    so the whole client package of REV is written as ``engine_ab_old_client`` (imports
    rewritten: ``tensor_registry``, or ``app.client`` before the library had its own name) and
    ``engine_ab_old`` is that copy's engine."""
    if OLD.exists():
        shutil.rmtree(OLD)
    listing: list[str] = []
    package = ""
    for package in ("tensor_registry/", "app/client/"):
        listing = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", rev, package],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        if listing:
            break
    client = OLD / "engine_ab_old_client"
    for name in listing:
        text = subprocess.run(
            ["git", "show", f"{rev}:{name}"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        if name.endswith(".py"):
            text = re.sub(rb"\b(app\.client|tensor_registry)\b", b"engine_ab_old_client", text)
        target = client / name[len(package) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text)
    shim = OLD / "engine_ab_old"
    shim.mkdir(parents=True, exist_ok=True)
    (shim / "__init__.py").write_text(
        "import sys\n\nimport engine_ab_old_client.engine as _engine\n\n"
        "sys.modules[__name__] = _engine\n"
    )
    sha = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    (OLD / "REV").write_text(sha + "\n")
    print(f"{len(listing)} files of {rev}'s {package} in {client}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prepare", metavar="REV", help="write REV's engine, then stop")
    parser.add_argument("--size-gb", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arms", nargs="+", help="only these arms (e.g. 'url serve')")
    parser.add_argument("--workdir", default="/tmp/engine-ab")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return 0

    from bench.engine.engine_gpu import make_state, write_artifact
    from bench.engine.url_ceiling import SENDFILE_THREADS, serve

    work = Path(args.workdir)
    name = "artifacts/bench/model.tensors"
    path = work / name
    state = make_state(int(args.size_gb * GB))
    manifest = write_artifact(path, state)
    size = path.stat().st_size
    pinned = _pinned_copy_gbps(size)
    log: dict[str, Any] = {"rev": (OLD / "REV").read_text().strip(), "pinned_gbps": pinned}
    print(f"old = {log['rev']}; pinned copy {pinned:.1f} GB/s", flush=True)
    manifests, versions = _versions(manifest)
    with serve(work, name, SENDFILE_THREADS) as (url, _):
        arms: dict[str, dict[str, Any]] = {
            "file register=0.5": {"path": path, "register_fraction": 0.5},
            "file register=1.0": {"path": path, "register_fraction": 1.0},
            "file register=0": {"path": path, "register_fraction": 0.0},
            "url serve": {"url": url},
        }
        for label, options in arms.items():
            if args.arms and label not in args.arms:
                continue
            rates = _interleaved(versions, manifests, options, state, size, args.rounds, label)
            log[label] = _summary(label, rates, size, pinned)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "engine_ab.json").write_text(json.dumps(log, indent=1))
    return 0


def _pinned_copy_gbps(size: int) -> float:
    """One pinned host → device copy of ``size`` bytes: the baseline of the run."""
    import torch

    from bench.engine.engine_gpu import timed

    pair = [torch.empty(size, dtype=torch.uint8, pin_memory=True)]
    pair.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
    rate = size / timed(lambda: pair[1].copy_(pair[0], non_blocking=True))[0] / GB
    pair.clear()
    torch.cuda.empty_cache()
    return rate


def _versions(manifest: Any) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """Each version's manifest (the same JSON read as its own layout type) and its
    (load_cuda, wait_released)."""
    sys.path.insert(0, str(OLD))
    import engine_ab_old  # type: ignore[import-not-found]

    try:  # where the layout format lives in the old revision
        import engine_ab_old_client.formats.layout as old_layout  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        import engine_ab_old_client.layout as old_layout  # type: ignore[import-not-found]

    from tensor_registry import engine

    manifests = {"old": old_layout._file_from_json(manifest.to_json()), "new": manifest}
    versions = {
        "old": (engine_ab_old.load_cuda, engine_ab_old.wait_released),
        "new": (engine.load_cuda, engine.wait_released),
    }
    return manifests, versions


def _interleaved(
    versions: dict[str, tuple[Any, Any]],
    manifests: dict[str, Any],
    options: dict[str, Any],
    state: dict[str, Any],
    size: int,
    rounds: int,
    label: str,
) -> dict[str, list[float]]:
    """GB/s of each version's loads, ``rounds`` each, the order alternating round by round;
    each version's first load is compared with the source tensors."""
    import torch

    from bench.engine.engine_gpu import timed

    rates: dict[str, list[float]] = {"old": [], "new": []}
    for round_ in range(rounds):
        order = ("old", "new") if round_ % 2 == 0 else ("new", "old")
        for which in order:
            load, released = versions[which]
            seconds, loaded = timed(
                lambda load=load, which=which: load(
                    manifests[which],
                    device="cuda",
                    verify=True,
                    readers=12,
                    digest_on="device",
                    **options,
                )
            )
            if round_ == 0:
                bad = [k for k in state if not torch.equal(loaded[k], state[k])]
                assert not bad, f"{which} {label}: differs from the source: {bad[:3]}"
            del loaded
            released()
            rates[which].append(size / seconds / GB)
    return rates


def _summary(label: str, rates: dict[str, list[float]], size: int, pinned: float) -> dict[str, Any]:
    """The arm's line (medians, per-round ratios), printed; its figures for the JSON."""
    ratios = [n / o for o, n in zip(rates["old"], rates["new"], strict=True)]
    old, new = statistics.median(rates["old"]), statistics.median(rates["new"])
    print(
        f"{label:18s} old {old:5.1f} GB/s ({old / pinned:.2f}x)  new {new:5.1f} GB/s "
        f"({new / pinned:.2f}x)  new/old per round: median {statistics.median(ratios):.2f}"
        f" [{min(ratios):.2f}-{max(ratios):.2f}]",
        flush=True,
    )
    return {**rates, "ratio_median": statistics.median(ratios)}


if __name__ == "__main__":
    raise SystemExit(main())
