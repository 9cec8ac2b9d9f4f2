"""Driving the real Hugging Face clients against a registry, each in its own process.

``huggingface_hub`` reads ``HF_ENDPOINT`` (and the cache folders) when it is imported, so every
call runs in a fresh interpreter with the environment set: ``HF_ENDPOINT`` the registry,
``HF_HOME`` a folder of the test, ``HF_TOKEN`` the registry token, Xet off. The snippet prints
one JSON value on its last line of stdout; an exception is printed as
``{"error": ClassName, "message": ...}`` so the test asserts on the client's own exception type.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

HF_CLI = Path(sys.executable).with_name("hf")

_PRELUDE = """
import json, sys, traceback
def _main():
{body}
try:
    _result = _main()
except Exception as exc:  # the client's own exception type is what the test checks
    traceback.print_exc()
    _result = {{"error": type(exc).__name__, "message": str(exc)[:2000]}}
print(json.dumps(_result))
"""


def hf_env(url: str, token: str | None, home: Path, *, xet_off: bool = True) -> dict[str, str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGINGFACE_", "TENSOR_REGISTRY_", "TRANSFORMERS_"))
    }
    env = {
        **clean,
        "HF_ENDPOINT": url,
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_ETAG_TIMEOUT": "30",
    }
    if xet_off:
        env["HF_HUB_DISABLE_XET"] = "1"
    if token is not None:
        env["HF_TOKEN"] = token
    return env


def run_hf(url: str, token: str | None, home: Path, body: str, *, timeout: float = 300) -> Any:
    """Run ``body`` (a function body returning a JSON value) with the client configured."""
    code = _PRELUDE.format(body=textwrap.indent(textwrap.dedent(body), "    "))
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=hf_env(url, token, home),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr
    result = json.loads(lines[-1])
    if isinstance(result, dict) and "error" in result:
        result["stderr"] = done.stderr[-4000:]
    return result


def hf_cli(
    url: str, token: str | None, home: Path, *args: str, xet_off: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HF_CLI), *args],
        env=hf_env(url, token, home, xet_off=xet_off),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
