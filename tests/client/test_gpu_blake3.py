"""The engine's on-device BLAKE3 (app/client/engine/gpu_blake3.py) computes the blake3
package's digests, bit for bit, and finds the one chunk whose byte changed.

CI has no GPU: the same Triton kernels run through Triton's interpreter (``TRITON_INTERPRET=1``,
set before Triton is imported, hence the subprocess) on CPU tensors. The H200 run of the
engine (bench/engine_gpu.py) compiles them for the device and checks every load against the
source tensors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, random
    import blake3, torch
    from app.client.engine import gpu_blake3
    from app.client.layout import FileLayout

    rng = random.Random(7)
    out = {}

    def run(name, chunk, size, flip=None):
        data = bytearray(rng.randbytes(size))
        digests = tuple(
            blake3.blake3(bytes(data[i : i + chunk])).hexdigest() for i in range(0, size, chunk)
        )
        if flip is not None:
            data[flip] ^= 0x40
        layout = FileLayout("model.tensors", size, "", 1, False, chunk, digests, ())
        device = gpu_blake3.DeviceDigests(layout, "cpu")
        staged = torch.frombuffer(data, dtype=torch.uint8)
        # Two blocks, as the engine's ring hands them over (the second starts on a chunk).
        device.hash_block(staged[:chunk], 0, chunk)
        device.hash_block(staged[chunk:], chunk, size)
        out[name] = {"bad": device.mismatches(), "tail": device.host_tail()}

    # One 64 KiB subtree per chunk: the root is made inside the leaf kernel.
    run("two_chunks_second_flipped", 64 << 10, 2 * (64 << 10), flip=(64 << 10) + 1001)
    # Two subtrees per chunk (the parent kernel makes the root); a shorter last chunk is left
    # to the host, also when it is all a block holds. (Each 64 KiB program takes the
    # interpreter about 4 s: one chunk of this shape, not two.)
    run("tree_and_tail", 128 << 10, (128 << 10) + 5000)
    out["supported"] = [gpu_blake3.supported(n) for n in (8 << 20, 64 << 10, 32 << 10, 3 << 20)]
    print(json.dumps(out))
    """
)


def test_device_digests_equal_blake3_and_name_the_flipped_chunk() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["two_chunks_second_flipped"] == {"bad": [1], "tail": None}
    assert out["tree_and_tail"] == {"bad": [], "tail": [128 << 10, (128 << 10) + 5000]}
    assert out["supported"] == [True, True, False, False]
