"""The vLLM loader plugin's CUDA path, on a GPU machine without vLLM or the registry's server.

    python bench/vllm/vllm_plugin_check.py --hidden 8192 --out $OUT   # torch, tensorizer, blake3

This runs the interface stand-in of harness/vllm_standin.py (the plugin entry point, the loader
registry, BaseModelLoader.load_model building the model on ``cuda``) with the real plugin and
the real engine; bench/vllm/vllm_plugin_real.py runs the plugin in a real vLLM. The registry is
played by two loopback servers (bench/common.py): bench/engine/gpu_load.py's signed range server for
the files and a resolve endpoint answering what `GET /api/v1/resolve` answers for them (files,
signed URLs, the registry's engine advice for the node). Checked, each in its own process as
vLLM's ranks are:

- a vllm-format TP=2 artifact: each rank's file through the engine onto the GPU (signed URL,
  then the node cache after ``download_model``), copied into the parameters in place;
- an hf artifact: every rank reads the one file and the model's ``load_weights`` shards it;

every parameter compared byte for byte with the source. Prints and writes JSON.

Run with ``--device cpu --hidden 64 --vocab 128`` (all runs bit-exact, in place, no signature
in the log). On the H200 (fifth session, ``--hidden 8192``) every rank resolved, fetched the
layout manifest and read its file over the signed URL onto the GPU, then failed on the host
digest of the file's last chunk: ``import blake3`` in the rank processes, whose PYTHONPATH
dropped the carried wheels. Fixed (the caller's PYTHONPATH is kept); re-run in the sixth
session (bench/results/engine.md, run 10): every rank bit-exact, over the URL and from the node
cache, no signature in the log. Wheels it needs there: tensorizer 2.12.1 (and its
dependencies), blake3 1.0.11.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

MARKER = ".vllm_tensorized_marker"


def hf_state(hidden: int, vocab: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    state = {
        f"{p}_proj.weight": torch.randn(hidden, hidden, generator=g).to(torch.bfloat16)
        for p in ("q", "k", "v", "o")
    }
    return {
        "embed.weight": torch.randn(vocab, hidden, generator=g).to(torch.bfloat16),
        **state,
        "norm": torch.randn(hidden, generator=g).to(torch.bfloat16),
        "position_ids": torch.arange(8),
    }


def rank_state(hf: dict[str, Any], rank: int, tp: int) -> dict[str, Any]:
    import torch

    qkv = torch.cat([hf[f"{p}_proj.weight"].chunk(tp, dim=0)[rank] for p in ("q", "k", "v")])
    return {
        "embed.weight": hf["embed.weight"],
        "qkv_proj.weight": qkv.contiguous(),
        "o_proj.weight": hf["o_proj.weight"].chunk(tp, dim=1)[rank].contiguous(),
        "norm": hf["norm"],
        "position_ids": hf["position_ids"],
    }


def same_bytes(a: Any, b: Any) -> bool:
    import torch

    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def write_artifact(directory: Path, states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tensorizer files (+ the layout manifest) of ``states``; the resolve answer's files."""
    from tensorizer import TensorSerializer

    from bench.common import publish_files

    directory.mkdir(parents=True)
    names = (
        ["model.tensors"]
        if len(states) == 1
        else [f"model-rank-{r:03d}.tensors" for r in range(len(states))]
    )
    for name, state in zip(names, states, strict=True):
        serializer = TensorSerializer(str(directory / name))
        serializer.write_state_dict(state)
        serializer.close()
    return publish_files(directory, names)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    import torch

    from bench.common import resolve_answer, resolve_server
    from bench.engine.gpu_load import builtin_server
    from harness.vllm_standin import write_standin

    work = Path(tempfile.mkdtemp(prefix="vllm-plugin-check-"))
    pkg = write_standin(work / "pkg", serializing=False)
    dist = work / "site" / "tensor_registry_check-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tensor-registry-check\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\ntensor_registry = tensor_registry.vllm.plugin:register\n"
    )
    model_dir = work / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["ToyForCausalLM"],
                "hidden_size": args.hidden,
                "vocab_size": args.vocab,
                "torch_dtype": "bfloat16",
            }
        )
    )

    hf = hf_state(args.hidden, args.vocab)
    storage = work / "storage"
    vllm_files = write_artifact(
        storage / "vllm", [{**rank_state(hf, r, 2), MARKER: torch.zeros(0)} for r in range(2)]
    )
    hf_files = write_artifact(storage / "hf", [hf])
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        sign = stack.enter_context(builtin_server(storage))
        answers = {
            "acme/toy-vllm": resolve_answer("acme/toy-vllm", "vllm", 2, vllm_files, sign, "vllm"),
            "acme/toy-hf": resolve_answer("acme/toy-hf", "hf", 1, hf_files, sign, "hf"),
        }
        url = stack.enter_context(resolve_server(answers))
        runs = [("acme/toy-vllm", r, 2, False) for r in range(2)]
        runs += [("acme/toy-vllm", r, 2, True) for r in range(2)]  # after download_model
        runs += [("acme/toy-hf", r, 2, False) for r in range(2)]
        for model, rank, tp, download in runs:
            out = work / f"out-{len(results)}.pt"
            spec = work / f"spec-{len(results)}.json"
            spec.write_text(
                json.dumps(
                    {
                        "model_dir": str(model_dir),
                        "load_format": "tensor-registry",
                        "extra": {"model": model},
                        "out": str(out),
                        "device": args.device,
                        "download": download,
                    }
                )
            )
            env = {
                **os.environ,
                # The caller's path last: wheels carried to a device machine (tensorizer,
                # blake3) live there; the first H200 run lost every rank to a missing blake3.
                "PYTHONPATH": ":".join(
                    p
                    for p in (str(pkg), str(work / "site"), str(ROOT), os.environ.get("PYTHONPATH"))
                    if p
                ),
                "STANDIN_TP_RANK": str(rank),
                "STANDIN_TP_SIZE": str(tp),
                "TENSOR_REGISTRY_URL": url,
                "TENSOR_REGISTRY_TOKEN": "trg_check",
                "TENSOR_REGISTRY_CACHE_DIR": str(work / "cache"),
            }
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "vllm.standin_worker", str(spec)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            row: dict[str, Any] = {
                "model": model,
                "rank": rank,
                "tp": tp,
                "download": download,
                "rc": done.returncode,
                "seconds": round(time.perf_counter() - started, 2),
            }
            if done.returncode != 0:
                row["stderr"] = done.stderr[-3000:]
            else:
                saved = torch.load(out, map_location="cpu", weights_only=True)
                expected = rank_state(hf, rank, tp)
                row["in_place"] = saved["in_place"]
                row["bit_exact"] = set(saved["state"]) == set(expected) and all(
                    same_bytes(saved["state"][k], v) for k, v in expected.items()
                )
                line = done.stderr.split("tensor-registry: loaded ", 1)[1].splitlines()[0]
                row["summary"] = json.loads(line)
                row["signature_in_log"] = "sig=" in done.stderr
            results.append(row)
            print(json.dumps(row), flush=True)
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else args.device
    report = {
        "device": name,
        "hidden": args.hidden,
        "ok": all(r["rc"] == 0 and r["bit_exact"] and r["in_place"] for r in results),
        "runs": results,
    }
    print(json.dumps({"ok": report["ok"], "device": report["device"]}))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vllm_plugin_check.json").write_text(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
