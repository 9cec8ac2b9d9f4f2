from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tensor_registry.formats.model_signature import KEYFILE_PATH
from tensor_registry_server.core.schemas import Dtype, Format, Schema


class RemoteCodeOut(Schema):
    auto_map: dict[str, str]
    files: list[str]


# Where `pull` writes the key (relative to its DEST) and what the vllm block names when the
# caller gives no path.
DEFAULT_KEYFILE = KEYFILE_PATH


class ResolveQuery(BaseModel):
    """Query parameters of GET /api/v1/resolve (unknown parameters are refused: a typo such as
    ``dtpye=`` would otherwise silently widen the choice)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="Model name, `namespace/name`.", max_length=128)
    ref: str = Field(
        default="latest",
        max_length=64,
        description="An alias, a version number, or `latest` (the highest ready version).",
    )
    dtype: Dtype | None = None
    format: Format | None = None
    tensor_parallel_size: int | None = Field(default=None, ge=1, le=1024)
    encrypted: bool | None = Field(
        default=None, description="Only encrypted (true) or only plain (false) artifacts."
    )
    artifact_id: uuid.UUID | None = Field(
        default=None,
        description="Only this artifact (with ref its version number): how a node that "
        "re-resolves mid-download pins the artifact it started with.",
    )
    ttl: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,  # bounded in the schema; the settings' maximum is checked after
        description="Lifetime of the signed URLs in seconds (default and maximum from settings).",
    )
    num_readers: int | None = Field(
        default=None, ge=1, le=64, description="Reader count to advise (overrides the default)."
    )
    cpu_count: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="CPU count of the loading node; the advice uses half of them (1..16).",
    )
    gpu: bool | None = Field(
        default=None,
        description="Whether the loading node loads onto a GPU (shapes the `engine` advice).",
    )
    verify_hash: bool = Field(
        default=True,
        description="Advise per-tensor hash verification (on by default: it is the only check "
        "that catches a proxy answering a Range request with the whole file).",
    )
    keyfile: str = Field(
        default=DEFAULT_KEYFILE,
        max_length=1024,
        description="Local path of the key file on the node (written by `tensor-registry pull`,"
        " by default `DEST/.cache/tensor-registry/tensorizer.key`; this default is relative to"
        " DEST); the vllm block points `encryption_keyfile` at it.",
    )
    embed_key_url: bool = Field(
        default=False,
        description="Put the signed key URL itself into the vllm block's `encryption_keyfile` "
        "(vLLM fetches it over https). vLLM logs its config, so the URL — a credential until "
        "`expires_at` — lands in its logs. Needs `keys:read`.",
    )
    key_url: bool = Field(
        default=True,
        description="false: the node brings its own key file (`tensor-registry pull "
        "--keyfile`), so no key URL is issued (none in the answer, no `key.issue` audit row) "
        "even to a token with `keys:read`; an encrypted artifact still resolves without it.",
    )
    node: str | None = Field(
        default=None, max_length=128, description="Free-form node name, kept in the audit row."
    )


class EncryptionOut(Schema):
    enabled: bool
    key_id: str | None
    algorithm: str | None


class ResolvedArtifact(Schema):
    id: uuid.UUID
    model_id: uuid.UUID
    version: int
    dtype: str
    format: str
    tensor_parallel_size: int
    encryption: EncryptionOut
    storage: str
    tensorizer_version: str | None


class ResolvedFile(Schema):
    path: str
    size: int
    sha256: str
    url: str
    kind: Literal["weights", "config", "layout", "manifest", "signature"] = Field(
        description="`weights`: tensorizer files; `layout`: the layout manifest "
        "(`tensors.layout.json`: tensor offsets and chunk digests for the load engine); "
        "`manifest`: the signed artifact manifest (`manifest.sig.json`, docs/trust.md); "
        "`signature`: `model.sig`, the OpenSSF Model Signing signature over every other file; "
        "`config`: config, tokenizer and other files."
    )


class DeserializerAdvice(Schema):
    num_readers: int
    verify_hash: bool


class EngineAdvice(Schema):
    loader: Literal["engine", "tensorizer"] = Field(
        description="`engine`: the client's load engine (a layout manifest exists and the "
        "artifact is not encrypted); `tensorizer`: tensorizer's reader."
    )
    layout_path: str | None = Field(description="Path of the layout manifest in `files`.")
    connections: int = Field(description="Parallel range connections / pread threads.")
    block_bytes: int = Field(
        description="Bytes per receive from a signed URL (a local node-cache file is read in "
        "the engine's own blocks)."
    )
    register_fraction: float = Field(
        description="GPU nodes: share of a node-cache file pinned in place (cudaHostRegister) "
        "while the rest is read into pinned buffers; 0 on CPU nodes."
    )
    verify: bool = Field(description="Check every chunk's BLAKE3 digest while loading.")


class VllmKeyFile(Schema):
    path: str = Field(description="Where `encryption_keyfile` points.")
    source: Literal["file", "url"] = Field(
        description="`file`: write the bytes of `encryption_key_url` there (mode 0600) before "
        "starting vLLM, as `tensor-registry pull` does; `url`: the signed key URL is embedded."
    )


class VllmBlock(Schema):
    model_loader_extra_config: dict[str, Any]
    args: list[str]
    keyfile: VllmKeyFile | None = Field(
        default=None, description="Set for encrypted artifacts: how the key reaches vLLM."
    )


class WarmBundleRef(Schema):
    id: str
    url: str = Field(description="Signed URL of the bundle's tar (valid until `expires_at`).")
    size: int
    sha256: str
    key: dict[str, Any] = Field(
        description="The parts of vLLM's cache key a node checks before start: vllm_version, "
        "torch_version, gpu (compute capability), tensor_parallel_size, dtype, model, "
        "serve_args (normalized)."
    )
    cache: dict[str, Any] = Field(
        description="What vLLM computed: `dirs` (hash directories under VLLM_CACHE_ROOT) and "
        "`factors` (its cache_key_factors.json per directory)."
    )
    statement: str = Field(
        description="DSSE envelope (predicate `https://tensor-registry.dev/warm-bundle/v1`) "
        "signed by the manifest key over the tar's sha256, the bundle, its artifact and key."
    )
    created_at: str | None


class ResolveOut(Schema):
    model: str
    ref: str
    version: int
    artifact: ResolvedArtifact
    chosen_by: Literal["request", "alias_default", "model_default", "newest"] = Field(
        description="Which rule chose the variant: the request's filters alone, the alias's "
        "or the model's default variant (filling what the request left out), or none (the "
        "newest, unencrypted first)."
    )
    expires_at: datetime
    files: list[ResolvedFile]
    compatibility_key: str = Field(
        description="Digest over what decides whether weights may be reused (architecture, "
        "config digest, dtype, format, TP size, quantization; vLLM version and GPU "
        "architecture for `vllm`). A node reuses a cached file only when its sha256 and this "
        "key both match (docs/trust.md)."
    )
    manifest_path: str | None = Field(
        description="Path in `files` of the signed manifest (`manifest.sig.json`); null for an "
        "artifact published before manifests (backfill one)."
    )
    tensorizer_uri: str = Field(
        description="tensor_parallel_size 1: the signed URL of model.tensors; N > 1: a signed "
        "`model-rank-%03d.tensors` template (no other `%`) that vLLM fills per rank."
    )
    tensorizer_uris: list[str] = Field(description="One signed URL per rank (rank order).")
    encryption_key_url: str | None = Field(
        description="Signed URL of the raw 32-byte key; only for tokens with `keys:read` on "
        "encrypted artifacts. Valid for repeated fetches until `expires_at`."
    )
    deserializer: DeserializerAdvice
    engine: EngineAdvice
    vllm: VllmBlock
    warm_bundles: list[WarmBundleRef] = Field(
        default_factory=list,
        description="The artifact's ready warm bundles (vLLM compile caches), newest first; "
        "empty when none was made (docs/warm-state.md).",
    )
    remote_code: RemoteCodeOut | None = Field(
        default=None,
        description="The version's executable content: `auto_map` (config.json) and the "
        "`*.py` files it names, which `--trust-remote-code` would run; null when it carries none.",
    )
    binding: str = Field(
        description="What this ref resolved to, signed by the registry's active manifest key "
        "(a DSSE envelope of an in-toto statement, predicate "
        "`https://tensor-registry.dev/ref-binding/v1`): registry_id, model, model_id, ref, "
        "version, artifact {id, dtype, format, tensor_parallel_size, encrypted}, alias "
        "{name, revision, moved_at} for an alias ref, issued_at, expires_at; its subject is "
        "the signed manifest. Nodes refuse an expired binding and an alias older than one "
        "they saw (docs/trust.md)."
    )
