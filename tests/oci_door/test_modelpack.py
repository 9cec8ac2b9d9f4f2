"""The pure parts of the OCI door: ModelPack layer types and documents, token-flow bearers."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

from tensor_registry.formats.variant import Variant
from tensor_registry_server.oci_door import bearer, modelpack
from tensor_registry_server.oci_door.modelpack import File, Subject

SECRET = b"k" * 32


def test_layer_media_types_follow_the_file_kind() -> None:
    cases = {
        "model.safetensors": modelpack.WEIGHT,
        "model-rank-001.tensors": modelpack.WEIGHT,
        "pytorch_model.bin": modelpack.WEIGHT,
        "config.json": modelpack.WEIGHT_CONFIG,
        "tokenizer.json": modelpack.WEIGHT_CONFIG,
        "merges.txt": modelpack.WEIGHT_CONFIG,
        "tensors.layout.json": modelpack.WEIGHT_CONFIG,
        ".vllm_tensorized_marker": modelpack.WEIGHT_CONFIG,
        "README.md": modelpack.DOC,
        "LICENSE": modelpack.DOC,
        "modeling_llama.py": modelpack.CODE,
    }
    assert {path: modelpack.layer_media_type(path) for path in cases} == cases


def test_param_size_is_modelpacks_count_and_scale() -> None:
    assert modelpack.param_size(6_700_000_000) == "6.7b"
    assert modelpack.param_size(8_000_000_000) == "8b"
    assert modelpack.param_size(125_000_000) == "125m"
    assert modelpack.param_size(None) is None


def _subject(variant: Variant | None = None, files: tuple[File, ...] | None = None) -> Subject:
    data = b"weights"
    return Subject(
        kind="version" if variant is None else "artifact",
        id=str(uuid.UUID(int=1)),
        model="acme/llama",
        version=3,
        created_at=datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
        storage="local",
        files=files
        or (File("model.safetensors", len(data), hashlib.sha256(data).hexdigest(), "k"),),
        variant=variant,
    )


def test_documents_are_stable_and_name_the_variant() -> None:
    plain = modelpack.manifest(_subject())
    assert plain.body == modelpack.manifest(_subject()).body
    assert plain.digest == "sha256:" + hashlib.sha256(plain.body).hexdigest()
    variant = Variant("bfloat16", "vllm", 2, True)
    config = modelpack.config(_subject(variant))
    assert b'"version":"3.bfloat16.vllm.tp2.enc"' in config.body
    assert b'"precision":"bf16"' in config.body
    assert modelpack.manifest(_subject(variant)).digest != plain.digest


def test_bearers_expire_and_cannot_be_altered() -> None:
    token_id = uuid.uuid4()
    minted = bearer.mint(SECRET, token_id, 300, now=1_000_000)
    assert bearer.token_id_of(SECRET, minted.token, now=1_000_299) == token_id
    assert bearer.token_id_of(SECRET, minted.token, now=1_000_301) is None
    assert bearer.token_id_of(b"x" * 32, minted.token, now=1_000_000) is None
    other = uuid.uuid4().hex
    swapped = minted.token.replace(token_id.hex, other)
    assert bearer.token_id_of(SECRET, swapped, now=1_000_000) is None
    _, _, exp, sig = minted.token.split(".")
    longer = f"tro1.{token_id.hex}.{int(exp) + 3600}.{sig}"
    assert bearer.token_id_of(SECRET, longer, now=1_000_000) is None
    assert bearer.token_id_of(SECRET, "trg_an-api-token", now=1_000_000) is None
