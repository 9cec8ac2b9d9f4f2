"""The OCI door's throughput: ``oras pull`` of a variant ÷ ``tensor-registry pull`` of the same
files, same run.

A real `tensor-registry serve` (embedded: SQLite + local storage) holds a tensorizer artifact of
``--size-gb`` float32 tensors plus config and tokenizer files. Interleaved, best of ``--runs``
each, both as the command a user runs (a fresh process, empty destination):

- pull: ``tensor-registry pull acme/bench:1 --dtype float32 --weights --dest D --cache-dir C``
        (a fresh node cache each run: resolve, parallel ranged reads, sha256 checked);
- oras: the oras Python SDK (``OrasClient.login`` with the token, ``pull`` of
        ``HOST/acme/bench:1.float32.hf.tp1``): the token flow, the manifest, then each blob
        through ``/v2/…/blobs/sha256:…`` (served with sendfile by the blob path).

Prints seconds, GB/s, the files' equality and the ratio oras ÷ pull (target ≥ 0.9).

    .venv/bin/python bench/serving/oci_pull.py [--size-gb 1] [--runs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import GB, write_tensorized  # noqa: E402
from bench.engine.load import (  # noqa: E402
    ADMIN_TOKEN,
    Registry,
    ready_version,
    register_artifact,
    registry,
)

MODEL = "acme/bench"
TAG = "1.float32.hf.tp1"
ORAS_PULL = """
import sys, oras.client
host, target, out, config, token = sys.argv[1:6]
client = oras.client.OrasClient(hostname=host, insecure=True)
client.login(username="bench", password=token, hostname=host, config_path=config)
client.pull(target=target, outdir=out, config_path=config)
"""


def digests(folder: Path) -> dict[str, str]:
    found = {}
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.startswith("."):  # an older pull's own record
            digest = hashlib.sha256()
            with path.open("rb") as fh:
                while block := fh.read(16 << 20):
                    digest.update(block)
            found[path.name] = digest.hexdigest()
    return found


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command[:4]} failed: {done.stderr[-2000:]}")
    return elapsed


def _publish(reg: Registry, work: Path, size_gb: float) -> int:
    """Version 1 of MODEL and its float32 artifact (weights, config, tokenizer) in the registry;
    returns the artifact's bytes in storage."""
    ready_version(reg, MODEL)
    weights = work / "model.tensors"
    write_tensorized(weights, int(size_gb * GB))
    config = work / "config.json"
    config.write_bytes(b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    tokenizer = work / "tokenizer.json"
    tokenizer.write_bytes(b'{"version": "1.0", "model": {"type": "BPE"}}')
    register_artifact(
        reg,
        MODEL,
        1,
        {"model.tensors": weights, "config.json": config, "tokenizer.json": tokenizer},
        dtype="float32",
    )
    stored = (reg.settings().local_storage_root / "artifacts").rglob("*")
    return sum(p.stat().st_size for p in stored if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="work directory (default: tmp)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-oci-", dir=args.dir))
    try:
        with registry(work / "data") as reg:
            size = _publish(reg, work, args.size_gb)
            host = reg.url.removeprefix("http://")
            env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")} | {
                "PYTHONPATH": str(ROOT),
                "TENSOR_REGISTRY_URL": reg.url,
                "TENSOR_REGISTRY_TOKEN": ADMIN_TOKEN,
                "XDG_CONFIG_HOME": str(work / "xdg"),
            }
            arms: dict[str, list[float]] = {"pull": [], "oras": []}
            same = True
            for run in range(args.runs):
                for arm in ("pull", "oras") if run % 2 == 0 else ("oras", "pull"):
                    dest = work / f"{arm}-{run}"
                    if arm == "pull":
                        command = [
                            sys.executable, "-m", "tensor_registry.cli", "pull", MODEL + ":1",
                            "--dtype", "float32", "--weights", "--dest", str(dest),
                            "--cache-dir", str(work / f"cache-{run}"),
                        ]  # fmt: skip
                    else:
                        command = [
                            sys.executable, "-c", ORAS_PULL, host, f"{host}/{MODEL}:{TAG}",
                            str(dest), str(work / "docker-config.json"), ADMIN_TOKEN,
                        ]  # fmt: skip
                    arms[arm].append(timed(command, env))
                    print(f"run {run} {arm:5s} {arms[arm][-1]:.2f} s", flush=True)
                pulled, orased = digests(work / f"pull-{run}"), digests(work / f"oras-{run}")
                if any(orased.get(name) != digest for name, digest in pulled.items()):
                    print(f"differ: pull {pulled} oras {orased}", flush=True)
                    same = False
                for folder in (f"pull-{run}", f"oras-{run}", f"cache-{run}"):
                    shutil.rmtree(work / folder, ignore_errors=True)
            best = {arm: min(times) for arm, times in arms.items()}
            ratio = best["pull"] / best["oras"]
            figures = {
                "bytes": size,
                "runs": arms,
                "best_seconds": best,
                "gbps": {arm: size / seconds / GB for arm, seconds in best.items()},
                "oras_over_pull": ratio,
                "same_bytes": same,
                "cpus": os.cpu_count(),
                "load_average": os.getloadavg(),
            }
            print(json.dumps(figures, indent=2))
            print(f"oras ÷ pull throughput: {ratio:.2f}x (target >= 0.9); same bytes: {same}")
            if args.out is not None:
                args.out.write_text(json.dumps(figures, indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
