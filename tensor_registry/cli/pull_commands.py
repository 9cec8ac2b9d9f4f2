"""`tensor-registry pull` and `vllm-args`: what vLLM needs to serve an artifact.

`pull` writes the config/tokenizer files (with --weights the weights too) through the node
cache, and into DEST's node state directory (``.cache/tensor-registry/``, which model.sig's
signed ignore_paths name) the key file for encrypted artifacts and a record of what it placed;
it prints the `vllm serve` command; `vllm-args` prints only the loader arguments, for `eval`.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry import checkins
from tensor_registry.api.client import (
    ArtifactGone,
    InvalidRequest,
    KeyAccessRequired,
    RegistryClient,
    SignatureExpired,
)
from tensor_registry.api.download import DEFAULT_READERS
from tensor_registry.api.resolution import Resolution
from tensor_registry.beneath import write_beneath
from tensor_registry.cli.flags import (
    DTYPES,
    add_checkin_flag,
    add_keyfile,
    allow_unsigned_flag,
    artifact_choice_parser,
    connection_parser,
    model_ref,
    require_flag,
    resolve_filters,
)
from tensor_registry.cli.output import format_size, progress_bar, say
from tensor_registry.cli.runner import with_registry
from tensor_registry.formats import model_signature
from tensor_registry.formats.signed_manifest import SignedManifest
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import verify_resolution

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

SINGLE_FILE = "model.tensors"
RANK_TEMPLATE = "model-rank-%03d.tensors"


def register(sub: SubParsers) -> None:
    common = connection_parser()
    choice = artifact_choice_parser()
    pull = sub.add_parser(
        "pull",
        parents=[common, choice],
        help="fetch config/tokenizer files (and weights) and print the vllm serve command",
        description="Writes config and tokenizer files into DEST, with --weights the weights "
        "too (parallel ranged reads, sha256-checked), and into the node state directory "
        f"DEST/{model_signature.NODE_STATE_DIR}/ the key file (mode 0600) of an encrypted "
        "artifact and a record of what it placed (pull.json). Files come through the node "
        "cache, so pulling the same bytes again downloads nothing. Prints the `vllm serve` "
        "command on stdout.",
    )
    pull.add_argument("--dest", required=True, type=Path, metavar="DIR")
    pull.add_argument("--weights", action="store_true", help="download the weights as well")
    pull.add_argument(
        "--readers", type=int, default=DEFAULT_READERS, help="parallel range readers per file"
    )
    pull.add_argument("--cache-dir", type=Path, help="node cache (default: ~/.cache/...)")
    add_keyfile(
        pull,
        "this node's own key file (32 bytes) for an encrypted artifact: the registry is not "
        "asked for the key (the token needs no keys:read) and the printed command points vLLM "
        "at PATH; default: the registry's key, written to "
        f"DEST/{model_signature.KEYFILE_PATH} (mode 0600)",
    )
    _loader_flag(pull)
    allow_unsigned_flag(pull)
    add_checkin_flag(pull)
    pull.set_defaults(func=with_registry(cmd_pull))

    vllm_args = sub.add_parser(
        "vllm-args",
        parents=[common, choice],
        help="print the vLLM arguments for an artifact",
        description="Prints `--load-format tensorizer --model-loader-extra-config '{...}'` "
        "shell-quoted, for eval: "
        'eval "vllm serve DIR $(tensor-registry vllm-args NS/NAME:REF)".',
    )
    add_keyfile(
        vllm_args,
        "local key file vLLM should read (encrypted artifacts; default "
        f"{model_signature.KEYFILE_PATH}, relative: where `pull` writes it in its DEST, for "
        "`vllm serve` run from DEST)",
    )
    vllm_args.add_argument(
        "--embed-key-url",
        action="store_true",
        help="put the signed key URL itself in the config (vLLM logs it)",
    )
    _loader_flag(vllm_args)
    allow_unsigned_flag(vllm_args)
    vllm_args.set_defaults(func=with_registry(cmd_vllm_args))


def _loader_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loader",
        choices=["tensorizer", "tensor-registry"],
        default="tensorizer",
        help="the vLLM load format to print: tensorizer (vLLM's tensorizer loader, default) or "
        "tensor-registry (the load engine through this package's vLLM plugin; "
        "docs/vllm-loader-plugin.md)",
    )


def cmd_vllm_args(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = model_ref(args.model)
    if args.loader == "tensor-registry":
        from tensor_registry.vllm.plugin import vllm_args

        resolution = client.resolve(name, ref, **resolve_filters(args))
        verify_resolution(client, resolution, require=require_flag(args))
        print(shlex.join(vllm_args(resolution)))
        return 0
    resolution = client.resolve(
        name,
        ref,
        keyfile=str(args.keyfile or model_signature.KEYFILE_PATH),
        embed_key_url=args.embed_key_url or None,
        **resolve_filters(args),
    )
    # The answer's own `vllm.args` are not used: they are unsigned (anything could be slipped
    # in on the way); the command is built here from the verified answer.
    signed = verify_resolution(client, resolution, require=require_flag(args))
    keyfile = (
        resolution.encryption_key_url
        if args.embed_key_url
        else str(args.keyfile or model_signature.KEYFILE_PATH)
    )
    print(shlex.join(tensorizer_args(resolution, signed, keyfile=keyfile)))
    return 0


def tensorizer_args(
    resolution: Resolution,
    signed: SignedManifest | None,
    *,
    keyfile: str | None,
    weights_dir: Path | None = None,
) -> list[str]:
    """vLLM's tensorizer-loader arguments for a verified answer, from signed facts: the dtype,
    TP size and encryption of the signed manifest (``check_answer`` made the answer's equal to
    them), the weights' URL of the signed file (or ``weights_dir``, where `pull --weights` put
    them), the reader count bounded, hash verification as the node asked (default on). Every
    printed `vllm serve` line (pull, vllm-args) comes from here, so they agree."""
    artifact = signed.artifact if signed is not None else resolution.artifact
    dtype = str(artifact["dtype"])
    tp = int(artifact["tensor_parallel_size"])
    encrypted = bool((artifact.get("encryption") or {}).get("enabled"))
    if dtype not in DTYPES or not 1 <= tp <= 1024:
        raise InvalidRequest(
            f"the artifact's dtype {dtype!r} / tensor_parallel_size {tp!r} is not one vLLM takes",
            code="bad_answer",
        )
    urls = {f.path: f.url for f in resolution.files}
    if weights_dir is not None:
        if tp == 1:
            uri = str(weights_dir / SINGLE_FILE)
        else:
            # vLLM applies `uri % rank`: a literal '%' in the directory must be doubled.
            uri = str(weights_dir).replace("%", "%%") + "/" + RANK_TEMPLATE
    elif tp == 1:
        uri = urls.get(SINGLE_FILE, "")
    else:
        uri = resolution.tensorizer_uri
        if uri.count("%") != 1 or any(
            uri.replace("%03d", f"{rank:03d}") != urls.get(RANK_TEMPLATE % rank)
            for rank in range(tp)
        ):
            raise InvalidRequest(
                "the answer's tensorizer_uri template does not address its rank files",
                code="bad_answer",
            )
    if not uri:
        raise InvalidRequest("the answer lacks the weights' URL", code="bad_answer")
    extra: dict[str, Any] = {
        "tensorizer_uri": uri,
        "num_readers": resolution.num_readers,  # bounded (Resolution)
        "verify_hash": resolution.verify_hash,  # as the node asked
    }
    if encrypted:
        extra["encryption_keyfile"] = keyfile or model_signature.KEYFILE_PATH
    args = [
        "--load-format",
        "tensorizer",
        "--model-loader-extra-config",
        json.dumps(extra, separators=(",", ":")),
    ]
    if tp > 1:
        args += ["--tensor-parallel-size", str(tp)]
    # The weights were serialized in this dtype; vLLM must build the model in the same one.
    return [*args, "--dtype", dtype]


# Re-resolves a pull may make in a row without placing a file when its signed URLs expire
# (each pinned to its artifact).
MAX_REFRESHES = 8


def _pinned(client: RegistryClient, resolution: Resolution, require: bool | None) -> Resolution:
    """Fresh URLs for the artifact the pull started with (never what the ref names now: an
    alias may have moved), checked again; ArtifactGone when it is no longer served."""
    again = client.reresolve(resolution)
    verify_resolution(client, again, require=require)
    if again.artifact_id != resolution.artifact_id:  # the pin, checked here too
        raise ArtifactGone(
            f"resolving again gave artifact {again.artifact_id}, not {resolution.artifact_id}",
            status=None,
        )
    return again


@dataclass
class PullOutcome:
    """What a pull got to, for its check-in (done or failed)."""

    resolution: Resolution | None = None
    placed_bytes: int = 0
    started: float = field(default_factory=time.perf_counter)


def cmd_pull(args: argparse.Namespace, client: RegistryClient) -> int:
    """`pull`, then one check-in saying what it placed or why it failed (never fails the pull:
    tensor_registry/checkins.py)."""
    outcome = PullOutcome()
    try:
        code = pull_into(args, client, outcome)
    except Exception as exc:
        _check_in(args, client, outcome, error=str(exc))
        raise
    _check_in(args, client, outcome, error=None)
    return code


def _check_in(
    args: argparse.Namespace, client: RegistryClient, outcome: PullOutcome, *, error: str | None
) -> None:
    if args.no_checkin:
        return
    name, ref = model_ref(args.model)
    seconds = time.perf_counter() - outcome.started
    resolution = outcome.resolution
    cache = NodeCache(args.cache_dir)
    entry = checkins.load_entry(
        by="pull",
        model=resolution.model if resolution else name,
        ref=ref,
        artifact_id=resolution.artifact_id if resolution else None,
        version=resolution.version if resolution else None,
        path="pull",
        seconds=seconds,
        gbps=outcome.placed_bytes / seconds / 1e9 if seconds > 0 and not error else None,
        # Every placed file's sha256 was checked against the registry's record.
        verified=error is None,
        error=error,
    )
    checkins.report(client, cache.root, entry, cached=cache.artifacts())


def write_node_file(dest: Path, path: str, data: bytes, *, mode: int = 0o644) -> Path:
    """One of the node's own files (``model_signature.PULL_RECORD``, ``KEYFILE_PATH``,
    ``KEYS_FILE``) into DEST's node state directory, created without following a link, and the
    top-level file an older client kept for it removed: model.sig's ignore_paths name only that
    directory, never a file beside the artifact's (docs/trust.md)."""
    written = write_beneath(dest, path, data, mode=mode, own=True)
    model_signature.drop_legacy_node_file(dest, path)
    return written


def pull_into(args: argparse.Namespace, client: RegistryClient, outcome: PullOutcome) -> int:
    """Resolve, verify, place the files, fetch the key, write the record, print the command."""
    name, ref = model_ref(args.model)
    dest: Path = args.dest.expanduser().resolve()
    dest.mkdir(parents=True, exist_ok=True)
    # The node's own key (--keyfile): checked before anything is asked or written, and the
    # registry is told not to issue a key URL (so no keys:read is needed, none is audited).
    own_key = args.keyfile.expanduser().resolve() if args.keyfile else None
    if own_key is not None:
        RegistryClient.read_key_file(own_key)
    keyfile = own_key or dest / model_signature.KEYFILE_PATH
    require = require_flag(args)
    resolution, signed = _resolve_verified(
        args, client, outcome, name, ref, keyfile=keyfile, own_key=own_key, require=require
    )
    compatibility = resolution.data.get("compatibility_key")
    cache = NodeCache(args.cache_dir, limits=client.limits)
    wanted = [f.path for f in resolution.files if args.weights or not f.is_weights]
    resolution, downloaded, reused = _place_files(
        args, client, cache, outcome, resolution, require, dest, wanted, compatibility
    )
    outcome.resolution = resolution
    if args.weights:
        cache.record_artifact(
            resolution.artifact_id, [(f.sha256, f.size) for f in resolution.files]
        )
    if resolution.encrypted and own_key is None:
        resolution = _write_key(client, resolution, require, dest)
    _write_pull_record(dest, resolution, ref, compatibility, signed, wanted)
    say(
        f"pulled {resolution.model} version {resolution.version} (artifact "
        f"{resolution.artifact_id}) into {dest}: {len(wanted)} file(s), "
        f"{format_size(downloaded)} downloaded, {format_size(reused)} from the node cache"
        + (
            f", key in {keyfile}" + (" (this node's own)" if own_key is not None else "")
            if resolution.encrypted
            else ""
        )
        + (f"; signed manifest verified (key {signed.key_id[:16]})" if signed else "; UNSIGNED")
    )
    if not args.weights:
        say(f"weights stream from the signed URL, valid until {resolution.data['expires_at']}")
    print(
        shlex.join(
            ["vllm", "serve", str(dest), *_serve_args(args, resolution, signed, keyfile, dest)]
        )
    )
    return 0


def _resolve_verified(
    args: argparse.Namespace,
    client: RegistryClient,
    outcome: PullOutcome,
    name: str,
    ref: str,
    *,
    keyfile: Path,
    own_key: Path | None,
    require: bool | None,
) -> tuple[Resolution, SignedManifest | None]:
    """The resolve answer and its signed manifest, checked before anything is placed (a
    manifest whose signature expired meanwhile is asked for again)."""
    resolution = client.resolve(
        name,
        ref,
        keyfile=str(keyfile),
        key_url=False if own_key is not None else None,
        **resolve_filters(args),
    )
    outcome.resolution = resolution
    if resolution.encrypted and own_key is None and not resolution.encryption_key_url:
        raise KeyAccessRequired(
            f"{name}:{ref} resolves to encrypted artifact {resolution.artifact_id}, and this "
            "token may not read its key (bring the node's own with --keyfile PATH)",
            status=403,
        )
    # The signed manifest first (tensor_registry/trust/): nothing is placed when it fails.
    for attempt in range(MAX_REFRESHES + 1):
        try:
            signed = verify_resolution(client, resolution, require=require)
            break
        except SignatureExpired:
            if attempt == MAX_REFRESHES:
                raise
            resolution = client.resolve_again(resolution)  # nothing of it was used yet
    return resolution, signed


def _place_files(
    args: argparse.Namespace,
    client: RegistryClient,
    cache: NodeCache,
    outcome: PullOutcome,
    resolution: Resolution,
    require: bool | None,
    dest: Path,
    wanted: list[str],
    compatibility: Any,
) -> tuple[Resolution, int, int]:
    """Each wanted file through the node cache into ``dest`` (expired URLs re-resolved, pinned
    to the same artifact); returns the resolution in use and the bytes downloaded and reused."""
    downloaded = reused = 0
    refreshes = 0
    with progress_bar(None, "pulling") as bar:
        bar.total = sum(f.size for f in resolution.files if f.path in wanted)
        for path in wanted:
            while True:
                entry = next(f for f in resolution.files if f.path == path)
                try:
                    _, fetched = cache.fetch(
                        entry.url,
                        sha256=entry.sha256,
                        size=entry.size,
                        readers=args.readers,
                        progress=bar.update,
                        compatibility_key=compatibility,
                    )
                    break
                except SignatureExpired:
                    if refreshes == MAX_REFRESHES:
                        raise
                    say("signed URLs expired; resolving again (the same artifact)")
                    resolution = _pinned(client, resolution, require)
                    refreshes += 1
            refreshes = 0  # progress: the cap counts re-resolves without any
            if fetched:
                downloaded += entry.size
            else:
                reused += entry.size
                bar.update(entry.size)
            cache.place(entry.sha256, dest, path)
            outcome.placed_bytes += entry.size
    return resolution, downloaded, reused


def _write_key(
    client: RegistryClient, resolution: Resolution, require: bool | None, dest: Path
) -> Resolution:
    """The artifact's key from its key URL into DEST's state directory (0600); returns the
    resolution in use (re-resolved, pinned, when the key URL had expired)."""
    assert resolution.encryption_key_url is not None
    try:
        key = client.fetch_key(resolution.encryption_key_url)
    except SignatureExpired:
        resolution = _pinned(client, resolution, require)
        key = client.fetch_key(str(resolution.encryption_key_url))
    write_node_file(dest, model_signature.KEYFILE_PATH, key, mode=0o600)
    return resolution


def _write_pull_record(
    dest: Path,
    resolution: Resolution,
    ref: str,
    compatibility: Any,
    signed: SignedManifest | None,
    wanted: list[str],
) -> None:
    """What was pulled, for `verify` and `vllm-args` later (DEST's state directory)."""
    manifest = {
        "model": resolution.model,
        "ref": ref,
        "version": resolution.version,
        "artifact": resolution.artifact,
        "compatibility_key": compatibility,
        "signed_by": signed.key_id if signed is not None else None,
        "files": [
            {"path": f.path, "size": f.size, "sha256": f.sha256, "local": f.path in wanted}
            for f in resolution.files
        ],
    }
    record = json.dumps(manifest, indent=2) + "\n"
    write_node_file(dest, model_signature.PULL_RECORD, record.encode())


def _serve_args(
    args: argparse.Namespace,
    resolution: Resolution,
    signed: SignedManifest | None,
    keyfile: Path,
    dest: Path,
) -> list[str]:
    """The `vllm serve` arguments for the chosen loader."""
    if args.loader == "tensor-registry":
        from tensor_registry.vllm.plugin import vllm_args

        # The plugin reads the weights from the node cache (where --weights put them) or the
        # signed URLs, and the key through the token: only config/tokenizer files matter here.
        return list(vllm_args(resolution))
    local = dest if args.weights else None
    return list(tensorizer_args(resolution, signed, keyfile=str(keyfile), weights_dir=local))
