"""vLLM check (issue 4): the worker's `format: vllm` path against a real vLLM on a GPU machine.

1. build a random-weight Llama (GQA, so vLLM fuses q/k/v and gate/up) and save safetensors +
   config.json, as a published version holds them;
2. `tensor_registry_server.artifacts.making.serialize.serialize_vllm` (what the tensorize job
calls): vLLM's
own serializer in a
   child process, plain and encrypted (a fresh 32-byte key);
3. `tensor_registry_server.artifacts.making.verify.check_file` (the verify job's checks: marker,
dtypes, every hash;
   with the key for the encrypted file, refused without it) on what vLLM wrote;
4. the fused tensors in the file against the source checkpoint, bit for bit
   (`qkv_proj = cat(q, k, v)`, `gate_up_proj = cat(gate, up)`, every other tensor by name);
5. vLLM loads each file (`load_format="tensorizer"`, the way a serving node does) and
   generates greedily from fixed token ids; the tokens must equal those of vLLM loading the
   source safetensors. The encrypted file loads with its key and fails without it.

    python3 bench/vllm/vllm_check.py --workdir /tmp/vllm-check      # needs vLLM and one GPU

Every generate step runs in its own process (vLLM keeps GPU memory until its process ends).
Prints one JSON summary; exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VLLM_BUFFERS = ("rotary_emb.cos_sin_cache", "_k_scale", "_v_scale", "_q_scale", "_prob_scale")
PROMPTS = [[1, 306, 4658, 278, 6593, 310, 2834, 338], [1, 450, 4996, 17354, 1701, 29916], [1, 2]]


def build_model(
    dtype: str,
    *,
    hidden: int = 1024,
    intermediate: int = 2816,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int = 2,
    vocab: int = 32000,
    device: str = "cpu",
):  # type: ignore[no-untyped-def]
    """A random-weight Llama (seed 0) in ``dtype`` on ``device`` (``cuda``: a large one is
    initialized in seconds); GQA (``kv_heads`` < ``heads``), so vLLM fuses q/k/v and gate/up."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        torch_dtype=dtype,
    )
    with torch.device(device):
        return LlamaForCausalLM(config).to(getattr(torch, dtype))


def build_source(src: Path, dtype: str, **shape: int) -> dict[str, object]:
    """``build_model(dtype, **shape)`` saved as safetensors + config.json in ``src``."""
    model = build_model(dtype, **shape)
    model.save_pretrained(src, safe_serialization=True)
    return {"parameters": sum(p.numel() for p in model.parameters())}


def generate(args: argparse.Namespace) -> int:
    from vllm import LLM, SamplingParams

    extra: dict[str, object] = {}
    if args.extra_config:  # exactly what `tensor-registry pull` printed for `vllm serve`
        extra = json.loads(args.extra_config)
    elif args.load == "tensorizer":
        extra = {"tensorizer_uri": args.uri}
        if args.keyfile:
            extra["encryption_keyfile"] = args.keyfile
    llm = LLM(
        model=args.src,
        load_format=args.load,
        model_loader_extra_config=extra,
        dtype=args.dtype,
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=256,
        gpu_memory_utilization=0.3,
    )
    params = SamplingParams(temperature=0.0, max_tokens=24, detokenize=False)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    print("TOKENS " + json.dumps([list(o.outputs[0].token_ids) for o in outs]), flush=True)
    return 0


def run_generate(
    src: Path,
    dtype: str,
    load: str,
    uri: str | None,
    keyfile: str | None,
    extra_config: str | None = None,
) -> dict:
    cmd = [sys.executable, __file__, "--generate", "--src", str(src), "--dtype", dtype]
    cmd += ["--extra-config", extra_config] if extra_config else []
    cmd += (
        ["--load", load]
        + (["--uri", uri] if uri else [])
        + (["--keyfile", keyfile] if keyfile else [])
    )
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    out = {"rc": proc.returncode, "seconds": round(time.perf_counter() - t0, 1)}
    for line in proc.stdout.splitlines():
        if line.startswith("TOKENS "):
            out["tokens"] = json.loads(line[7:])
    if proc.returncode != 0:
        out["tail"] = (proc.stdout + proc.stderr).strip().splitlines()[-6:]
    return out


def compare_tensors(src: Path, path: Path, key: bytes | None) -> dict[str, object]:
    import torch
    from safetensors.torch import load_file

    from tensor_registry_server.artifacts.making.tensorfile import VLLM_MARKER, load_state_dict

    source = {}
    for f in sorted(src.glob("*.safetensors")):
        source.update(load_file(f))
    written = load_state_dict(path, encryption_key=key)
    checked, missing, differ = 0, [], []
    for name, tensor in written.items():
        if name == VLLM_MARKER:
            continue
        if ".qkv_proj." in name:
            parts = [name.replace("qkv_proj", p) for p in ("q_proj", "k_proj", "v_proj")]
        elif ".gate_up_proj." in name:
            parts = [name.replace("gate_up_proj", p) for p in ("gate_proj", "up_proj")]
        else:
            parts = [name]
        if not all(p in source for p in parts):
            missing.append(name)
            continue
        expected = torch.cat([source[p] for p in parts]) if len(parts) > 1 else source[parts[0]]
        checked += 1
        if not torch.equal(expected, tensor):
            differ.append(name)
    return {"compared": checked, "not_in_source": missing, "differ": differ}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workdir", default="/tmp/vllm-check")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--src")
    parser.add_argument("--load")
    parser.add_argument("--uri")
    parser.add_argument("--keyfile")
    parser.add_argument("--extra-config", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        return generate(args)

    import vllm
    from tensor_registry_server.artifacts.making.serialize import new_encryption_key, serialize_vllm
    from tensor_registry_server.artifacts.making.verify import check_file
    from tensor_registry_server.jobs.runner import JobFailure

    work = Path(args.workdir)
    src, plain_dir, enc_dir = work / "src", work / "plain", work / "enc"
    summary: dict[str, object] = {"vllm_version": vllm.__version__}
    summary["source"] = build_source(src, args.dtype)
    ok = True

    t0 = time.perf_counter()
    [plain] = serialize_vllm(src, plain_dir, dtype=args.dtype)
    summary["serialize_seconds"] = round(time.perf_counter() - t0, 1)
    key = new_encryption_key()
    t0 = time.perf_counter()
    [enc] = serialize_vllm(src, enc_dir, dtype=args.dtype, encryption_key=key)
    summary["serialize_encrypted_seconds"] = round(time.perf_counter() - t0, 1)
    summary["file_bytes"] = plain.stat().st_size

    checks: dict[str, object] = {}
    for label, path, k in (("plain", plain, None), ("encrypted", enc, key)):
        checks[label] = check_file(
            path, name=path.name, fmt="vllm", dtype=args.dtype, key=k, checkpoint=None
        )
    try:
        check_file(enc, name=enc.name, fmt="vllm", dtype=args.dtype, key=None, checkpoint=None)
        checks["encrypted_without_key"] = "accepted"
        ok = False
    except JobFailure as exc:
        checks["encrypted_without_key"] = f"refused: {exc.code}"
    try:
        check_file(plain, name=plain.name, fmt="hf", dtype=args.dtype, key=None, checkpoint=None)
        checks["plain_as_hf"] = "accepted"
        ok = False
    except JobFailure as exc:
        checks["plain_as_hf"] = f"refused: {exc.code}"
    summary["verify"] = checks

    summary["tensors_plain"] = compare_tensors(src, plain, None)
    summary["tensors_encrypted"] = compare_tensors(src, enc, key)
    for label in ("tensors_plain", "tensors_encrypted"):
        result = summary[label]
        assert isinstance(result, dict)
        # vLLM adds buffers of its own (rotary cos/sin cache, attention scales): not in the source.
        internal = all(n.endswith(VLLM_BUFFERS) for n in result["not_in_source"])
        ok &= not result["differ"] and internal and result["compared"] > 0

    keyfile = work / "key"
    keyfile.write_bytes(key)
    os.chmod(keyfile, 0o600)
    runs = {
        "safetensors": run_generate(src, args.dtype, "safetensors", None, None),
        "tensorizer": run_generate(src, args.dtype, "tensorizer", str(plain), None),
        "tensorizer_encrypted": run_generate(src, args.dtype, "tensorizer", str(enc), str(keyfile)),
        "tensorizer_encrypted_no_key": run_generate(src, args.dtype, "tensorizer", str(enc), None),
    }
    summary["generate"] = runs
    reference = runs["safetensors"].get("tokens")
    ok &= reference is not None
    ok &= runs["tensorizer"].get("tokens") == reference
    ok &= runs["tensorizer_encrypted"].get("tokens") == reference
    ok &= runs["tensorizer_encrypted_no_key"]["rc"] != 0
    summary["ok"] = bool(ok)
    print(json.dumps(summary, indent=1), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
