"""What the two load paths share: one options type, and which file is a rank's.

The engine (tensor_registry.engine) loads an artifact with a layout manifest; tensorizer's reader
(tensor_registry.tensorizer_load) loads the rest, and the engine falls back to it. Both take the
same :class:`LoadOptions` and find a rank's file with :func:`rank_file`, both from here, so
neither imports the other back.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from tensor_registry.api.resolution import Resolution

# How much of a local file's end cudaHostRegister pins per call (the engine's pinning thread).
REGISTER_SLICE = 512 << 20


@dataclass(frozen=True)
class LoadOptions:
    """How one load runs. ``None`` means "decide": from the resolve answer's advice
    (``readers``, ``block_bytes``) or from what the node measures (``register_fraction``:
    tensor_registry.engine.plan). The tensorizer path reads ``verify`` and ``readers``
    (tensorizer's ``verify_hash`` and ``num_readers``); the rest steer the engine.

    - ``verify``: check every chunk's digest (tensorizer: its per-tensor hashes).
    - ``readers``: reader threads of a local file, HTTP range connections of a URL,
      tensorizer's ``num_readers``.
    - ``block_bytes``: a URL's range block (a local file keeps the engine's own).
    - ``register_fraction``: the share of a local file pinned in place from its end
      (``cudaHostRegister``) while the readers pread the rest into the pinned ring; with
      ``balance`` the most, the two sides meeting where their rates put them.
    - ``ring_buffers``, ``register_slice``, ``pin_threads``, ``prefault_threads``,
      ``hash_threads``: the sizes of each side; ``digest_on``: "auto", "device" or "host".
    - ``url_spans`` / ``url_ahead``: a URL's readers ask for spans of blocks / ask for the next
      span on a second connection while the current one ends (off only to measure them).
    - ``skip_marker``: leave vLLM's marker tensor out of the result.
    """

    verify: bool = True
    readers: int | None = None
    block_bytes: int | None = None
    register_fraction: float | None = None
    balance: bool = False
    ring_buffers: int | None = None
    register_slice: int = REGISTER_SLICE
    pin_threads: int = 1
    prefault_threads: int = 0
    hash_threads: int = 4
    digest_on: str = "auto"
    url_spans: bool = True
    url_ahead: bool = True
    skip_marker: bool = True

    def given(self, **changes: Any) -> LoadOptions:
        """These options with ``changes`` applied, leaving out the ones given as None (a
        keyword the caller did not set)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise TypeError(f"unknown load options: {', '.join(unknown)}")
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


def rank_file(resolution: Resolution, rank: int) -> str:
    """The path of rank ``rank``'s weights file in the resolved artifact (sorted by path)."""
    weights = sorted(f.path for f in resolution.files if f.kind == "weights")
    if not 0 <= rank < len(weights):
        resolution.rank_uri(rank)  # raises invalid_rank
    return weights[rank]
