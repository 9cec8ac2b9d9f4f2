"""`tensor-registry publish`: a Hugging Face model directory uploaded as a new version.

Resumable: files already in the draft with the same sha256 are skipped, and an identical latest
version is reused instead of made again.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry.api.client import RegistryClient
from tensor_registry.cli.flags import UsageError, connection_parser
from tensor_registry.cli.output import print_json, progress_bar, say
from tensor_registry.cli.runner import with_registry

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

UPLOAD_CHUNK = 1024 * 1024


def register(sub: SubParsers) -> None:
    publish = sub.add_parser(
        "publish",
        parents=[connection_parser()],
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
    publish.set_defaults(func=with_registry(cmd_publish))


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
        say(f"created model {name}")
    model_id = str(model["id"])

    sizes = {rel: (directory / rel).stat().st_size for rel in files}
    digests: dict[str, str] = {}
    with progress_bar(sum(sizes.values()), "hashing") as bar:
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
            say(f"resuming draft version {version['version']}")
        else:
            same = _identical_latest(client, model_id, versions, sizes, digests)
            if same is not None:
                say(
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
        say(f"removed {stale} from the draft (not in {directory})")
    pending = [rel for rel in files if remote.get(rel, {}).get("sha256") != digests[rel]]
    skipped = len(files) - len(pending)
    if skipped:
        say(f"{skipped} file(s) already uploaded, skipped")
    with progress_bar(sum(sizes[rel] for rel in pending), "uploading") as bar:
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
    say(f"{name} version {number} is {final['status']} ({len(files)} files)")
    if args.json:
        print_json(final)
    else:
        print(number)
    return 0
