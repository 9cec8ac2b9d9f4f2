"""A stand-in `vllm` executable for tests (vLLM itself is not installed here).

It parses `vllm serve` arguments with the flags and choices vLLM defines for what the registry
prints (unknown flags fail, as vLLM's parser fails them), then checks that everything the
command names is usable the way vLLM's tensorizer loader would use it: the model directory
holds config.json, the extra config has only keys every vLLM generation accepts
(docs/tensorizer-vllm-facts.md §1.2), each rank's tensorizer URI answers a Range request with
206 (or is a local file), and the key file holds 32 bytes. What it saw goes to $VLLM_STUB_OUT.
Exit 0 when the command would start loading, 2 for a parse error, 1 for a failed check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import httpx

# Keys accepted by vLLM 0.9 and the newer loader alike (others are a TypeError in 0.9).
EXTRA_CONFIG_KEYS = {
    "tensorizer_uri",
    "encryption_keyfile",
    "num_readers",
    "verify_hash",
    "s3_access_key_id",
    "s3_secret_access_key",
    "s3_endpoint",
    "vllm_tensorized",
}
DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]
LOAD_FORMATS = [
    "auto",
    "pt",
    "safetensors",
    "npcache",
    "dummy",
    "tensorizer",
    "sharded_state",
    "gguf",
    "bitsandbytes",
    "mistral",
    "runai_streamer",
]


def fail(message: str) -> None:
    print(f"vllm-stub: {message}", file=sys.stderr)
    sys.exit(1)


def check_uri(uri: str) -> None:
    if uri.startswith(("http://", "https://")):
        if not uri.startswith(("http://127.0.0.1", "http://localhost")):
            fail(f"refusing a non-loopback URL in tests: {uri}")
        answer = httpx.get(uri, headers={"Range": "bytes=0-7"}, timeout=30)
        if answer.status_code != 206 or len(answer.content) != 8:
            fail(f"{uri.split('?')[0]}: Range answered {answer.status_code}")
    elif not Path(uri).is_file():
        fail(f"{uri} is not a file")


def serve_parser() -> argparse.ArgumentParser:
    """`vllm serve`'s flags and choices for what the registry prints: the one parser every
    printed command is checked with (here and in tests/client/test_copy_commands.py)."""
    parser = argparse.ArgumentParser(prog="vllm serve", exit_on_error=False)
    parser.add_argument("model")
    parser.add_argument("--load-format", choices=LOAD_FORMATS, default="auto")
    parser.add_argument("--model-loader-extra-config", type=json.loads, default={})
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--dtype", choices=DTYPES, default="auto")
    return parser


def main() -> None:
    if sys.argv[1:2] != ["serve"]:
        print("vllm-stub: only `vllm serve` is stood in for", file=sys.stderr)
        sys.exit(2)
    args = serve_parser().parse_args(sys.argv[2:])
    if not (Path(args.model) / "config.json").is_file():
        fail(f"{args.model} has no config.json")
    extra = args.model_loader_extra_config
    if args.load_format == "tensorizer":
        unknown = set(extra) - EXTRA_CONFIG_KEYS
        if unknown:
            fail(f"extra config keys vLLM 0.9 rejects: {sorted(unknown)}")
        uri = extra.get("tensorizer_uri") or str(Path(args.model) / "model.tensors")
        sharded = re.search(r"%0\dd", uri) is not None
        if sharded != (args.tensor_parallel_size > 1):
            fail(f"tensor-parallel-size {args.tensor_parallel_size} with uri {uri.split('?')[0]}")
        for rank in range(args.tensor_parallel_size):
            check_uri(uri % rank if sharded else uri)
        keyfile = extra.get("encryption_keyfile")
        if keyfile is not None and (
            not Path(keyfile).is_file() or Path(keyfile).stat().st_size != 32
        ):
            fail(f"key file {keyfile} missing or not 32 bytes")
    out = os.environ.get("VLLM_STUB_OUT")
    if out:
        seen = {**vars(args), "model": str(Path(args.model).resolve()), "cwd": os.getcwd()}
        with open(out, "a") as fh:
            fh.write(json.dumps(seen) + "\n")


if __name__ == "__main__":
    main()
