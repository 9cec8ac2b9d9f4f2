"""A file's sha256, as the registry records it for every file it stores and as a node checks
it before it uses a byte (the node cache, `verify DIR`, `import`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

READ_BYTES = 4 * 1024 * 1024


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(READ_BYTES):
            digest.update(chunk)
    return digest.hexdigest()
