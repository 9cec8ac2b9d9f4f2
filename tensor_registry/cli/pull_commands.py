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
from tensor_registry.cli.flags import (
    artifact_choice_parser,
    connection_parser,
    model_ref,
    resolve_filters,
)
from tensor_registry.cli.output import format_size, progress_bar, say
from tensor_registry.cli.runner import with_registry
from tensor_registry.config import write_private
from tensor_registry.node_cache import DEFAULT_READERS, NodeCache
from tensor_registry.trust import verify_resolution

if TYPE_CHECKING:
    from tensor_registry.cli.flags import SubParsers

KEYFILE_NAME = "tensorizer.key"
PULL_RECORD = ".tensor-registry.json"  # what `pull` placed, beside the files


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
        keyfile=args.keyfile,
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
    keyfile = dest / KEYFILE_NAME
    resolution = client.resolve(name, ref, keyfile=str(keyfile), **resolve_filters(args))
    if resolution.encrypted and not resolution.encryption_key_url:
        raise KeyAccessRequired(
            f"{name}:{ref} resolves to encrypted artifact {resolution.artifact_id}, and this "
            "token may not read its key",
            status=403,
        )
    # The signed manifest first (tensor_registry/trust.py): nothing is placed when it fails.
    signed = verify_resolution(client, resolution)
    compatibility = resolution.data.get("compatibility_key")
    cache = NodeCache(args.cache_dir)
    wanted = [f.path for f in resolution.files if args.weights or not f.is_weights]
    with progress_bar(None, "pulling") as bar:
        bar.total = sum(f.size for f in resolution.files if f.path in wanted)
        before = resolution
        resolution, downloaded, reused = cache.fetch_resolution(
            client, resolution, paths=wanted, readers=args.readers, progress=bar.update
        )
        if resolution is not before:
            say("signed URLs expired; resolved again")
        for entry in resolution.files:
            if entry.path in wanted:
                cache.place(entry.sha256, dest / entry.path)
    if resolution.encrypted:
        assert resolution.encryption_key_url is not None
        try:
            key = client.fetch_key(resolution.encryption_key_url)
        except SignatureExpired:
            resolution = client.reresolve(resolution)
            key = client.fetch_key(str(resolution.encryption_key_url))
        write_private(keyfile, key)
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
    (dest / PULL_RECORD).write_text(json.dumps(manifest, indent=2) + "\n")
    say(
        f"pulled {resolution.model} version {resolution.version} (artifact "
        f"{resolution.artifact_id}) into {dest}: {len(wanted)} file(s), "
        f"{format_size(downloaded)} downloaded, {format_size(reused)} from the node cache"
        + (f", key in {keyfile}" if resolution.encrypted else "")
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
