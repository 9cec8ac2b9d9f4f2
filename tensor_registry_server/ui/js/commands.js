// The shell commands the UI offers to copy, built without the DOM or `location` so that the
// test suite runs this very module under node and executes what it returns
// (tests/client/test_copy_commands.py). Flags are the CLI's, which follow vLLM's vocabulary:
// what this prints, `tensor-registry` and `vllm serve` accept.

import { query } from "./api.js";
import { shellQuote } from "./dom.js";

export function destDir(model, a) {
  const base = model.name.split("/")[1];
  return `./${base}-v${a.version}-${a.dtype}-${a.format}${a.tensor_parallel_size > 1 ? `-tp${a.tensor_parallel_size}` : ""}`;
}

export function resolveParams(model, a) {
  return {
    model: model.name,
    ref: a.version,
    dtype: a.dtype,
    format: a.format,
    tensor_parallel_size: a.tensor_parallel_size,
    encrypted: Boolean(a.encryption?.enabled),
  };
}

export function resolveCommand(origin, model, a) {
  const url = `${origin}/api/v1/resolve${query(resolveParams(model, a))}`;
  return `curl -fsS -H "Authorization: Bearer $TENSOR_REGISTRY_TOKEN" ${shellQuote(url)}`;
}

export function pullCommand(origin, model, a) {
  const words = [
    "tensor-registry",
    "pull",
    `${model.name}:${a.version}`,
    "--url",
    origin,
    "--dtype",
    a.dtype,
    "--format",
    a.format,
    "--tensor-parallel-size",
    String(a.tensor_parallel_size),
    a.encryption?.enabled ? "--encrypted" : "--no-encrypted",
    "--dest",
    destDir(model, a),
  ];
  return words.map(shellQuote).join(" ");
}

// Where `pull` writes an encrypted artifact's key: DEST's node state directory
// (tensor_registry/formats/model_signature.py KEYFILE_PATH; tests/client/test_copy_commands.py
// checks the two agree).
export const KEYFILE_PATH = ".cache/tensor-registry/tensorizer.key";

// `resolved` is the resolve answer for resolveParams(...) plus keyfile=vllmKeyfile(...).
export function vllmKeyfile(model, a) {
  return `${destDir(model, a)}/${KEYFILE_PATH}`;
}

export function vllmCommand(model, a, resolved) {
  const args = [...(resolved.vllm?.args ?? [])];
  if (!args.includes("--dtype")) args.push("--dtype", a.dtype);
  return ["vllm", "serve", destDir(model, a), ...args].map(shellQuote).join(" ");
}
