"""The load engine: an artifact's bytes onto a device at the hardware's rate, every chunk verified.

    from tensor_registry.engine import load_artifact
    result = load_artifact("acme/llama:prod", device="cuda")      # LoadResult
    result.tensors["model.embed_tokens.weight"], result.gbps, result.path   # "engine"

It needs the artifact's layout manifest (tensor_registry.formats.layout, the file
``tensors.layout.json`` beside the weights): where every tensor's bytes lie and a BLAKE3 digest per
8 MiB chunk. No tensorizer parsing, no per-tensor reads. One module per part of the way:

- ``artifacts``  resolve, check the signed manifest, pick the rank's file and where to read it
  (node cache or signed URL), fall back to tensorizer; ``LoadResult``, ``copy_into_module``
- ``sources``    the bytes of a local file (``preadv``) or of a URL (HTTP range connections)
- ``checks``     chunk digests, short reads, wrong ranges: ``ChunkMismatch``
- ``views``      tensors as views of one buffer (a host mapping, or one device allocation)
- ``cpu``        into host memory: a private mmap of a local file, a URL into an anonymous mapping
- ``cuda``       onto a CUDA device: a pinned ring and a registered tail, device staging
- ``pinned``     pinned host memory: the ring, ``cudaHostRegister`` through ctypes, unpinning
- ``gpu_blake3`` the chunk digests computed on the device (``blake3_kernels.cu``, built and
  launched by ``kernels``: NVRTC and the driver API, or the host C compiler for CPU tensors)

A digest mismatch, a short read or a range answered with other bytes raises
``ChunkMismatch`` naming the tensors in the bad chunk; nothing is returned half-loaded. An
expired URL during a load re-resolves once and starts again. Encrypted artifacts and artifacts
without a manifest load through tensorizer's reader (tensor_registry.tensorizer_load) and say so in
``LoadResult.path``.

torch is imported lazily (the base client installs without it).
"""

from tensor_registry.engine.artifacts import (
    LoadResult,
    copy_into_module,
    fetch_layout,
    load_artifact,
    result_json,
)
from tensor_registry.engine.checks import ChunkMismatch
from tensor_registry.engine.cpu import load_file_cpu, load_url_cpu
from tensor_registry.engine.cuda import load_cuda
from tensor_registry.engine.pinned import wait_released
from tensor_registry.engine.sources import BLOCK_BYTES, DEFAULT_CONNECTIONS
from tensor_registry.loading import LoadOptions, rank_file

__all__ = [
    "BLOCK_BYTES",
    "DEFAULT_CONNECTIONS",
    "ChunkMismatch",
    "LoadOptions",
    "LoadResult",
    "copy_into_module",
    "fetch_layout",
    "load_artifact",
    "load_cuda",
    "load_file_cpu",
    "load_url_cpu",
    "rank_file",
    "result_json",
    "wait_released",
]
