"""`tensor-registry trust | verify | export | import | load-dir`: signed manifests from the CLI.

    tensor-registry trust                                   # pin the registry's manifest keys
    tensor-registry verify ./llama                          # offline: a pulled or exported dir
    tensor-registry verify acme/llama:prod                  # the registry's artifact, every byte
    tensor-registry verify acme/llama:3 --version-manifest  # version 3's signed file list
    tensor-registry export acme/llama:prod --to ./bundle    # files + signed manifest + keys.json
    tensor-registry import ./bundle --model acme/llama --trusted-key keys.json
    tensor-registry load-dir ./bundle --trusted-key keys.json   # air-gapped: verify, then load

Export writes the registry's keys document (a copy, for checking out of band) into the bundle's
node state directory, ``.cache/tensor-registry/keys.json`` (model_signature.KEYS_FILE), never
beside the files.

Trust (tensor_registry/trust/): keys given with ``--trusted-key`` / TENSOR_REGISTRY_TRUSTED_KEYS
(base64 public keys or keys.json paths) replace everything else; otherwise the registry's keys
pinned on first use. A bundle's own keys.json is never trusted by itself: `import` and
`load-dir` need the keys given explicitly.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tensor_registry.api.client import (
    RegistryClient,
    RegistryError,
)
from tensor_registry.api.resolution import Resolution, parse_model_ref
from tensor_registry.cli.flags import add_variant_flags, connection_parser
from tensor_registry.cli.output import format_size, one_line, print_json, print_table, say
from tensor_registry.cli.pull_commands import write_node_file
from tensor_registry.config import connection
from tensor_registry.formats import model_signature
from tensor_registry.formats.digests import sha256_file
from tensor_registry.formats.layout import LAYOUT_FILE, LayoutError, is_weights
from tensor_registry.formats.paths import require_relative_path
from tensor_registry.formats.signed_manifest import MANIFEST_FILE, SignedManifest
from tensor_registry.node_cache import NodeCache
from tensor_registry.trust import (
    PinStore,
    TrustError,
    configured_keys,
    configured_model_signing_keys,
    fetch_keys_document,
    keys_from_document,
    model_signing_keys,
    trusted_keys,
    verify_directory,
    verify_resolution,
    verify_version_manifest,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    common = connection_parser()
    keys = argparse.ArgumentParser(add_help=False)
    keys.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="KEY",
        help="trusted Ed25519 public key (base64) or keys.json path; repeatable "
        "(also $TENSOR_REGISTRY_TRUSTED_KEYS)",
    )

    trust = sub.add_parser(
        "trust",
        parents=[common],
        help="pin the registry's manifest-signing keys (trust on first use)",
        description="Fetch the registry's public keys and pin them in the client config dir. "
        "--replace drops the earlier pin first (after an out-of-band check of the key ids).",
    )
    trust.add_argument("--replace", action="store_true", help="replace the pinned keys")
    trust.set_defaults(func=_guard(cmd_trust))

    verify = sub.add_parser(
        "verify",
        parents=[common, keys],
        help="check a pulled/exported directory (offline) or an artifact against its signature",
        description="DIR: the directory's manifest.sig.json must verify with a trusted key and "
        "every file must have its signed size and sha256 (weights `pull` left remote are "
        "skipped). NS/NAME[:REF]: the registry's artifact, every file's bytes fetched through "
        "the node cache and checked. NS/NAME[:REF] --version-manifest: the source version's "
        "signed manifest (REF: N, an alias or latest): signed by a trusted key, naming that "
        "model and version; prints its files (path, size, sha256).",
    )
    verify.add_argument("target", metavar="DIR|NS/NAME[:REF]")
    verify.add_argument("--cache-dir", type=Path, help="node cache (default: ~/.cache/...)")
    verify.add_argument(
        "--version-manifest",
        action="store_true",
        help="check the version's signed manifest (its source files), not an artifact",
    )
    verify.add_argument(
        "--json",
        action="store_true",
        help="print JSON (the artifact and directory checks always print their JSON summary)",
    )
    verify.set_defaults(func=_guard(cmd_verify))

    export = sub.add_parser(
        "export",
        parents=[common, keys],
        help="write an artifact, its companion files and its signed manifest to a directory",
    )
    export.add_argument("model", metavar="NS/NAME[:REF]")
    export.add_argument("--to", required=True, type=Path, metavar="DIR")
    add_variant_flags(export)
    export.add_argument("--cache-dir", type=Path, help="node cache (default: ~/.cache/...)")
    export.set_defaults(func=_guard(cmd_export))

    imp = sub.add_parser(
        "import",
        parents=[common, keys],
        help="verify a bundle, then register it as an artifact of this registry",
        description="The bundle must verify with --trusted-key (the exporting registry's "
        "keys). Its source version must already be published here with the same file digests "
        "(the signed provenance names them); the weights are registered from file://DIR "
        "(DIR under the registry's storage.import_roots), verified again by the worker and "
        "signed by this registry.",
    )
    imp.add_argument("bundle", type=Path, metavar="DIR")
    imp.add_argument("--model", required=True, metavar="NS/NAME")
    imp.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the job")
    imp.set_defaults(func=_guard(cmd_import))

    load = sub.add_parser(
        "load-dir",
        parents=[keys],
        help="air-gapped: verify a bundle offline, then load its weights with the engine",
    )
    load.add_argument("bundle", type=Path, metavar="DIR")
    load.add_argument("--rank", type=int, default=0)
    load.set_defaults(func=_offline_guard(cmd_load_dir))


Command = Callable[[argparse.Namespace, RegistryClient], int]


def _report(exc: Exception) -> int:
    print(f"error: {one_line(str(exc))}", file=sys.stderr)
    return 1


def _guard(command: Command) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            conn = connection(args.url, args.token)
            with RegistryClient(conn.url, conn.token or "") as client:
                return command(args, client)
        except (RegistryError, LayoutError, OSError, ValueError) as exc:
            return _report(exc)

    return run


def _offline_guard(command: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except (RegistryError, LayoutError, OSError, ValueError) as exc:
            return _report(exc)

    return run


def _summary(signed: SignedManifest, where: str, model_signed_by: str | None = None) -> str:
    a = signed.artifact
    return json.dumps(
        {
            "verified": where,
            "artifact": a.get("id"),
            "model": a.get("model"),
            "version": a.get("version"),
            "signed_by": signed.key_id,
            "model_signed_by": model_signed_by,
            "compatibility_key": signed.compatibility_key,
            "files": len(signed.files),
        }
    )


# ---------------------------------------------------------------------------------------------


def cmd_trust(args: argparse.Namespace, client: RegistryClient) -> int:
    pins = PinStore()
    if args.replace or pins.get(client.url) is None:
        document = fetch_keys_document(client)
        keys = keys_from_document(document)
        ident = str(document.get("registry_id") or client.url)
        found = pins.find(client.url)
        if found is not None and found[0] != ident:
            pins.forget(found[0])
        pins.put(ident, keys, url=client.url, replace=True)
        if args.replace:
            pins.put_model_signing(ident, {})
    else:
        keys = trusted_keys(client, pins=pins)
    # The model-signing keys those endorse (model.sig), pinned beside them.
    model_signing_keys(client, keys, pins=pins)
    for kid in sorted(keys):
        print(kid)
    say(f"{len(keys)} key(s) of {client.url} pinned in {pins.path}")
    return 0


def _claimed_registries(directory: Path) -> list[str]:
    """The registry the manifest names, by its identity then its URL (unverified: it only picks
    which pinned keys to use)."""
    try:
        claimed = json.loads((directory / MANIFEST_FILE).read_bytes())
        predicate = json.loads(base64.b64decode(claimed["payload"]))["predicate"]
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return []
    names = (predicate.get("registry_id"), predicate.get("registry"))
    return [name for name in names if isinstance(name, str) and name]


def _offline_model_keys(args: argparse.Namespace, directory: Path) -> dict[str, bytes]:
    """Model-signing keys for a directory's model.sig: configured (a PEM file, a keys
    document), else those pinned for the registry the manifest names; none: not checked."""
    configured = configured_model_signing_keys(args.trusted_key)
    if configured is not None:
        return configured
    pins = PinStore()
    for registry in _claimed_registries(directory):
        if found := pins.get_model_signing(registry):
            return found
    return {}


def _offline_keys(args: argparse.Namespace, directory: Path) -> dict[str, bytes]:
    keys = configured_keys(args.trusted_key)
    if keys is not None:
        return keys
    # The registry the manifest names, if its keys were pinned here before: by its identity
    # (whatever URL or port it answered on), else its URL, else the pins that hold the key
    # the manifest is signed with.
    pins, pinned = PinStore(), None
    for name in _claimed_registries(directory):
        pinned = pinned or pins.get(name)
    if pinned is None:
        try:
            claimed = json.loads((directory / MANIFEST_FILE).read_bytes())
            pinned = pins.holding(str(claimed["signatures"][0]["keyid"]).lower())
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
            pinned = None
    if pinned is None:
        raise TrustError(
            f"no trusted keys for {directory}: give --trusted-key (the exporting registry's "
            "keys.json or public key) or pin its registry with `tensor-registry trust`",
            code="untrusted_signing_key",
        )
    return pinned


def _pulled_remote(directory: Path) -> tuple[str | None, set[str]]:
    """(artifact id, files left remote) from what `pull` recorded, if it did: its record in the
    node state directory, else (a folder an older client pulled) the top-level one; a regular
    file only."""
    path = model_signature.node_file(directory, model_signature.PULL_RECORD)
    if path is None:
        return None, set()
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, set()
    remote = {f["path"] for f in record.get("files", []) if not f.get("local", True)}
    return str(record.get("artifact", {}).get("id")), remote


def cmd_verify(args: argparse.Namespace, client: RegistryClient) -> int:
    if args.version_manifest:
        return _verify_version(args, client)
    target = Path(args.target).expanduser()
    if target.is_dir():
        artifact_id, remote = _pulled_remote(target)
        model_keys = _offline_model_keys(args, target)
        offline = verify_directory(
            target,
            _offline_keys(args, target),
            artifact_id=artifact_id,
            allow_missing=remote,
            model_keys=model_keys,
        )
        oms = target / model_signature.SIGNATURE_FILE
        checked = (
            model_signature.bundle_hint(oms.read_bytes()) if model_keys and oms.is_file() else None
        )
        print(_summary(offline, str(target), checked))
        return 0
    name, ref = parse_model_ref(args.target)
    resolution = client.resolve(name, ref)
    signed = verify_resolution(client, resolution, trusted=args.trusted_key or None, require=True)
    assert signed is not None
    cache = NodeCache(args.cache_dir, limits=client.limits)
    for f in resolution.files:
        # Through the node cache: a download is sha256-checked before it is kept; a cached
        # object is hashed again here (a disk can rot).
        path, _ = cache.fetch(
            f.url,
            sha256=f.sha256,
            size=f.size,
            compatibility_key=resolution.data.get("compatibility_key"),
        )
        if sha256_file(path) != f.sha256:
            raise TrustError(f"{f.path}: the node cache's copy is corrupt", code="content_mismatch")
    print(_summary(signed, f"{name}:{ref}"))
    return 0


def _verify_version(args: argparse.Namespace, client: RegistryClient) -> int:
    if Path(args.target).expanduser().is_dir():
        raise ValueError("--version-manifest checks a registry's version: give NS/NAME[:REF]")
    name, ref = parse_model_ref(args.target)
    model_id = str(client.get_model(name)["id"])
    number = client.version_number(model_id, ref)
    signed = verify_version_manifest(client, model_id, number, trusted=args.trusted_key or None)
    version = signed.predicate.get("version") or {}
    files = sorted(signed.files.values(), key=lambda f: f.path)
    if args.json:
        print_json(
            {
                "verified": f"{name}:{ref}",
                "model": version.get("model"),
                "model_id": model_id,
                "version": number,
                "version_id": version.get("id"),
                "finalized_at": version.get("finalized_at"),
                "source": version.get("source"),
                "signed_by": signed.key_id,
                "signed_at": signed.predicate.get("signed_at"),
                "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in files],
            }
        )
        return 0
    print(
        f"{name} version {number}: signed manifest verified (key {signed.key_id[:16]}…, "
        f"signed at {signed.predicate.get('signed_at')}), {len(files)} file(s)"
    )
    print_table(
        ["PATH", "SIZE", "SHA256"], [(f.path, format_size(f.size), f.sha256) for f in files]
    )
    return 0


def _export_filters(args: argparse.Namespace) -> dict[str, Any]:
    filters: dict[str, Any] = {}
    if args.dtype:
        filters["dtype"] = args.dtype
    if args.format:
        filters["format"] = args.format
    if args.tp:
        filters["tensor_parallel_size"] = args.tp
    if args.encrypted is not None:
        filters["encrypted"] = args.encrypted
    return filters


def cmd_export(args: argparse.Namespace, client: RegistryClient) -> int:
    name, ref = parse_model_ref(args.model)
    resolution: Resolution = client.resolve(name, ref, **_export_filters(args))
    signed = verify_resolution(client, resolution, trusted=args.trusted_key or None, require=True)
    assert signed is not None
    dest: Path = args.to.expanduser().resolve()
    dest.mkdir(parents=True, exist_ok=True)
    cache = NodeCache(args.cache_dir, limits=client.limits)
    compatibility = resolution.data.get("compatibility_key")
    for f in resolution.files:
        cache.fetch(f.url, sha256=f.sha256, size=f.size, compatibility_key=compatibility)
        cache.place(f.sha256, dest, f.path)
    # The exporting registry's public keys, for the importer to check out of band and pass
    # as --trusted-key: a copy, never trusted because it travels with the bundle.
    keys_document = json.dumps(fetch_keys_document(client), indent=1) + "\n"
    keys_path = write_node_file(dest, model_signature.KEYS_FILE, keys_document.encode())
    print(_summary(signed, str(dest)))
    say(
        f"exported {name}:{ref} (artifact {resolution.artifact_id}) to {dest}; signed by key "
        f"{signed.key_id[:16]}… — pass {keys_path} as --trusted-key where it is imported"
    )
    return 0


def _source_version(client: RegistryClient, model_id: str, signed: SignedManifest) -> int:
    """The ready version of ``model_id`` whose files are the signed source's, by digest."""
    source = signed.predicate.get("provenance", {}).get("source_version") or {}
    wanted = {(f["path"], f["sha256"]) for f in source.get("files") or []}
    if not wanted:
        raise TrustError("the signed manifest names no source files", code="bad_manifest")
    for version in client.list_versions(model_id):
        if version.get("status") != "ready":
            continue
        detail = client.json(
            "GET", f"/api/v1/models/{quote(model_id)}/versions/{int(version['version'])}"
        )
        have = {(f["path"], f["sha256"]) for f in detail.get("files") or []}
        if wanted <= have:
            return int(version["version"])
    raise TrustError(
        "no ready version of the target model holds the signed source files "
        f"({', '.join(sorted(p for p, _ in wanted))}); publish the source version first",
        code="source_version_missing",
    )


def cmd_import(args: argparse.Namespace, client: RegistryClient) -> int:
    bundle: Path = args.bundle.expanduser().resolve()
    keys = configured_keys(args.trusted_key)
    if keys is None:
        raise TrustError(
            "import needs the exporting registry's keys: --trusted-key KEYS.json|BASE64",
            code="untrusted_signing_key",
        )
    signed = verify_directory(bundle, keys, model_keys=_offline_model_keys(args, bundle))
    artifact = signed.artifact
    if artifact.get("encryption", {}).get("enabled"):
        raise TrustError(
            "encrypted bundles are not imported (their key never leaves the registry)",
            code="unsupported_bundle",
        )
    model = client.get_model(args.model)
    number = _source_version(client, str(model["id"]), signed)
    body = {
        "version": number,
        "dtype": artifact["dtype"],
        "format": artifact["format"],
        "tensor_parallel_size": int(artifact["tensor_parallel_size"]),
        "uri": bundle.as_uri() + "/",
    }
    job = client.json("POST", f"/api/v1/models/{quote(str(model['id']))}/artifacts", json=body)
    deadline = time.monotonic() + args.timeout
    while job["status"] not in ("succeeded", "failed", "cancelled"):
        if time.monotonic() > deadline:
            raise TrustError(f"job {job['id']} did not finish in time", code="timeout")
        time.sleep(0.5)
        job = client.get_job(str(job["id"]))
    if job["status"] != "succeeded":
        raise RegistryError(
            f"the register job {job['status']}: {job.get('error')}", code="job_failed"
        )
    new = client.get_artifact(str(job["artifact_id"]))
    # Every file this registry now serves (weights, config, tokenizer, layout) is the signed
    # one, byte for byte, and none is missing: the bundle may have changed since it was checked.
    # Its own signatures (the manifest, model.sig) are this registry's, made at the import.
    signed_files = signed.files
    own = (MANIFEST_FILE, model_signature.SIGNATURE_FILE)
    served = {f["path"]: f for f in new["files"] if f["path"] not in own}
    for path, f in served.items():
        entry = signed_files.get(path)
        if entry is None or (entry.sha256, entry.size) != (f["sha256"], f["size"]):
            raise TrustError(f"the imported {path} is not the signed one", code="content_mismatch")
    if set(signed_files) - set(served):
        missing = sorted(set(signed_files) - set(served))[0]
        raise TrustError(f"the import lacks the signed {missing}", code="content_mismatch")
    print(json.dumps({"imported": new["id"], "version": number, "from": signed.artifact_id}))
    return 0


def cmd_load_dir(args: argparse.Namespace) -> int:
    from tensor_registry.engine import load_file_cpu
    from tensor_registry.formats import layout as layouts

    bundle: Path = args.bundle.expanduser().resolve()
    t0 = time.perf_counter()
    signed = verify_directory(
        bundle,
        _offline_keys(args, bundle),
        hash_weights=False,
        model_keys=_offline_model_keys(args, bundle),
    )
    manifest = layouts.loads((bundle / LAYOUT_FILE).read_bytes())
    weights = sorted(p for p in signed.files if is_weights(p))
    if not 0 <= args.rank < len(weights):
        raise ValueError(f"rank {args.rank} is outside the bundle's {len(weights)} weight file(s)")
    path = require_relative_path(weights[args.rank], what="a file path in the signed manifest")
    entry = signed.files[path]
    file = manifest.file(path)
    if (file.sha256, file.size) != (entry.sha256, entry.size):
        raise TrustError(f"the layout describes another {path}", code="manifest_mismatch")
    # The layout's sha256 was checked against the signature: its chunk digests cover the bytes.
    tensors = load_file_cpu(bundle / path, file, verify=True)
    print(
        json.dumps(
            {
                "loaded": path,
                "tensors": len(tensors),
                "signed_by": signed.key_id,
                "seconds": round(time.perf_counter() - t0, 4),
            }
        )
    )
    return 0
