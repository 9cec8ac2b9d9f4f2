"""The Hugging Face door against the registry's own client: the same artifact's files, same run.

A real ``tensor-registry serve --no-worker`` (local storage) holds a tensorized artifact of about
``--size-gb`` (one ``model.tensors`` plus config and tokenizer). Each round, interleaved:

- ``hf``: ``huggingface_hub.snapshot_download(NAME, revision="1.float32.hf.tp1")`` with
  ``HF_ENDPOINT`` the registry, in a fresh process with a fresh ``HF_HOME`` (the client's cache:
  blobs/ + symlinks), Xet off;
- ``pull``: ``tensor-registry pull NAME:1 --dtype float32 --format hf --weights --dest D
  --cache-dir C`` with a fresh node cache and destination (the registry's own path: resolve,
  signed blob URLs, sha256 checked).

Both write every byte to disk once. Ratio = pull seconds ÷ hf seconds (≥ 1: the door is as fast
as the registry's own client), best of ``--rounds`` per arm, and the median.

    .venv/bin/python bench/serving/hf_door.py --size-gb 1 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import ADMIN_TOKEN, GB, ROOT, SIGNING_KEY, bench_dirs, gbps, serve_no_worker

NAME = "bench/hf-door"
REVISION = "1.float32.hf.tp1"
CONFIG = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'

HF_SNIPPET = """
import sys
from huggingface_hub import snapshot_download
print(snapshot_download(sys.argv[1], revision=sys.argv[2], max_workers=8))
"""


def _published(url: str, data_dir: Path, size_gb: float) -> dict[str, int]:
    """Model NAME, version 1 (a tiny source) and a float32 hf artifact of about size_gb."""
    import httpx
    import torch

    from app.settings import Settings
    from harness.artifacts import make_artifact
    from harness.hf_bytes import tiny_safetensors

    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
    ) as http:
        model = http.post("/api/v1/models", json={"name": NAME}).json()
        http.post(f"/api/v1/models/{model['id']}/versions", json={})
        for path, data in (("config.json", CONFIG), ("model.safetensors", tiny_safetensors())):
            r = http.put(f"/api/v1/models/{model['id']}/versions/1/files/{path}", content=data)
            r.raise_for_status()
        http.post(f"/api/v1/models/{model['id']}/versions/1/finalize").raise_for_status()
    settings = Settings(
        data_dir=data_dir,
        database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
        storage={},  # type: ignore[arg-type]
        security={"signing_key": SIGNING_KEY},  # type: ignore[arg-type]
    )
    per_tensor = 32 * 1024 * 1024 // 4
    generator = torch.Generator().manual_seed(0)
    state = {
        f"layer.{i}.weight": torch.rand(per_tensor, generator=generator)
        for i in range(max(1, int(size_gb * GB) // (per_tensor * 4)))
    }
    made = asyncio.run(make_artifact(settings, model=NAME, version=1, sources=[state]))
    return {path: len(data) for path, data in made.files.items()}


def _hf(url: str, work: Path) -> float:
    home = Path(tempfile.mkdtemp(prefix="hf-home-", dir=work))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TENSOR_REGISTRY_"))},
        "HF_ENDPOINT": url,
        "HF_TOKEN": ADMIN_TOKEN,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", HF_SNIPPET, NAME, REVISION],
        env=env,
        check=True,
        cwd=work,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    shutil.rmtree(home)
    return seconds


def _pull(url: str, work: Path) -> float:
    scratch = Path(tempfile.mkdtemp(prefix="pull-", dir=work))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")},
        "PYTHONPATH": str(ROOT),
        "TENSOR_REGISTRY_URL": url,
        "TENSOR_REGISTRY_TOKEN": ADMIN_TOKEN,
        "XDG_CONFIG_HOME": str(scratch / "config"),
    }
    command = [sys.executable, "-m", "tensor_registry.cli", "pull", f"{NAME}:1"]
    command += ["--dtype", "float32", "--format", "hf", "--weights"]
    command += ["--dest", str(scratch / "dest"), "--cache-dir", str(scratch / "cache")]
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, cwd=work, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch)
    return seconds


def _curl(url: str, work: Path, headers: dict[str, str]) -> float:
    """One plain GET of ``url`` to /dev/null: the server's side of an arm, without a client's."""
    command = ["curl", "-sfS", "-o", "/dev/null", url]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=work)
    return time.perf_counter() - started


def _signed_weights_url(url: str) -> str:
    import httpx

    answer = httpx.get(
        f"{url}/api/v1/resolve",
        params={"model": NAME, "ref": "1", "dtype": "float32", "format": "hf"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ).json()
    return str(answer["tensorizer_uri"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default=os.environ.get("BENCH_DIR", "/tmp/bench-hf-door"))
    parser.add_argument("--out", default=os.environ.get("BENCH_OUT", "/tmp/bench-hf-door/out"))
    args = parser.parse_args()
    work, out = bench_dirs(args.workdir, args.out)
    data_dir = Path(tempfile.mkdtemp(prefix="registry-", dir=work))
    rows: dict[str, list[float]] = {"hf": [], "pull": [], "curl-door": [], "curl-blob": []}
    try:
        with serve_no_worker(
            data_dir,
            {
                "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
                "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
            },
        ) as url:
            files = _published(url, data_dir, args.size_gb)
            total = sum(files.values())
            print(f"artifact: {total / GB:.2f} GB in {len(files)} files; {os.cpu_count()} CPUs")
            door_url = f"{url}/{NAME}/resolve/{REVISION}/model.tensors"
            auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            blob_url = _signed_weights_url(url)
            runs = {
                "hf": lambda: _hf(url, work),
                "pull": lambda: _pull(url, work),
                # The weights file alone over one connection: the door's route and the signed
                # blob URL resolve hands out, both ending in app.blobs' sendfile.
                "curl-door": lambda: _curl(door_url, work, auth),
                "curl-blob": lambda: _curl(blob_url, work, {}),
            }
            for round_ in range(args.rounds):
                # Alternate which arm goes first, so neither always meets a warmer page cache.
                arms = ("hf", "pull") if round_ % 2 == 0 else ("pull", "hf")
                arms += (
                    ("curl-door", "curl-blob") if round_ % 2 == 0 else ("curl-blob", "curl-door")
                )
                for arm in arms:
                    seconds = runs[arm]()
                    rows[arm].append(seconds)
                    rate = gbps(total, seconds)
                    print(f"round {round_ + 1} {arm:4s} {seconds:6.2f} s  {rate:5.2f} GB/s")
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    best = {arm: min(times) for arm, times in rows.items()}
    median = {arm: statistics.median(times) for arm, times in rows.items()}
    result = {
        "bytes": total,
        "cpus": os.cpu_count(),
        "seconds": rows,
        "best_ratio": best["pull"] / best["hf"],
        "median_ratio": median["pull"] / median["hf"],
        "curl_best_ratio": best["curl-blob"] / best["curl-door"],
        "curl_median_ratio": median["curl-blob"] / median["curl-door"],
    }
    print(
        f"hf door ÷ pull (throughput): best {result['best_ratio']:.2f}x "
        f"({gbps(total, best['hf']):.2f} vs {gbps(total, best['pull']):.2f} GB/s), "
        f"median {result['median_ratio']:.2f}x"
    )
    print(
        f"door route ÷ signed blob URL, weights file by curl: best {result['curl_best_ratio']:.2f}x"
        f", median {result['curl_median_ratio']:.2f}x"
    )
    (out / "hf_door.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
