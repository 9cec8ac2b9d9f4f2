"""The Hugging Face door against the registry's own client and against nginx: same files, same run.

A real ``tensor-registry serve --no-worker`` (local storage) holds a tensorized float32 ``hf``
artifact of about ``--size-gb``: one ``model.tensors`` (what a tensorized variant is, one file
per rank) plus ``config.json`` and ``tokenizer.json``. Each round, interleaved, the order of the
arms rotating:

- ``hf``: ``huggingface_hub.snapshot_download(NAME, revision="1.float32.hf.tp1")`` with
  ``HF_ENDPOINT`` the registry, in a fresh process with a fresh ``HF_HOME`` (the client's cache:
  blobs/ + symlinks), Xet off;
- ``hf-nginx``: the same call, same client, with ``HF_ENDPOINT`` an nginx (``sendfile on``)
  serving a static copy of the door's answers (repo info, tree, the Hub's headers) and hard
  links to the same stored files: the client's ceiling, a server that does nothing per byte;
- ``pull``: ``tensor-registry pull NAME:1 --dtype float32 --format hf --weights --dest D
  --cache-dir C`` with a fresh node cache and destination (the registry's own path: resolve,
  signed blob URLs, parallel ranges, sha256 checked), its defaults as users run it;
- ``curl-door`` / ``curl-blob`` / ``curl-nginx``: the weights file alone, ``curl -o /dev/null``,
  through the door's route (bearer token), the signed blob URL resolve hands out, and nginx: the
  servers without either client.

Each arm records wall seconds, the client's CPU seconds (its process tree, from ``rusage``) and
the server's (the registry's process, or nginx's master and workers). All write every byte to
disk once (curl excepted). Ratios are throughput ratios (baseline seconds ÷ arm seconds: ≥ 1 is
as fast as the baseline), from the medians and from the best of ``--rounds``.

    .venv/bin/python bench/serving/hf_door.py --size-gb 1 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import (
    ADMIN_TOKEN,
    GB,
    ROOT,
    SIGNING_KEY,
    bench_dirs,
    cpu_seconds,
    gbps,
    nginx_server,
    serve_no_worker,
    serving_processes,
)

NAME = "bench/hf-door"
REVISION = "1.float32.hf.tp1"
CONFIG = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'
CLIENT_ARMS = ("hf", "hf-nginx", "pull")
CURL_ARMS = ("curl-door", "curl-blob", "curl-nginx")

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


def _static_mirror(url: str, data_dir: Path, root: Path) -> tuple[str, str]:
    """The door's answers for ``snapshot_download(NAME, revision=REVISION)`` as static files
    under ``root`` (repo info, the recursive tree) and hard links to the artifact's stored files
    (the same inodes, the same page cache); returns the revision's commit and the nginx
    locations that add the Hub's headers (``X-Repo-Commit``, ``X-Linked-Etag``,
    ``X-Linked-Size``) to each file."""
    import httpx

    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
    ) as http:
        info = http.get(f"/api/models/{NAME}/revision/{REVISION}")
        info.raise_for_status()
        commit = info.json()["sha"]
        tree = http.get(f"/api/models/{NAME}/tree/{commit}", params={"recursive": "true"})
        tree.raise_for_status()
    api = root / "api" / "models" / NAME
    for path, body in ((f"revision/{REVISION}", info.content), (f"tree/{commit}", tree.content)):
        (api / path).parent.mkdir(parents=True, exist_ok=True)
        (api / path).write_bytes(body)
    artifact = data_dir / "storage" / "artifacts" / info.json()["tensorRegistry"]["artifact_id"]
    files = root / NAME / "resolve" / commit
    files.mkdir(parents=True)
    locations = ["default_type application/octet-stream;", "location /api/ {"]
    locations += ["    default_type application/json;", "}"]
    for entry in tree.json():
        stored = artifact / entry["path"]
        if stored.stat().st_size != entry["size"]:
            raise RuntimeError(f"{stored} is not the door's {entry['path']}")
        os.link(stored, files / entry["path"])
        locations += [
            f"location = /{NAME}/resolve/{commit}/{entry['path']} {{",
            f"    add_header X-Repo-Commit {commit};",
            f"    add_header X-Linked-Etag '\"{entry['lfs']['oid']}\"';",
            f"    add_header X-Linked-Size {entry['size']};",
            "}",
        ]
    return commit, "\n".join(locations)


def _hf_command(endpoint: str, work: Path) -> tuple[list[str], dict[str, str], Path]:
    home = Path(tempfile.mkdtemp(prefix="hf-home-", dir=work))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TENSOR_REGISTRY_"))},
        "HF_ENDPOINT": endpoint,
        "HF_TOKEN": ADMIN_TOKEN,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    return [sys.executable, "-c", HF_SNIPPET, NAME, REVISION], env, home


def _pull_command(url: str, work: Path) -> tuple[list[str], dict[str, str], Path]:
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
    return command, env, scratch


def _curl_command(url: str, headers: dict[str, str]) -> list[str]:
    """One plain GET of ``url`` to /dev/null: the server's side of an arm, without a client's."""
    command = ["curl", "-sfS", "-o", "/dev/null", url]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    return command


def _timed(
    command: list[str], env: dict[str, str] | None, work: Path, server: list[Any]
) -> dict[str, float]:
    """Wall seconds of ``command``, its CPU seconds and minor page faults (the child and what it
    waited for: fresh memory the client touches, its buffers) and the server processes' CPU
    seconds over the same span."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    served = cpu_seconds(server)
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, cwd=work, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    return {
        "seconds": seconds,
        "client_cpu": client,
        "client_faults": after.ru_minflt - children.ru_minflt,
        "server_cpu": cpu_seconds(server) - served,
    }


def _signed_weights_url(url: str) -> str:
    import httpx

    answer = httpx.get(
        f"{url}/api/v1/resolve",
        params={"model": NAME, "ref": "1", "dtype": "float32", "format": "hf"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ).json()
    return str(answer["tensorizer_uri"])


def _arms(
    url: str, nginx_url: str, commit: str, work: Path
) -> dict[str, Callable[[], dict[str, float]]]:
    registry, nginx = serving_processes(url), serving_processes(nginx_url)

    def client(
        make: Callable[[], tuple[list[str], dict[str, str], Path]], server: list[Any]
    ) -> Callable[[], dict[str, float]]:
        """An arm that runs a client in a fresh scratch folder (its cache, its destination),
        removed after the timing."""

        def run() -> dict[str, float]:
            command, env, scratch = make()
            try:
                return _timed(command, env, work, server)
            finally:
                shutil.rmtree(scratch)

        return run

    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    weights = f"{NAME}/resolve/{REVISION}/model.tensors"
    nginx_weights = f"{NAME}/resolve/{commit}/model.tensors"
    blob_url = _signed_weights_url(url)
    return {
        "hf": client(lambda: _hf_command(url, work), registry),
        "hf-nginx": client(lambda: _hf_command(nginx_url, work), nginx),
        "pull": client(lambda: _pull_command(url, work), registry),
        "curl-door": lambda: _timed(_curl_command(f"{url}/{weights}", auth), None, work, registry),
        "curl-blob": lambda: _timed(_curl_command(blob_url, {}), None, work, registry),
        "curl-nginx": lambda: _timed(
            _curl_command(f"{nginx_url}/{nginx_weights}", {}), None, work, nginx
        ),
    }


def _summary(rows: dict[str, list[dict[str, float]]], total: int) -> dict[str, Any]:
    """Per arm the median and best seconds, median CPU and faults; the ratios the note reports."""
    arms = {
        arm: {
            "median_s": statistics.median(r["seconds"] for r in runs),
            "best_s": min(r["seconds"] for r in runs),
            "client_cpu_s": statistics.median(r["client_cpu"] for r in runs),
            "server_cpu_s": statistics.median(r["server_cpu"] for r in runs),
            "client_faults": statistics.median(r["client_faults"] for r in runs),
        }
        for arm, runs in rows.items()
    }

    def ratio(arm: str, baseline: str) -> dict[str, float]:
        base, this = arms[baseline], arms[arm]
        return {kind: base[f"{kind}_s"] / this[f"{kind}_s"] for kind in ("median", "best")}

    return {
        "bytes": total,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "arms": arms,
        "runs": rows,
        "ratios": {
            "hf door ÷ pull": ratio("hf", "pull"),
            "hf door ÷ hf client against nginx (ceiling)": ratio("hf", "hf-nginx"),
            "hf client against nginx ÷ pull": ratio("hf-nginx", "pull"),
            "curl: door route ÷ signed blob URL": ratio("curl-door", "curl-blob"),
            "curl: door route ÷ nginx": ratio("curl-door", "curl-nginx"),
        },
    }


def _print_summary(result: dict[str, Any]) -> None:
    total = result["bytes"]
    for arm, row in result["arms"].items():
        print(
            f"{arm:10s} median {row['median_s']:6.2f} s ({gbps(total, row['median_s']):4.2f} GB/s)"
            f"  best {row['best_s']:6.2f} s  CPU client {row['client_cpu_s']:5.2f} s"
            f"  server {row['server_cpu_s']:5.2f} s  client faults {row['client_faults']:7.0f}"
        )
    for name, ratio in result["ratios"].items():
        print(f"{name}: median {ratio['median']:.2f}x, best {ratio['best']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workdir", default=os.environ.get("BENCH_DIR", "/tmp/bench-hf-door"))
    parser.add_argument("--out", default=os.environ.get("BENCH_OUT", "/tmp/bench-hf-door/out"))
    args = parser.parse_args()
    work, out = bench_dirs(args.workdir, args.out)
    data_dir = Path(tempfile.mkdtemp(prefix="registry-", dir=work))
    mirror = Path(tempfile.mkdtemp(prefix="nginx-root-", dir=work))
    mirror.chmod(0o755)
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in CLIENT_ARMS + CURL_ARMS}
    env = {
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    try:
        with serve_no_worker(data_dir, env) as url:
            files = _published(url, data_dir, args.size_gb)
            total = sum(files.values())
            commit, locations = _static_mirror(url, data_dir, mirror)
            print(f"artifact: {total / GB:.2f} GB in {len(files)} files; {os.cpu_count()} CPUs")
            with nginx_server(mirror, locations) as nginx_url:
                runs = _arms(url, nginx_url, commit, work)
                for round_ in range(args.rounds):
                    # Rotate the order, so no arm always meets a warmer page cache or a quieter
                    # machine.
                    turn = round_ % 3
                    order = CLIENT_ARMS[turn:] + CLIENT_ARMS[:turn]
                    order += CURL_ARMS[turn:] + CURL_ARMS[:turn]
                    for arm in order:
                        row = runs[arm]()
                        rows[arm].append(row)
                        print(
                            f"round {round_ + 1} {arm:10s} {row['seconds']:6.2f} s "
                            f"{gbps(total, row['seconds']):5.2f} GB/s  CPU client "
                            f"{row['client_cpu']:5.2f} s server {row['server_cpu']:5.2f} s",
                            flush=True,
                        )
    finally:
        shutil.rmtree(mirror, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    result = _summary(rows, total)
    _print_summary(result)
    (out / "hf_door.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
