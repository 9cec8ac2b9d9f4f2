"""ModelPack manifests and configs for a source version or a tensorized artifact (pure data).

The CNCF ModelPack spec (github.com/modelpack/model-spec, specs-go/v1) packs a model as an OCI
image manifest whose ``artifactType`` is the model manifest type, whose config is a model config
document and whose layers are the files, one layer per file (the ``.raw`` media types:
unarchived, so a layer's digest is the file's sha256 the registry recorded when the bytes
arrived). Each layer carries its path as ``org.opencontainers.image.title`` (what oras writes
files by) and as ModelPack's ``org.cncf.model.filepath``.

Everything here is a pure function of rows that never change once ready (a ready version's files,
a ready artifact's files and fields), encoded with sorted keys and no whitespace: the config's and
the manifest's digests are stable, and every tag naming the same thing (``3``, ``prod``,
``latest``) answers with the same bytes and digest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tensor_registry.formats.variant import DTYPE_PRECISION, Variant

MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
ARTIFACT_TYPE = "application/vnd.cncf.model.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.cncf.model.config.v1+json"
WEIGHT = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG = "application/vnd.cncf.model.weight.config.v1.raw"
DOC = "application/vnd.cncf.model.doc.v1.raw"
CODE = "application/vnd.cncf.model.code.v1.raw"
TITLE = "org.opencontainers.image.title"
FILEPATH = "org.cncf.model.filepath"

_WEIGHT_SUFFIXES = (".safetensors", ".tensors", ".bin", ".pt", ".pth", ".gguf", ".onnx", ".h5")
_CODE_SUFFIXES = (".py", ".sh", ".ipynb")
_DOC_NAMES = ("readme", "license", "licence", "notice", "use_policy", "citation")
_DOC_SUFFIXES = (".md", ".pdf", ".rst")
_PRECISION = DTYPE_PRECISION

_encode = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode


@dataclass(frozen=True)
class File:
    path: str
    size: int
    sha256: str
    storage_key: str

    @property
    def digest(self) -> str:
        return f"sha256:{self.sha256}"


@dataclass(frozen=True)
class Subject:
    """What one tag names: a ready source version, or one ready artifact (a variant) of it."""

    kind: str  # "version" | "artifact"
    id: str
    model: str
    version: int
    created_at: datetime
    storage: str
    files: tuple[File, ...]
    variant: Variant | None = None
    architecture: str | None = None
    parameter_count: int | None = None
    tensorizer_version: str | None = None


@dataclass(frozen=True)
class Document:
    """Generated JSON: its bytes, digest and media type."""

    body: bytes
    media_type: str

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.body).hexdigest()


def layer_media_type(path: str) -> str:
    """The ModelPack layer type of a file, by its name: weights, code, docs, else weight config
    (config.json, tokenizer files, the layout manifest, signatures, the vLLM marker)."""
    name = path.rsplit("/", 1)[-1].lower()
    if name.endswith(_WEIGHT_SUFFIXES):
        return WEIGHT
    if name.endswith(_CODE_SUFFIXES):
        return CODE
    if name.startswith(_DOC_NAMES) or name.endswith(_DOC_SUFFIXES):
        return DOC
    return WEIGHT_CONFIG


def param_size(count: int | None) -> str | None:
    """ModelPack's ``paramSize``: a count with at most one decimal and a scale letter."""
    if not count or count <= 0:
        return None
    for scale, letter in ((10**15, "q"), (10**12, "t"), (10**9, "b"), (10**6, "m"), (10**3, "k")):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + letter
    return str(count)


def _rfc3339(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def config(subject: Subject) -> Document:
    """The model config blob (``application/vnd.cncf.model.config.v1+json``)."""
    variant = subject.variant
    model_config: dict[str, Any] = {
        "format": "tensorizer" if variant is not None else "safetensors",
    }
    if subject.architecture:
        model_config["architecture"] = subject.architecture
    if size := param_size(subject.parameter_count):
        model_config["paramSize"] = size
    if variant is not None:
        model_config["precision"] = _PRECISION[variant.dtype]
    descriptor: dict[str, Any] = {
        "name": subject.model,
        "version": str(subject.version)
        if variant is None
        else f"{subject.version}.{variant.suffix}",
        "createdAt": _rfc3339(subject.created_at),
        "vendor": "tensor-registry",
    }
    if subject.tensorizer_version:
        descriptor["revision"] = f"tensorizer {subject.tensorizer_version}"
    body = {
        "descriptor": descriptor,
        "config": model_config,
        "modelfs": {"type": "layers", "diffIds": [f.digest for f in subject.files]},
    }
    return Document(_encode(body).encode(), CONFIG_MEDIA_TYPE)


def manifest(subject: Subject, config_doc: Document | None = None) -> Document:
    """The OCI image manifest with the ModelPack artifact type, one raw layer per file."""
    config_doc = config_doc or config(subject)
    annotations = {
        "org.opencontainers.image.created": _rfc3339(subject.created_at),
        "org.opencontainers.image.version": str(subject.version),
        "org.opencontainers.image.title": subject.model,
    }
    if subject.variant is not None:
        annotations["io.tensor-registry.variant"] = subject.variant.suffix
    body = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": config_doc.digest,
            "size": len(config_doc.body),
        },
        "layers": [
            {
                "mediaType": layer_media_type(f.path),
                "digest": f.digest,
                "size": f.size,
                "annotations": {TITLE: f.path, FILEPATH: f.path},
            }
            for f in subject.files
        ],
        "annotations": annotations,
    }
    return Document(_encode(body).encode(), MANIFEST_MEDIA_TYPE)
