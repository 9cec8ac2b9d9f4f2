"""vLLM end to end on a GPU machine, through the registry as users run it.

A real `tensor-registry serve` with its worker (embedded broker, SQLite, local storage) on a
machine with vLLM and a GPU; then, with the CLI: `publish` a random-weight Llama, `tensorize
--format vllm` (the worker runs vLLM's serializer on the GPU), `pull --dest DIR` (config files,
key file for the encrypted artifact, and the `vllm serve` command whose extra config carries
the registry's signed blob URL), and vLLM itself loads the weights from that URL with
`load_format="tensorizer"` and the printed `--model-loader-extra-config`, exactly as printed.
The generated token ids must equal those of vLLM loading the source safetensors.

    VLLM_USE_FLASHINFER_SAMPLER=0 python3 bench/vllm/vllm_e2e.py --workdir /tmp/e2e

Prints one JSON summary; exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.vllm.vllm_check import build_source, run_generate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/tmp/vllm-e2e")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    from bench.common import free_port
    from harness.serve_process import ServeProcess

    work = Path(args.workdir)
    src = work / "src"
    build_source(src, args.dtype)
    token = "trg_e2e-" + secrets.token_urlsafe(24)
    server = ServeProcess(
        data_dir=work / "registry",
        port=free_port(),
        worker=True,
        env={"TENSOR_REGISTRY_ADMIN_TOKEN": token},
    ).start(timeout=240)
    env = {**os.environ, "TENSOR_REGISTRY_URL": server.url, "TENSOR_REGISTRY_TOKEN": token}
    summary: dict[str, object] = {}
    ok = True

    def cli(*argv: str, timeout: float = 600) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "tensor_registry.cli", *argv],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
        return proc.stdout

    try:
        cli("publish", str(src), "--model", "acme/tiny-llama")
        reference = run_generate(src, args.dtype, "safetensors", None, None)
        summary["reference"] = {k: v for k, v in reference.items() if k != "tokens"}
        for encrypt in (False, True):
            label = "encrypted" if encrypt else "plain"
            t0 = time.perf_counter()
            job = cli(
                "tensorize", "acme/tiny-llama", "--dtype", args.dtype, "--format", "vllm",
                "--wait", *(["--encrypt"] if encrypt else []),
            )  # fmt: skip
            seconds = round(time.perf_counter() - t0, 1)
            dest = work / f"node-{label}"
            pulled = cli(
                "pull", "acme/tiny-llama", "--dtype", args.dtype, "--format", "vllm",
                "--encrypted" if encrypt else "--unencrypted", "--dest", str(dest),
            )  # fmt: skip
            command = shlex.split(pulled.strip().splitlines()[-1])
            extra = command[command.index("--model-loader-extra-config") + 1]
            model_dir = command[2]
            loaded = run_generate(Path(model_dir), args.dtype, "tensorizer", None, None, extra)
            same = loaded.get("tokens") is not None and loaded["tokens"] == reference.get("tokens")
            ok &= same
            config = json.loads(extra)
            summary[label] = {
                "tensorize_job_seconds": seconds,
                "job_tail": job.strip().splitlines()[-1:],
                "vllm_serve": [c if not c.startswith("{") else "<extra-config>" for c in command],
                "extra_config_keys": sorted(config),
                "uri_is_registry_blob": str(config.get("tensorizer_uri", "")).startswith(
                    f"{server.url}/api/v1/blobs/"
                ),
                "pulled_files": sorted(p.name for p in dest.iterdir()),
                "load": {k: v for k, v in loaded.items() if k != "tokens"},
                "tokens_identical": same,
            }
    finally:
        server.stop()
    summary["ok"] = bool(ok)
    print(json.dumps(summary, indent=1), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
