"""Pickle-based weights: recognised by name and by content, so finalize can refuse them.

Unpickling runs code the file chooses (``torch.load`` of a ``.bin``/``.pt`` without
``weights_only``, transformers' old loaders): a registry that stores and serves such files hands
every node that loads them a way to run code. Finalize refuses them (problem ``pickle_refused``);
a conversion job turns them into safetensors in an isolated worker process (docs/pickles.md).

By name: ``PICKLE_SUFFIXES``. By content, whatever the name: a raw pickle (protocol 2 to 5 starts
with the PROTO opcode ``0x80`` and its number), or a zip archive (``torch.save``'s format since
1.6) whose directory names a ``*.pkl`` entry (``archive/data.pkl``). The zip directory sits at
the end of the file: ``ZIP_TAIL_BYTES`` of it are read, never the whole file.
"""

from __future__ import annotations

import struct

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# What is never sniffed: formats that cannot carry a pickle the loaders would run.
SAFE_SUFFIXES = (".safetensors", ".json", ".txt", ".md", ".jinja", ".model", ".tiktoken")
HEAD_BYTES = 8
# The end-of-central-directory record (22 bytes + a comment of at most 65535) and the central
# directory before it, for archives of up to a few thousand entries.
ZIP_TAIL_BYTES = 1024 * 1024
_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_CENTRAL = b"PK\x01\x02"


MAX_REMOTE_CODE_ENTRIES = 64


def remote_code(config: dict[str, object] | None, paths: list[str]) -> dict[str, object] | None:
    """The executable content a checkpoint carries besides weights: config.json's ``auto_map``
    (transformers imports those classes from the repo's ``*.py`` files when a user passes
    ``trust_remote_code``) and the ``*.py`` files themselves; None when it carries none."""
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    mapped = (
        {str(k): str(v)[:256] for k, v in list(auto_map.items())[:MAX_REMOTE_CODE_ENTRIES]}
        if isinstance(auto_map, dict)
        else {}
    )
    files = sorted(p for p in paths if p.lower().endswith(".py"))[:MAX_REMOTE_CODE_ENTRIES]
    if not mapped and not files:
        return None
    return {"auto_map": mapped, "files": files}


def by_name(path: str) -> str | None:
    """Why ``path``'s name marks it as pickle-based, or None."""
    lower = path.lower()
    for suffix in PICKLE_SUFFIXES:
        if lower.endswith(suffix):
            return f"'{suffix}' files are pickle-based (PyTorch/transformers checkpoints)"
    return None


def needs_sniffing(path: str) -> bool:
    return not path.lower().endswith(SAFE_SUFFIXES)


def is_zip(head: bytes) -> bool:
    return head.startswith(_ZIP_LOCAL)


def by_head(head: bytes) -> str | None:
    """Why the first bytes are a pickle stream, or None (zip archives: see ``zip_pickles``)."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return f"a raw pickle stream (protocol {head[1]})"
    return None


def zip_pickles(tail: bytes) -> list[str]:
    """The ``*.pkl`` entries named in a zip's central directory, read from the archive's last
    bytes (as many as were read: a directory cut off at the front lists fewer entries)."""
    names: list[str] = []
    at = tail.find(_ZIP_CENTRAL)
    while at != -1 and at + 46 <= len(tail):
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", tail, at + 28)
        name = tail[at + 46 : at + 46 + name_len].decode("utf-8", "replace")
        if name.lower().endswith(".pkl"):
            names.append(name)
        at = tail.find(_ZIP_CENTRAL, at + 46 + name_len + extra_len + comment_len)
    return names
