"""Client commands of `tensor-registry`: publish, tensorize, resolve, pull, vllm-args.

Exit codes: 0 success, 1 an error (one line on stderr: what happened and the registry's stable
``code``; a refused finalize adds one line per problem), 2 a usage error (argparse), 130
interrupted, 141 stdout closed by its reader (`| head`; nothing printed about it). Progress
bars go to stderr and only on a terminal; stdout carries results (JSON, the `vllm serve`
command) so that they can be piped.

The server URL and token come from --url/--token, else TENSOR_REGISTRY_URL/TENSOR_REGISTRY_TOKEN,
else what `tensor-registry login` stored (app/client/config.py; read here because the client
runs without the server's settings machinery).

Flags follow vLLM's vocabulary (`--tensor-parallel-size`/`-tp`, `--dtype`) so that a command the
web UI or the docs print runs here unchanged, and what `pull` prints runs in vLLM.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app.client.api import (
    InvalidRequest,
    KeyAccessRequired,
    RegistryClient,
    RegistryError,
    Resolution,
    SignatureExpired,
    parse_model_ref,
)
from app.client.cache import DEFAULT_READERS, NodeCache
from app.client.config import connection
from app.client.output import format_size, print_json

KEYFILE_NAME = "tensorizer.key"
MANIFEST_NAME = ".tensor-registry.json"
UPLOAD_CHUNK = 1024 * 1024

Command = Callable[[argparse.Namespace, RegistryClient], int]


class UsageError(Exception):
    """Bad arguments that argparse cannot see (exit 2)."""


# ---------------------------------------------------------------------------------------------
# Registration


DTYPES = ["float16", "bfloat16", "float32"]
FORMATS = ["hf", "vllm"]


def connection_parser() -> argparse.ArgumentParser:
    """--url/--token, shared by every command that talks to the registry."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=None,
        help="registry URL, 'host:port' is fine (default: $TENSOR_REGISTRY_URL, then the "
        "`login` file, then http://127.0.0.1:8000)",
    )
    common.add_argument(
        "--token",
        default=None,
        help="API token (default: $TENSOR_REGISTRY_TOKEN, then the `login` file)",
    )
    return common


def add_tensor_parallel_size(parser: argparse.ArgumentParser, **kwargs: Any) -> None:
    parser.add_argument(
        "-tp",
        "--tensor-parallel-size",
        dest="tp",
        type=int,
        metavar="N",
        help="tensor-parallel size, as vLLM's flag",
        **kwargs,
    )
    # The first spelling, kept so existing scripts run.
    parser.add_argument("--tp", dest="tp", type=int, help=argparse.SUPPRESS)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = connection_parser()

    choice = argparse.ArgumentParser(add_help=False)
    choice.add_argument("model", metavar="NS/NAME[:REF]", help="model, optionally :alias|:N")
    choice.add_argument("--dtype", choices=DTYPES)
    choice.add_argument("--format", choices=FORMATS)
    add_tensor_parallel_size(choice)
    choice.add_argument(
        "--encrypted",
        dest="encrypted",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only encrypted (--encrypted) or only plain (--no-encrypted) artifacts "
        "(the resolve API's `encrypted` filter); default: either",
    )
    choice.add_argument(
        "--unencrypted", dest="encrypted", action="store_false", help=argparse.SUPPRESS
    )
    choice.add_argument("--ttl", type=int, help="lifetime of the signed URLs, seconds")
    choice.add_argument("--num-readers", type=int, help="tensorizer readers to advise")

    publish = sub.add_parser(
        "publish",
        parents=[common],
        help="upload a Hugging Face model directory as a new version (resumable)",
        description="Create the model if missing, upload every file of DIR into a draft "
        "version (files already there with the same sha256 are skipped, so an interrupted "
        "publish resumes), then finalize. Prints the version.",
    )
    publish.add_argument("directory", metavar="DIR", type=Path)
    publish.add_argument(
        "--json", action="store_true", help="print the version's JSON instead of its number"
    )
    publish.add_argument("--model", required=True, metavar="NS/NAME")
    publish.add_argument("--description", default="")
    publish.add_argument(
        "--new-version",
        action="store_true",
        help="always make a new version: neither resume a draft nor reuse an identical "
        "latest version",
    )
    publish.set_defaults(func=_guard(cmd_publish))

    tensorize = sub.add_parser(
        "tensorize",
        parents=[common],
        help="serialize a version with tensorizer (a job on a worker)",
    )
    tensorize.add_argument("model", metavar="NS/NAME[:REF]")
    tensorize.add_argument("--dtype", required=True, choices=DTYPES)
    tensorize.add_argument("--format", required=True, choices=FORMATS)
    add_tensor_parallel_size(tensorize, default=1)
    tensorize.add_argument(
        "--encrypted", "--encrypt", dest="encrypt", action="store_true", help="encrypt the weights"
    )
    tensorize.add_argument("--storage", help="storage backend (default: the registry's)")
    tensorize.add_argument("--wait", action="store_true", help="follow the job to its end")
    tensorize.add_argument(
        "--json", action="store_true", help="print the job's (or ready artifact's) JSON"
    )
    tensorize.set_defaults(func=_guard(cmd_tensorize))

    resolve = sub.add_parser(
        "resolve", parents=[common, choice], help="signed URLs and loader settings"
    )
    resolve.add_argument("--json", action="store_true", help="print the registry's JSON")
    resolve.set_defaults(func=_guard(cmd_resolve))

    pull = sub.add_parser(
        "pull",
        parents=[common, choice],
        help="fetch config/tokenizer files (and weights) and print the vllm serve command",
        description="Writes config and tokenizer files into DEST, the key file (mode 0600) for "
        "encrypted artifacts, and with --weights the weights too (parallel ranged reads, "
        "sha256-checked). Files come through the node cache, so pulling the same bytes again "
        "downloads nothing. Prints the `vllm serve` command on stdout.",
    )
    pull.add_argument("--dest", required=True, type=Path, metavar="DIR")
    pull.add_argument("--weights", action="store_true", help="download the weights as well")
    pull.add_argument(
        "--readers", type=int, default=DEFAULT_READERS, help="parallel range readers per file"
    )
    pull.add_argument("--cache-dir", type=Path, help="node cache (default: ~/.cache/...)")
    _loader_flag(pull)
    pull.set_defaults(func=_guard(cmd_pull))

    vllm_args = sub.add_parser(
        "vllm-args",
        parents=[common, choice],
        help="print the vLLM arguments for an artifact",
        description="Prints `--load-format tensorizer --model-loader-extra-config '{...}'` "
        "shell-quoted, for eval: "
        'eval "vllm serve DIR $(tensor-registry vllm-args NS/NAME:REF)".',
    )
    vllm_args.add_argument(
        "--keyfile",
        default=KEYFILE_NAME,
        help="local key file vLLM should read (encrypted artifacts; see `pull`)",
    )
    vllm_args.add_argument(
        "--embed-key-url",
        action="store_true",
        help="put the signed key URL itself in the config (vLLM logs it)",
    )
    _loader_flag(vllm_args)
    vllm_args.set_defaults(func=_guard(cmd_vllm_args))


def _loader_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loader",
        choices=["tensorizer", "tensor-registry"],
        default="tensorizer",
        help="the vLLM load format to print: tensorizer (vLLM's tensorizer loader, default) or "
        "tensor-registry (the load engine through this package's vLLM plugin; "
        "docs/vllm-loader-plugin.md)",
    )


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _print_problems(exc: RegistryError) -> None:
    """The per-file findings of a refused finalize/import (`problems` of the problem body)."""
    for problem in exc.problem.get("problems") or []:
        if isinstance(problem, dict):
            where = problem.get("path") or "(version)"
            print(
                f"  {where}: {_one_line(str(problem.get('message') or ''))} "
                f"({problem.get('code') or 'problem'})",
                file=sys.stderr,
            )


def _guard(command: Command) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            conn = connection(getattr(args, "url", None), getattr(args, "token", None))
            args.token_source = conn.token_source
            with RegistryClient(conn.url, conn.token or "") as client:
                return command(args, client)
        except UsageError as exc:
            print(f"usage error: {_one_line(str(exc))}", file=sys.stderr)
            return 2
        except RegistryError as exc:
            print(f"error: {_one_line(str(exc))}", file=sys.stderr)
            _print_problems(exc)
            return 1
        except BrokenPipeError:
            raise  # the reader of stdout left: main() ends quietly
        except OSError as exc:
            print(f"error: {_one_line(str(exc))}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return run


def _bar(total: int | None, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=None,  # only on a terminal
        leave=False,
    )


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "dtype": args.dtype,
        "format": args.format,
        "tensor_parallel_size": args.tp,
        "encrypted": args.encrypted,
        "ttl": args.ttl,
        "num_readers": args.num_readers,
    }


def _model_ref(text: str) -> tuple[str, str]:
    try:
        return parse_model_ref(text)
    except InvalidRequest as exc:
        raise UsageError(exc.detail) from exc


# ---------------------------------------------------------------------------------------------
# publish


def _local_files(directory: Path) -> list[str]:
    """Files to publish, as relative POSIX paths; hidden files and folders are skipped."""
    found = []
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        found.append(rel.as_posix())
    return found


def _chunks(path: Path, progress: Callable[[int], None]) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while chunk := fh.read(UPLOAD_CHUNK):
            progress(len(chunk))
            yield chunk


def _identical_latest(
    client: RegistryClient,
    model_id: str,
    versions: list[dict[str, Any]],
    sizes: dict[str, int],
    digests: dict[str, str],
) -> int | None:
    """The latest ready version's number when its files are exactly the local ones."""
    ready = [v for v in versions if v["status"] == "ready"]
    if not ready:
        return None
    latest = max(ready, key=lambda v: v["version"])
    files = latest.get("files") or client.get_version(model_id, int(latest["version"]))["files"]
    remote = {f["path"]: (int(f["size"]), f["sha256"]) for f in files}
    local = {rel: (sizes[rel], digests[rel]) for rel in sizes}
    return int(latest["version"]) if remote == local else None


def cmd_publish(args: argparse.Namespace, client: RegistryClient) -> int:
    directory: Path = args.directory
    if not directory.is_dir():
        raise UsageError(f"{directory} is not a directory")
    name = args.model
    if ":" in name:
        raise UsageError("--model takes NS/NAME without a ref")
    files = _local_files(directory)
    if not files:
        raise UsageError(f"{directory} holds no files to publish")
    model = client.find_model(name)
    if model is None:
        model = client.create_model(name, description=args.description)
        _say(f"created model {name}")
    model_id = str(model["id"])

    sizes = {rel: (directory / rel).stat().st_size for rel in files}
    digests: dict[str, str] = {}
    with _bar(sum(sizes.values()), "hashing") as bar:
        for rel in files:
            digest = hashlib.sha256()
            for chunk in _chunks(directory / rel, bar.update):
                digest.update(chunk)
            digests[rel] = digest.hexdigest()

    version = None
    if not args.new_version:
        versions = client.list_versions(model_id)
        drafts = [v for v in versions if v["status"] == "draft"]
        version = max(drafts, key=lambda v: v["version"]) if drafts else None
        if version is not None:
            _say(f"resuming draft version {version['version']}")
        else:
            same = _identical_latest(client, model_id, versions, sizes, digests)
            if same is not None:
                _say(
                    f"{name} version {same} already holds exactly these {len(files)} files "
                    "(same sizes and sha256): reusing it, nothing uploaded "
                    "(--new-version makes a new one anyway)"
                )
                if args.json:
                    print_json(client.get_version(model_id, same))
                else:
                    print(same)
                return 0
    if version is None:
        version = client.create_version(model_id)
    number = int(version["version"])
    remote = {f["path"]: f for f in version.get("files", [])}

    for stale in sorted(set(remote) - set(files)):
        client.delete_file(model_id, number, stale)
        _say(f"removed {stale} from the draft (not in {directory})")
    pending = [rel for rel in files if remote.get(rel, {}).get("sha256") != digests[rel]]
    skipped = len(files) - len(pending)
    if skipped:
        _say(f"{skipped} file(s) already uploaded, skipped")
    with _bar(sum(sizes[rel] for rel in pending), "uploading") as bar:
        for rel in pending:
            client.upload_file(
                model_id,
                number,
                rel,
                _chunks(directory / rel, bar.update),
                size=sizes[rel],
                sha256=digests[rel],
            )
    final = client.finalize(model_id, number)
    _say(f"{name} version {number} is {final['status']} ({len(files)} files)")
    if args.json:
        print_json(final)
    else:
        print(number)
    return 0


# ---------------------------------------------------------------------------------------------
# tensorize


def cmd_tensorize(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = _model_ref(args.model)
    model = client.get_model(name)
    body: dict[str, Any] = {
        "dtype": args.dtype,
        "format": args.format,
        "tensor_parallel_size": args.tp,
        "encrypt": args.encrypt,
    }
    version = client.version_for_ref(str(model["id"]), ref)
    if version is not None:
        body["version"] = version
    if args.storage:
        body["storage"] = args.storage
    status, payload = client.tensorize(str(model["id"]), body)
    if status == 200:
        _say(f"already tensorized: artifact {payload['id']} is {payload['status']}")
        if args.json:
            print_json(payload)
        else:
            print(payload["id"])
        return 0
    job_id = str(payload["id"])
    _say(f"job {job_id} {payload['status']}")
    if not args.wait:
        if args.json:
            print_json(payload)
        else:
            print(job_id)
        return 0

    return follow_job(client, job_id, as_json=args.json)


def follow_job(client: RegistryClient, job_id: str, *, as_json: bool = False) -> int:
    """Follow a job to its end with a progress bar; prints the artifact id (or the job id).

    Ctrl-C stops following, not the job: it keeps running on the registry, so say how to get
    back to it (`jobs follow`) or stop it (`jobs cancel`).
    """
    bar = _bar(None, "queued")
    lock = threading.Lock()
    job: dict[str, Any] = {}

    def update(job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        with lock:
            bar.set_description(f"{job.get('status')}: {progress.get('stage', '')}")
            if progress.get("bytes_total"):
                bar.total = progress["bytes_total"]
            bar.n = int(progress.get("bytes_done") or 0)
            bar.refresh()

    try:
        _say(f"following job {job_id} (Ctrl-C stops following; the job keeps running)")
        job = client.wait_job(job_id, on_update=update)
    except KeyboardInterrupt:
        bar.close()
        _say(
            f"stopped following job {job_id}; it keeps running on the registry.\n"
            f"  follow it again: tensor-registry jobs follow {job_id}\n"
            f"  stop it:         tensor-registry jobs cancel {job_id}"
        )
        return 130
    finally:
        bar.close()
    if job["status"] == "succeeded":
        _say(f"job {job_id} succeeded: artifact {job.get('artifact_id')}")
        if as_json:
            print_json(job)
        else:
            print(job.get("artifact_id") or job_id)
        return 0
    error = job.get("error") or {}
    raise RegistryError(
        f"job {job_id} {job['status']}: {error.get('detail') or 'no detail'}",
        code=error.get("code") or f"job_{job['status']}",
    )


# ---------------------------------------------------------------------------------------------
# resolve, vllm-args


def cmd_resolve(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = _model_ref(args.model)
    resolution = client.resolve(name, ref, **_filters(args))
    if args.json:
        print(json.dumps(resolution.data, indent=2))
        return 0
    artifact = resolution.artifact
    variant = (
        f"{artifact['dtype']}/{artifact['format']}/tp{artifact['tensor_parallel_size']}"
        f"{', encrypted' if resolution.encrypted else ''}"
    )
    print(f"{resolution.model}:{ref} -> version {resolution.version}, artifact {artifact['id']}")
    print(f"variant:         {variant}")
    print(f"expires_at:      {resolution.data['expires_at']}")
    print(f"tensorizer_uri:  {resolution.tensorizer_uri}")
    if resolution.encrypted:
        key = resolution.encryption_key_url or "(none: this token lacks keys:read)"
        print(f"key url:         {key}")
    advice = resolution.data["deserializer"]
    print(
        f"deserializer:    num_readers={advice['num_readers']} verify_hash={advice['verify_hash']}"
    )
    print("files:")
    for f in resolution.files:
        print(f"  {f.path:<40} {format_size(f.size):>10}  {f.sha256}")
    return 0


def cmd_vllm_args(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = _model_ref(args.model)
    if args.loader == "tensor-registry":
        from app.client.vllm_loader import vllm_args

        print(shlex.join(vllm_args(client.resolve(name, ref, **_filters(args)))))
        return 0
    resolution = client.resolve(
        name, ref, keyfile=args.keyfile, embed_key_url=args.embed_key_url or None, **_filters(args)
    )
    print(shlex.join(resolution.vllm_args))
    return 0


# ---------------------------------------------------------------------------------------------
# pull


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte (atomic replace)."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(staging, 0o600)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def _vllm_command(resolution: Resolution, dest: Path, keyfile: Path, local_weights: bool) -> str:
    extra = resolution.vllm_extra_config
    if local_weights:
        if resolution.tensor_parallel_size == 1:
            extra["tensorizer_uri"] = str(dest / "model.tensors")
        else:
            # vLLM applies `uri % rank`: a literal '%' in the directory must be doubled.
            extra["tensorizer_uri"] = str(dest).replace("%", "%%") + "/model-rank-%03d.tensors"
    if resolution.encrypted:
        extra["encryption_keyfile"] = str(keyfile)
    command = [
        "vllm",
        "serve",
        str(dest),
        "--load-format",
        "tensorizer",
        "--model-loader-extra-config",
        json.dumps(extra, separators=(",", ":")),
    ]
    if resolution.tensor_parallel_size > 1:
        command += ["--tensor-parallel-size", str(resolution.tensor_parallel_size)]
    # The weights were serialized in this dtype; vLLM must build the model in the same one.
    command += ["--dtype", str(resolution.artifact["dtype"])]
    return shlex.join(command)


def cmd_pull(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = _model_ref(args.model)
    dest: Path = args.dest.expanduser().resolve()
    dest.mkdir(parents=True, exist_ok=True)
    keyfile = dest / KEYFILE_NAME
    resolution = client.resolve(name, ref, keyfile=str(keyfile), **_filters(args))
    if resolution.encrypted and not resolution.encryption_key_url:
        raise KeyAccessRequired(
            f"{name}:{ref} resolves to encrypted artifact {resolution.artifact_id}, and this "
            "token may not read its key",
            status=403,
        )
    cache = NodeCache(args.cache_dir)
    wanted = [f.path for f in resolution.files if args.weights or not f.is_weights]
    downloaded = reused = 0
    refreshed = False
    with _bar(None, "pulling") as bar:
        bar.total = sum(f.size for f in resolution.files if f.path in wanted)
        for path in wanted:
            while True:
                entry = next(f for f in resolution.files if f.path == path)
                try:
                    _, fetched = cache.fetch(
                        client.anonymous,
                        entry.url,
                        sha256=entry.sha256,
                        size=entry.size,
                        readers=args.readers,
                        progress=bar.update,
                    )
                    break
                except SignatureExpired:
                    if refreshed:
                        raise
                    _say("signed URLs expired; resolving again")
                    resolution = client.reresolve(resolution)
                    refreshed = True
            if fetched:
                downloaded += entry.size
            else:
                reused += entry.size
                bar.update(entry.size)
            cache.place(entry.sha256, dest / path)
    if resolution.encrypted:
        assert resolution.encryption_key_url is not None
        try:
            key = client.fetch_key(resolution.encryption_key_url)
        except SignatureExpired:
            resolution = client.reresolve(resolution)
            key = client.fetch_key(str(resolution.encryption_key_url))
        _write_private(keyfile, key)
    manifest = {
        "model": resolution.model,
        "ref": ref,
        "version": resolution.version,
        "artifact": resolution.artifact,
        "files": [
            {"path": f.path, "size": f.size, "sha256": f.sha256, "local": f.path in wanted}
            for f in resolution.files
        ],
    }
    (dest / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    _say(
        f"pulled {resolution.model} version {resolution.version} (artifact "
        f"{resolution.artifact_id}) into {dest}: {len(wanted)} file(s), "
        f"{format_size(downloaded)} downloaded, {format_size(reused)} from the node cache"
        + (f", key in {keyfile}" if resolution.encrypted else "")
    )
    if not args.weights:
        _say(f"weights stream from the signed URL, valid until {resolution.data['expires_at']}")
    if args.loader == "tensor-registry":
        from app.client.vllm_loader import vllm_args

        # The plugin reads the weights from the node cache (where --weights put them) or the
        # signed URLs, and the key through the token: only config/tokenizer files matter here.
        print(shlex.join(["vllm", "serve", str(dest), *vllm_args(resolution)]))
        return 0
    print(_vllm_command(resolution, dest, keyfile, args.weights))
    return 0
