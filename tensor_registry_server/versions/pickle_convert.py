"""Pickle-based weights → safetensors, in a child process that can neither reach the network
nor see the worker's secrets, loading with ``torch.load(weights_only=True)``.

The layers, each covering what the one before might miss:
1. ``weights_only=True``: torch's restricted unpickler, which builds only tensors, storages and
   plain containers and refuses any other global (``os.system``, ``socket.socket``, a class of
   the attacker's). This is what stops a malicious pickle; the rest limits the damage of a flaw
   in it.
2. A fresh interpreter (``python -I -S``: no user site, no ``PYTHON*`` variables, no current
   directory on the path) with an empty environment: no database URL, no storage credentials,
   no keys. Its working directory is a private temp dir holding only the files to convert.
3. No network: where ``unshare --net --map-root-user`` works (user namespaces allowed), the
   child runs in a new network namespace with no interface but a down loopback. Everywhere,
   the child replaces ``socket.socket`` (and ``create_connection``/``socketpair``) with a
   function that raises, before it loads anything.
4. Limits: CPU time and address space (``resource.setrlimit`` in the child), a wall-clock
   timeout, and a cap on output size (the safetensors it writes).

Limits of this choice (docs/pickles.md): no seccomp filter, so a flaw in torch's restricted
unpickler that gave native code execution could still call ``connect`` directly where user
namespaces are unavailable, and could write files the worker's user may write (the child runs
as the worker's user). Conversion runs on a worker, never in the API process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The child: block sockets, load each file with weights_only, save safetensors. Paths come as
# argv (relative, inside the temp dir), never interpolated into code.
CHILD = r"""
import json, resource, socket, sys

def _refused(*args, **kwargs):
    raise OSError("network access is disabled while converting pickles")

class _NoSocket(socket.socket):
    # A class (modules that import later subclass socket.socket) that cannot be made.
    def __init__(self, *args, **kwargs):
        _refused()

socket.socket = _NoSocket
socket.SocketType = _NoSocket
socket.create_connection = _refused
socket.socketpair = _refused
socket.fromfd = _refused

cpu, memory = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
if memory:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

import torch
from safetensors.torch import save_file

done = []
for source, target in zip(sys.argv[3::2], sys.argv[4::2]):
    state = torch.load(source, map_location="cpu", weights_only=True, mmap=False)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise SystemExit(f"{source}: holds a {type(state).__name__}, not a dict of tensors")
    tensors = {}
    for name, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise SystemExit(f"{source}: entry {name!r} is a {type(value).__name__}, not a tensor")
        tensors[str(name)] = value.contiguous()
    # Tied weights share storage; safetensors refuses shared tensors: give each its own.
    seen = set()
    for name, value in list(tensors.items()):
        key = (value.untyped_storage().data_ptr(), value.storage_offset())
        if key in seen:
            tensors[name] = value.clone()
        seen.add(key)
    save_file(tensors, target, metadata={"format": "pt"})
    done.append({"source": source, "target": target, "tensors": len(tensors)})
print(json.dumps(done))
"""


class ConversionError(Exception):
    """The child refused or failed; ``str()`` is safe to show (no paths outside the job)."""


@dataclass(frozen=True)
class Isolation:
    network_namespace: bool


def safetensors_name(path: str) -> str:
    """``pytorch_model-00001-of-00002.bin`` → ``model-00001-of-00002.safetensors``."""
    stem, _, _ = path.rpartition(".")
    folder, _, base = stem.rpartition("/")
    if base.startswith("pytorch_model"):
        base = "model" + base[len("pytorch_model") :]
    return f"{folder}/{base}.safetensors" if folder else f"{base}.safetensors"


def _unshare_works() -> bool:
    tool = shutil.which("unshare")
    if tool is None:
        return False
    try:
        done = subprocess.run(
            [tool, "--net", "--map-root-user", "true"], capture_output=True, timeout=10, env={}
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def convert(
    workdir: Path,
    pairs: list[tuple[str, str]],
    *,
    timeout_seconds: float = 3600,
    cpu_seconds: int = 3600,
    memory_bytes: int = 0,
) -> tuple[list[dict[str, object]], Isolation]:
    """Convert ``pairs`` of (pickle file, safetensors file), paths relative to ``workdir``,
    in the isolated child. Returns what it wrote and how it was isolated."""
    for source, target in pairs:
        for name in (source, target):
            if name.startswith("/") or ".." in Path(name).parts:
                raise ConversionError(f"{name!r} is not a path inside the job's directory")
    netns = _unshare_works()
    argv = [sys.executable, "-I", "-S", "-c", CHILD, str(cpu_seconds), str(memory_bytes)]
    argv += [name for pair in pairs for name in pair]
    if netns:
        argv = [shutil.which("unshare") or "unshare", "--net", "--map-root-user", *argv]
    # -I -S leave site-packages off the path and ignore PYTHONPATH: the child gets the
    # worker's import path (torch, safetensors) in its code, and an empty environment.
    argv[argv.index("-c") + 1] = (
        f"import sys; sys.path[:0] = {json.dumps([p for p in sys.path if p])}\n" + CHILD
    )
    try:
        done = subprocess.run(
            argv,
            cwd=workdir,
            env={},
            capture_output=True,
            text=True,
            timeout=timeout_seconds,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise ConversionError(f"conversion took longer than {timeout_seconds:g} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ConversionError(f"the weights could not be loaded safely: {last[:500]}")
    written: list[dict[str, object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return written, Isolation(network_namespace=netns)
