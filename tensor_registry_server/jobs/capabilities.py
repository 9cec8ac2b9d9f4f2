"""What this worker can do, as advertised in its heartbeat and checked by the API.

``probe()`` imports torch (and may initialise CUDA), so a prefork worker's main process runs it
in a short-lived child (``python -m tensor_registry_server.jobs.capabilities``): a process that
has initialised
CUDA must not fork pool children. Memory figures are refreshed with every heartbeat.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
from typing import Any

from tensor_registry.formats.variant import FORMATS

log = logging.getLogger("tensor_registry.worker")

PROBE_TIMEOUT_SECONDS = 120


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def probe() -> dict[str, Any]:
    import torch

    devices = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "index": index,
                    "name": props.name,
                    "total_memory": int(props.total_memory),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    try:
        from tensorizer import _crypt

        encryption = bool(_crypt.available)
    except ImportError:
        encryption = False
    vllm = _version("vllm") if importlib.util.find_spec("vllm") is not None else None
    return {
        "cuda": {
            "available": bool(devices),
            "device_count": len(devices),
            "devices": devices,
            "cuda_version": torch.version.cuda,
        },
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "tensorizer": _version("tensorizer"),
            "transformers": _version("transformers"),
            "safetensors": _version("safetensors"),
            "vllm": vllm,
        },
        "formats": list(FORMATS) if vllm else [f for f in FORMATS if f != "vllm"],
        "encryption": encryption,
    }


def probe_in_subprocess() -> dict[str, Any]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tensor_registry_server.jobs.capabilities"],
            capture_output=True,
            timeout=PROBE_TIMEOUT_SECONDS,
            check=True,
        )
        return dict(json.loads(done.stdout.decode().strip().splitlines()[-1]))
    except (subprocess.SubprocessError, ValueError, IndexError, OSError) as exc:
        log.error("capability probe failed (%s); advertising CPU only", exc)
        return {
            "cuda": {"available": False, "device_count": 0, "devices": []},
            "versions": {"python": platform.python_version()},
            "formats": ["hf"],
            "encryption": False,
            "probe_error": str(exc)[:500],
        }


def memory() -> dict[str, Any]:
    import psutil

    vm = psutil.virtual_memory()
    return {
        "count": os.cpu_count() or 1,
        "memory_total": int(vm.total),
        "memory_available": int(vm.available),
    }


if __name__ == "__main__":
    print(json.dumps(probe()))
