"""A Hugging Face source model, checked without torch: config, safetensors headers, shard index,
companion files. The worker checks a source with it before loading
(tensor_registry_server.artifacts.making.modeling); it needs
only the standard library (transformers, lazily, for ``check_architecture``). Safetensors headers
are parsed by tensor_registry_server.checkpoints.safetensors and config.json by ``parse_config``:
finalize uses
both too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensor_registry_server.checkpoints import safetensors
from tensor_registry_server.checkpoints.safetensors import SafetensorsHeader
from tensor_registry_server.core import bounded_json

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# safetensors refuses headers above 100 MB; a bigger length field means a corrupt file.
MAX_SAFETENSORS_HEADER = 100_000_000

# What vLLM (and transformers' tokenizer/generation loaders) read from beside the weights.
COMPANION_NAMES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "merges.txt",
        "tokenizer.model",
        "spiece.model",
        "sentencepiece.bpe.model",
        "preprocessor_config.json",
        "processor_config.json",
        "chat_template.json",
        "chat_template.jinja",
    }
)
COMPANION_PATTERNS = ("vocab.*", "chat_template*.jinja", "*.tiktoken")

_ARCHITECTURE_NAME = re.compile(r"^[A-Z][A-Za-z0-9_]*$")


class ModelSourceError(Exception):
    """A source model cannot be used. `code` is stable; `path` names the offending file.

    Codes: ``missing_config``, ``invalid_config``, ``unknown_architecture``, ``missing_weights``,
    ``corrupt_weights``, ``invalid_index``, ``weights_mismatch`` (the checkpoint does not fit the
    architecture), ``unsupported_quantization``, ``load_failed`` (transformers refused the model
    for another reason).
    """

    def __init__(self, code: str, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" + (f" ({self.path})" if self.path else "")


@dataclass(frozen=True)
class SourceInfo:
    architecture: str | None
    model_type: str | None
    parameter_count: int
    tensor_count: int
    weight_bytes: int
    dtypes: list[str]
    weight_files: list[str]
    index_file: str | None = None
    config: dict[str, Any] = field(default_factory=dict, repr=False)


def parse_config(raw: bytes) -> dict[str, Any]:
    """config.json's rules, the one copy (finalize reports them per file through
    ``tensor_registry_server.checkpoints.finalize.check_config``; the worker raises them from
    ``read_config``).

    A JSON object (nesting bounded) naming what to build: ``architectures``, a non-empty list
    of class names, or ``model_type``, a non-empty string. Either may be absent (or
    ``architectures`` empty) when the other says it; a present one of the wrong type is refused.
    """
    try:
        config = bounded_json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise _invalid_config(f"config.json is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise _invalid_config("config.json must hold a JSON object")
    architectures = config.get("architectures")
    model_type = config.get("model_type")
    has_architecture = (
        isinstance(architectures, list)
        and len(architectures) > 0
        and all(isinstance(a, str) and a for a in architectures)
    )
    if architectures not in (None, []) and not has_architecture:
        raise _invalid_config("config.json `architectures` must be a list of class names")
    if model_type is not None and not isinstance(model_type, str):
        raise _invalid_config("config.json `model_type` must be a string")
    if not has_architecture and not model_type:
        raise _invalid_config("config.json names neither `architectures` nor `model_type`")
    return config


def _invalid_config(message: str) -> ModelSourceError:
    return ModelSourceError("invalid_config", message, path=CONFIG_NAME)


def read_config(src_dir: Path) -> dict[str, Any]:
    """config.json of a model directory, checked by ``parse_config``."""
    path = Path(src_dir) / CONFIG_NAME
    if not path.is_file():
        raise ModelSourceError("missing_config", "config.json is missing", path=CONFIG_NAME)
    return parse_config(path.read_bytes())


def read_safetensors_header(path: Path, *, display_path: str | None = None) -> SafetensorsHeader:
    """Read and check only the header of a .safetensors file
    (tensor_registry_server.checkpoints.safetensors)."""
    shown = display_path or path.name
    try:
        with path.open("rb") as f:
            file_size = f.seek(0, 2)
            f.seek(0)
            length = safetensors.header_length(
                f.read(8), file_size=file_size, max_bytes=MAX_SAFETENSORS_HEADER
            )
            raw = f.read(length)
        return safetensors.parse_header(raw, file_size=file_size)
    except OSError as exc:
        raise ModelSourceError(
            "missing_weights", f"{shown}: cannot read: {exc.strerror}", path=shown
        ) from None
    except safetensors.HeaderError as exc:
        raise ModelSourceError("corrupt_weights", f"{shown}: {exc}", path=shown) from None


def _weight_files(src_dir: Path) -> tuple[list[str], str | None, dict[str, str] | None]:
    """The safetensors files transformers will load, the index name and its weight map."""
    # Same precedence as transformers: a single model.safetensors wins over an index.
    if (src_dir / SAFE_WEIGHTS_NAME).is_file():
        return [SAFE_WEIGHTS_NAME], None, None
    index_path = src_dir / SAFE_WEIGHTS_INDEX_NAME
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_bytes())
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise ModelSourceError(
                "invalid_index", "index is not valid JSON", path=SAFE_WEIGHTS_INDEX_NAME
            ) from None
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not (
            isinstance(weight_map, dict)
            and weight_map
            and all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items())
        ):
            raise ModelSourceError(
                "invalid_index",
                "index needs a non-empty `weight_map` of tensor name -> file name",
                path=SAFE_WEIGHTS_INDEX_NAME,
            )
        files = sorted(set(weight_map.values()))
        for name in files:
            # Shards live flat beside the index; anything else could escape the version's files.
            if (
                "/" in name
                or "\\" in name
                or name in {".", ".."}
                or not name.endswith(".safetensors")
            ):
                raise ModelSourceError(
                    "invalid_index",
                    f"index refers to {name!r}, not a .safetensors file beside it",
                    path=SAFE_WEIGHTS_INDEX_NAME,
                )
            if not (src_dir / name).is_file():
                raise ModelSourceError(
                    "missing_weights", f"{name} is listed in the index but missing", path=name
                )
        return files, SAFE_WEIGHTS_INDEX_NAME, weight_map
    others = sorted(p.name for p in src_dir.glob("*.safetensors"))
    if others:
        hint = f"found {', '.join(others[:3])} but expected {SAFE_WEIGHTS_NAME}"
        hint += f" or {SAFE_WEIGHTS_INDEX_NAME}"
    elif any(src_dir.glob("*.bin")) or any(src_dir.glob("*.pt")):
        hint = "only PyTorch pickle weights found; upload .safetensors weights"
    else:
        hint = "no .safetensors weights found"
    raise ModelSourceError("missing_weights", hint)


def validate_source(src_dir: Path, *, check_architecture: bool = False) -> SourceInfo:
    """Cheap structural checks of a Hugging Face model directory; reads no tensor data.

    With ``check_architecture=True`` (needs transformers) the class named in config.json must
    also exist in transformers, as `load_model` will require.
    """
    src_dir = Path(src_dir)
    config = read_config(src_dir)
    if check_architecture:
        resolve_model_class(config)
    files, index_file, weight_map = _weight_files(src_dir)
    headers = {name: read_safetensors_header(src_dir / name, display_path=name) for name in files}

    seen: dict[str, str] = {}
    for file_name, header in headers.items():
        for name in header.tensors:
            if name in seen:
                raise ModelSourceError(
                    "corrupt_weights",
                    f"tensor {name!r} appears in both {seen[name]} and {file_name}",
                    path=file_name,
                )
            seen[name] = file_name
    if weight_map is not None:
        for name, file_name in weight_map.items():
            if seen.get(name) != file_name:
                raise ModelSourceError(
                    "invalid_index",
                    f"index maps {name!r} to {file_name} but "
                    + (f"it is in {seen[name]}" if name in seen else "no shard holds it"),
                    path=file_name,
                )
        unindexed = sorted(set(seen) - set(weight_map))
        if unindexed:
            raise ModelSourceError(
                "invalid_index",
                f"{len(unindexed)} tensors are missing from the index, e.g. {unindexed[0]!r}",
                path=seen[unindexed[0]],
            )

    architectures = config.get("architectures")
    model_type = config.get("model_type")
    return SourceInfo(
        architecture=architectures[0] if architectures else None,
        model_type=model_type if isinstance(model_type, str) else None,
        parameter_count=sum(h.parameter_count for h in headers.values()),
        tensor_count=sum(len(h.tensors) for h in headers.values()),
        weight_bytes=sum(h.data_bytes for h in headers.values()),
        dtypes=sorted(
            {
                safetensors.DTYPE_NAMES[dtype]
                for h in headers.values()
                for dtype, _ in h.tensors.values()
            }
        ),
        weight_files=files,
        index_file=index_file,
        config=config,
    )


def resolve_model_class(config: dict[str, Any]) -> type:
    """The transformers class for config.json: `architectures[0]`, else AutoModel by model_type.

    Remote code is never trusted: a class transformers does not ship is `unknown_architecture`.
    """
    import transformers

    architectures = config.get("architectures")
    if not architectures:
        model_type = config.get("model_type")
        if model_type not in transformers.CONFIG_MAPPING:
            raise ModelSourceError(
                "unknown_architecture",
                f"model_type {model_type!r} is not known to transformers"
                f" {transformers.__version__}",
                path=CONFIG_NAME,
            )
        return transformers.AutoModel
    name = architectures[0]
    model_class = None
    if _ARCHITECTURE_NAME.match(name):
        try:
            model_class = getattr(transformers, name, None)
        except (ImportError, RuntimeError) as exc:
            raise ModelSourceError(
                "unknown_architecture",
                f"{name} needs a dependency this worker lacks: {exc}",
                path=CONFIG_NAME,
            ) from None
    if not (
        isinstance(model_class, type)
        and issubclass(model_class, transformers.PreTrainedModel)
        # The abstract bases (PreTrainedModel itself, LlamaPreTrainedModel, ...) are classes of
        # transformers too, but building one fails deep inside from_pretrained.
        and not name.endswith("PreTrainedModel")
        and getattr(model_class, "config_class", None) is not None
    ):
        raise ModelSourceError(
            "unknown_architecture",
            f"architecture {name!r} is not a model class of transformers"
            f" {transformers.__version__} (remote code is not run)",
            path=CONFIG_NAME,
        )
    return model_class


def is_model_file(path: str) -> bool:
    """A file the model and its tokenizer are built from (top level only, as transformers):
    the safetensors weights, their index, and the companion files."""
    if "/" in path:
        return False
    if path.endswith(".safetensors") or path == SAFE_WEIGHTS_INDEX_NAME:
        return True
    if path in COMPANION_NAMES:
        return True
    return any(Path(path).match(pattern) for pattern in COMPANION_PATTERNS)


def companion_files(src_dir: Path) -> list[Path]:
    """Config, generation config and tokenizer files to publish flat beside `model.tensors`."""
    src_dir = Path(src_dir)
    found = {p for p in src_dir.iterdir() if p.is_file() and p.name in COMPANION_NAMES}
    for pattern in COMPANION_PATTERNS:
        found.update(p for p in src_dir.glob(pattern) if p.is_file())
    return sorted(found, key=lambda p: p.name)
