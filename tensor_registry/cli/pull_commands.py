"""`tensor-registry pull` and `vllm-args`: what vLLM needs to serve an artifact.

`pull` writes the config/tokenizer files (with --weights the weights too) through the node
cache, the key file for encrypted artifacts, a record of what it placed, and prints the
`vllm serve` command; `vllm-args` prints only the loader arguments, for `eval`.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from tensor_registry.api.client import (
    KeyAccessRequired,
    RegistryClient,
    Resolution,
    SignatureExpired,
)
from tensor_registry.beneath import write_beneath
from tensor_registry.cli.flags import (
    add_keyfile,
    artifact_choice_parser,
    connection_parser,
    model_ref,
    resolve_filters,
)
from tensor_registry.cli.output import format_size, progress_bar, say
from tensor_registry.cli.runner import with_registry
from tensor_registry.formats import model_signature
from tensor_registry.node_cache import DEFAULT_READERS, NodeCache
from tensor_registry.trust import verify_resolution

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

# What `pull` writes beside the artifact's files (model.sig's signed ignore_paths name them).
KEYFILE_NAME = model_signature.KEYFILE_NAME
PULL_RECORD = model_signature.PULL_RECORD  # what `pull` placed, beside the files


def register(sub: SubParsers) -> None:
    common = connection_parser()
    choice = artifact_choice_parser()
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
    add_keyfile(
        pull,
        "this node's own key file (32 bytes) for an encrypted artifact: the registry is not "
        "asked for the key (the token needs no keys:read) and the printed command points vLLM "
        f"at PATH; default: the registry's key, written to DEST/{KEYFILE_NAME} (mode 0600)",
    )
    _loader_flag(pull)
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
        f"local key file vLLM should read (encrypted artifacts; default {KEYFILE_NAME}, "
        "where `pull` writes it)",
    )
    vllm_args.add_argument(
        "--embed-key-url",
        action="store_true",
        help="put the signed key URL itself in the config (vLLM logs it)",
    )
    _loader_flag(vllm_args)
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

        print(shlex.join(vllm_args(client.resolve(name, ref, **resolve_filters(args)))))
        return 0
    resolution = client.resolve(
        name,
        ref,
        keyfile=str(args.keyfile or KEYFILE_NAME),
        embed_key_url=args.embed_key_url or None,
        **resolve_filters(args),
    )
    print(shlex.join(resolution.vllm_args))
    return 0


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
    name, ref = model_ref(args.model)
    dest: Path = args.dest.expanduser().resolve()
    dest.mkdir(parents=True, exist_ok=True)
    # The node's own key (--keyfile): checked before anything is asked or written, and the
    # registry is told not to issue a key URL (so no keys:read is needed, none is audited).
    own_key = args.keyfile.expanduser().resolve() if args.keyfile else None
    if own_key is not None:
        RegistryClient.read_key_file(own_key)
    keyfile = own_key or dest / KEYFILE_NAME
    resolution = client.resolve(
        name,
        ref,
        keyfile=str(keyfile),
        key_url=False if own_key is not None else None,
        **resolve_filters(args),
    )
    if resolution.encrypted and own_key is None and not resolution.encryption_key_url:
        raise KeyAccessRequired(
            f"{name}:{ref} resolves to encrypted artifact {resolution.artifact_id}, and this "
            "token may not read its key (bring the node's own with --keyfile PATH)",
            status=403,
        )
    # The signed manifest first (tensor_registry/trust.py): nothing is placed when it fails.
    signed = verify_resolution(client, resolution)
    compatibility = resolution.data.get("compatibility_key")
    cache = NodeCache(args.cache_dir, limits=client.limits)
    wanted = [f.path for f in resolution.files if args.weights or not f.is_weights]
    downloaded = reused = 0
    refreshed = False
    with progress_bar(None, "pulling") as bar:
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
                        compatibility_key=compatibility,
                    )
                    break
                except SignatureExpired:
                    if refreshed:
                        raise
                    say("signed URLs expired; resolving again")
                    resolution = client.reresolve(resolution)
                    refreshed = True
            if fetched:
                downloaded += entry.size
            else:
                reused += entry.size
                bar.update(entry.size)
            cache.place(entry.sha256, dest, path)
    if resolution.encrypted and own_key is None:
        assert resolution.encryption_key_url is not None
        try:
            key = client.fetch_key(resolution.encryption_key_url)
        except SignatureExpired:
            resolution = client.reresolve(resolution)
            key = client.fetch_key(str(resolution.encryption_key_url))
        write_beneath(dest, KEYFILE_NAME, key, mode=0o600)
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
    write_beneath(dest, PULL_RECORD, record.encode(), own=True)
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
    if args.loader == "tensor-registry":
        from tensor_registry.vllm.plugin import vllm_args

        # The plugin reads the weights from the node cache (where --weights put them) or the
        # signed URLs, and the key through the token: only config/tokenizer files matter here.
        print(shlex.join(["vllm", "serve", str(dest), *vllm_args(resolution)]))
        return 0
    print(_vllm_command(resolution, dest, keyfile, args.weights))
    return 0
