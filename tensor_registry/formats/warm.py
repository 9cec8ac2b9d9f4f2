"""Warm bundles: what both sides read and write (docs/warm-state.md).

A warm bundle is vLLM's compile cache (``VLLM_CACHE_ROOT/torch_compile_cache/…``) made by a warm
job for one artifact, as a tar, with the key vLLM itself used for it. This module is the shared
vocabulary, pure data and checks (no I/O):

- ``WarmKey``: the parts that decide vLLM's cache directory name that a node can know before it
  starts vLLM (vLLM and torch versions, the GPU's compute capability, tensor-parallel size,
  dtype, the ``model`` string vLLM was given, the serve arguments vLLM hashes), and
  :func:`differences` naming the parts that differ;
- the serve arguments a warm job accepts (:data:`SERVE_ARGS`, an allow-list: they run on a
  worker) and their one normal form (:func:`normalize_serve_args`);
- the member rule of a bundle's tar (:func:`check_member_name`): every member is a regular
  file or a directory under ``torch_compile_cache/``, relative, no ``.``/``..``/empty segment;
- the names of the hash directories vLLM 0.24 makes (:func:`hash_dir_of`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

# The signed statement of a bundle (its own predicate type; same DSSE envelope as manifests).
WARM_PREDICATE_TYPE = "https://tensor-registry.dev/warm-bundle/v1"
BUNDLE_FILE = "warm.tar"
CACHE_DIR = "torch_compile_cache"
# vLLM's AOT-compile layout (VLLM_USE_AOT_COMPILE): torch_compile_cache/torch_aot_compile/<sha256>.
AOT_DIR = "torch_aot_compile"
# Written by vLLM in each rank's cache directory: the raw env factors and the three hashes.
FACTORS_FILE = "cache_key_factors.json"
FACTOR_NAMES = ("env", "config_hash", "code_hash", "compiler_hash")

MAX_MEMBERS = 200_000
MAX_MEMBER_NAME = 1024
MAX_MEMBER_DEPTH = 16
_MEMBER_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+=@,-]{0,254}$")

# Serve arguments a warm job may pass to `vllm serve` (they enter vLLM's config hash, or decide
# what is compiled). True: takes a value. Anything else (a path, remote code, a download) is
# refused: the worker runs what it is given.
SERVE_ARGS: dict[str, bool] = {
    "--max-model-len": True,
    "--max-num-seqs": True,
    "--max-num-batched-tokens": True,
    "--kv-cache-dtype": True,
    "--quantization": True,
    "--block-size": True,
    "--compilation-config": True,
    "--optimization-level": True,
    "--cuda-graph-sizes": True,
    "--attention-backend": True,
    "--gpu-memory-utilization": True,
    "--seed": True,
    "--enable-prefix-caching": False,
    "--no-enable-prefix-caching": False,
    "--enable-chunked-prefill": False,
    "--no-enable-chunked-prefill": False,
}
# Serve arguments vLLM leaves out of its hash (CacheConfig/ModelConfig ``ignored_factors``):
# a bundle made with another value is still used, so they never make a miss.
NOT_HASHED = frozenset(
    {"--gpu-memory-utilization", "--seed", "--enable-prefix-caching", "--no-enable-prefix-caching"}
)
MAX_SERVE_ARGS = 32
MAX_ARG_VALUE = 4096
_VALUE = re.compile(r"^[\x20-\x7e]*$")


class WarmFormatError(ValueError):
    """Input that breaks a rule of this module; ``code`` is stable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def normalize_serve_args(args: Iterable[str]) -> list[str]:
    """``--flag=value`` / ``--flag`` strings, one per flag, sorted: the order on a command line
    does not change vLLM's config, so it does not change the key. ``--flag value`` pairs are
    joined. Raises WarmFormatError for a flag not in :data:`SERVE_ARGS` or a bad value."""
    items = list(args)
    if len(items) > 2 * MAX_SERVE_ARGS:
        raise WarmFormatError("bad_serve_args", f"at most {MAX_SERVE_ARGS} serve arguments")
    out: dict[str, str] = {}
    index = 0
    while index < len(items):
        raw = str(items[index])
        index += 1
        flag, eq, value = raw.partition("=")
        if flag not in SERVE_ARGS:
            raise WarmFormatError(
                "bad_serve_args",
                f"serve argument {flag[:64]!r} is not one a warm job passes to vLLM; allowed: "
                + ", ".join(sorted(SERVE_ARGS)),
            )
        if SERVE_ARGS[flag] and not eq:
            if index >= len(items):
                raise WarmFormatError("bad_serve_args", f"{flag} needs a value")
            value = str(items[index])
            index += 1
        elif not SERVE_ARGS[flag] and eq:
            raise WarmFormatError("bad_serve_args", f"{flag} takes no value")
        if len(value) > MAX_ARG_VALUE or not _VALUE.match(value):
            raise WarmFormatError(
                "bad_serve_args",
                f"the value of {flag} must be printable ASCII, at most {MAX_ARG_VALUE} characters",
            )
        if flag in out:
            raise WarmFormatError("bad_serve_args", f"{flag} is given twice")
        out[flag] = f"{flag}={value}" if SERVE_ARGS[flag] else flag
    return [out[flag] for flag in sorted(out)]


@dataclass(frozen=True)
class WarmKey:
    """What goes into vLLM's compile-cache hash that a node knows before starting vLLM.

    ``gpu`` is the compute capability (``"9.0"``; ``"cpu"`` on vLLM's CPU backend); ``model``
    is the string given to `vllm serve` as the model (vLLM's ModelConfig hashes it as is, so a
    bundle made with the model at another path is not used). The rest of vLLM's hash (its code,
    the environment factors, the Inductor configuration) follows from these on an unchanged
    install, and is compared after start from vLLM's own cache_key_factors.json."""

    vllm_version: str
    torch_version: str
    gpu: str
    tensor_parallel_size: int
    dtype: str
    model: str
    serve_args: tuple[str, ...] = field(default_factory=tuple)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["serve_args"] = list(self.serve_args)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WarmKey:
        try:
            return cls(
                vllm_version=str(data["vllm_version"]),
                torch_version=str(data["torch_version"]),
                gpu=str(data["gpu"]),
                tensor_parallel_size=int(data["tensor_parallel_size"]),
                dtype=str(data["dtype"]),
                model=str(data["model"]),
                serve_args=tuple(str(a) for a in data.get("serve_args") or ()),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise WarmFormatError("bad_warm_key", f"a warm key lacks a part: {exc}") from None


def differences(bundle: WarmKey, node: WarmKey) -> list[str]:
    """The key parts in which ``node`` differs from ``bundle``, each as
    ``part: bundle has X, this node has Y`` (serve arguments one by one); [] when all match."""
    found: list[str] = []
    for name in ("vllm_version", "torch_version", "gpu", "tensor_parallel_size", "dtype", "model"):
        mine, theirs = getattr(bundle, name), getattr(node, name)
        if mine != theirs:
            found.append(f"{name}: bundle has {mine}, this node has {theirs}")
    ours = {f: a for a in bundle.serve_args if (f := a.partition("=")[0]) not in NOT_HASHED}
    yours = {f: a for a in node.serve_args if (f := a.partition("=")[0]) not in NOT_HASHED}
    for flag in sorted(set(ours) | set(yours)):
        if ours.get(flag) != yours.get(flag):
            found.append(
                f"serve_args {flag}: bundle has {ours.get(flag) or '(not given)'}, this node "
                f"has {yours.get(flag) or '(not given)'}"
            )
    return found


def factor_differences(bundle: Mapping[str, Any], seen: Mapping[str, Any]) -> list[str]:
    """vLLM's hash factors (cache_key_factors.json) that differ: ``config_hash``,
    ``code_hash``, ``compiler_hash`` by name, ``env`` by the variables that differ."""
    found: list[str] = []
    env_a, env_b = bundle.get("env"), seen.get("env")
    if isinstance(env_a, Mapping) and isinstance(env_b, Mapping):
        for name in sorted(set(env_a) | set(env_b)):
            if env_a.get(name) != env_b.get(name):
                found.append(
                    f"env {name}: bundle has {env_a.get(name)!r}, vLLM has {env_b.get(name)!r}"
                )
    elif env_a != env_b:
        found.append("env: the environment factors differ")
    for name in ("config_hash", "code_hash", "compiler_hash"):
        if bundle.get(name) != seen.get(name):
            found.append(f"{name}: bundle has {bundle.get(name)}, vLLM computed {seen.get(name)}")
    return found


def hash_dir_of(path: str) -> str | None:
    """The hash directory (``torch_compile_cache/<hash>`` or
    ``torch_compile_cache/torch_aot_compile/<hash>``) that a relative path lies in."""
    parts = path.split("/")
    if len(parts) >= 2 and parts[0] == CACHE_DIR and parts[1] != AOT_DIR:
        return "/".join(parts[:2])
    if len(parts) >= 3 and parts[0] == CACHE_DIR and parts[1] == AOT_DIR:
        return "/".join(parts[:3])
    return None


def check_member_name(name: str) -> str | None:
    """Why a tar member name is refused, or None. Relative, under ``torch_compile_cache/``, no
    '.', '..' or empty segment, no NUL or backslash, bounded length and depth."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if len(name) > MAX_MEMBER_NAME:
        return f"a name longer than {MAX_MEMBER_NAME} characters"
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return "an absolute path or a backslash or NUL"
    trimmed = name[:-1] if name.endswith("/") else name
    segments = trimmed.split("/")
    if len(segments) > MAX_MEMBER_DEPTH:
        return f"a path deeper than {MAX_MEMBER_DEPTH} levels"
    for segment in segments:
        if segment in ("", ".", ".."):
            return "an empty, '.' or '..' segment"
        if not _MEMBER_SEGMENT.match(segment):
            return f"segment {segment[:64]!r} outside [A-Za-z0-9_][A-Za-z0-9._+=@,-]*"
    if segments[0] != CACHE_DIR:
        return f"a path outside {CACHE_DIR}/"
    return None
