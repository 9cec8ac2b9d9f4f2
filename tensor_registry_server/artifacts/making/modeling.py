"""Load a checked Hugging Face source model with torch and transformers, offline.

The checks that need no torch (config, safetensors headers, index, companion files) are in
tensor_registry_server.checkpoints.huggingface; ``DTYPES`` and ``load_model`` import torch and
transformers on
first use, so importing this module stays cheap.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_registry.formats.variant import DTYPES as VOCABULARY_DTYPES
from tensor_registry_server.artifacts.making.page_out import SourcePager
from tensor_registry_server.checkpoints.huggingface import (
    CONFIG_NAME,
    ModelSourceError,
    SourceInfo,
    resolve_model_class,
    validate_source,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def __getattr__(name: str) -> Any:
    # DTYPES needs torch; building it lazily keeps `import
    # tensor_registry_server.artifacts.making.modeling`
    # torch-free.
    if name == "DTYPES":
        import torch

        # The vocabulary's dtype names are torch's own attribute names.
        dtypes = {name: getattr(torch, name) for name in VOCABULARY_DTYPES}
        globals()["DTYPES"] = dtypes
        return dtypes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:
    DTYPES: dict[str, torch.dtype]


def torch_dtype(dtype: str) -> torch.dtype:
    dtypes: dict[str, torch.dtype] = __getattr__("DTYPES")
    try:
        return dtypes[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {sorted(dtypes)}") from None


def load_model(src_dir: Path, *, dtype: str, device: str = "cpu") -> torch.nn.Module:
    """Build the architecture named in config.json and load its safetensors weights.

    Loading goes through transformers' own `from_pretrained` on the local directory, which
    creates the module on the meta device and then materialises each weight from the
    memory-mapped safetensors file straight into the requested dtype and device, so no second
    full copy is held; tied weights, key renames of old checkpoints and non-persistent buffers
    (rotary `inv_freq`, position ids) come out exactly as in any transformers load. Only local
    files are read (`local_files_only`, safetensors only, no remote code), so the hub is never
    contacted. A checkpoint that leaves any weight of the architecture unset is refused rather
    than silently random-initialised.

    When the file dtype equals `dtype` on CPU the parameters stay backed by the private
    (copy-on-write) file mapping, so the source files must not be truncated or rewritten while
    the model is alive.
    """
    import torch

    src_dir = Path(src_dir)
    target_dtype = torch_dtype(dtype)
    target_device = torch.device(device)
    if target_device.type == "cuda" and target_device.index is None:
        raise ValueError("name the GPU explicitly, e.g. device='cuda:0'")
    info = _unquantized_source(src_dir)
    model_class = resolve_model_class(info.config)
    config = _transformers_config(model_class, src_dir)

    # transformers places weights straight on a GPU only through accelerate's device_map;
    # without it the model is loaded on the CPU and moved tensor by tensor.
    direct = target_device.type == "cpu" or importlib.util.find_spec("accelerate") is not None
    placement = {} if target_device.type == "cpu" or not direct else {"device_map": {"": device}}
    # A cast on the CPU reads every source page into fresh memory; page the source mappings
    # out as it goes (`SourcePager`), or the whole checkpoint stays in RSS beside the model.
    casting = target_device.type == "cpu" and any(
        d != dtype and d.startswith(("float", "bfloat")) for d in info.dtypes
    )
    pager = SourcePager([src_dir / f for f in info.weight_files]) if casting else nullcontext()
    try:
        with pager:
            model, loading_info = model_class.from_pretrained(  # type: ignore[attr-defined]
                str(src_dir),
                config=config,
                dtype=target_dtype,
                local_files_only=True,
                use_safetensors=True,
                trust_remote_code=False,
                output_loading_info=True,
                **placement,
            )
    except ModelSourceError:
        raise
    except (torch.cuda.OutOfMemoryError, MemoryError):
        raise
    except Exception as exc:
        raise _classify_load_error(exc, info) from exc

    _check_loading_info(loading_info, model_class.__name__)
    if not direct:
        model.to(target_device)
    model.eval()
    return model


def _unquantized_source(src_dir: Path) -> SourceInfo:
    """The checked source (``validate_source``), refused when quantized: casting a quantized
    checkpoint to a float dtype would silently change what it is."""
    info = validate_source(src_dir)
    if info.config.get("quantization_config"):
        raise ModelSourceError(
            "unsupported_quantization",
            "quantized checkpoints (config.json `quantization_config`) cannot be tensorized"
            " to a float dtype; publish the unquantized weights",
            path=CONFIG_NAME,
        )
    return info


def _transformers_config(model_class: type, src_dir: Path) -> Any:
    """config.json as transformers reads it for ``model_class``: what it refuses fails the
    job as ``invalid_config`` before any weight is read."""
    try:
        return model_class.config_class.from_pretrained(  # type: ignore[attr-defined]
            str(src_dir), local_files_only=True, trust_remote_code=False
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ModelSourceError(
            "invalid_config", f"transformers rejects config.json: {exc}", path=CONFIG_NAME
        ) from None


def _check_loading_info(loading_info: dict[str, Any], class_name: str) -> None:
    """Refuse a checkpoint that leaves a weight unset or of the wrong shape (transformers would
    random-initialise it); tensors the architecture does not use are only logged."""
    problems = {
        key: sorted(str(k) for k in loading_info.get(key) or ())
        for key in ("missing_keys", "mismatched_keys")
    }
    if problems["missing_keys"] or problems["mismatched_keys"]:
        parts = [
            f"{len(names)} {key.replace('_', ' ')} (e.g. {names[0]})"
            for key, names in problems.items()
            if names
        ]
        raise ModelSourceError(
            "weights_mismatch",
            f"checkpoint does not fit {class_name}: " + "; ".join(parts),
        )
    if loading_info.get("unexpected_keys"):
        log.info(
            "ignored %d checkpoint tensors %s does not use",
            len(loading_info["unexpected_keys"]),
            class_name,
        )


def _classify_load_error(exc: Exception, info: SourceInfo) -> ModelSourceError:
    message = f"{type(exc).__name__}: {exc}"
    lowered = message.lower()
    if "size mismatch" in lowered or ("shape" in lowered and "mismatch" in lowered):
        return ModelSourceError("weights_mismatch", message)
    safetensors_error = _safetensors_error_type()
    if safetensors_error is not None and isinstance(exc, safetensors_error):
        return ModelSourceError(
            "corrupt_weights", message, path=info.weight_files[0] if info.weight_files else None
        )
    return ModelSourceError("load_failed", message)


def _safetensors_error_type() -> type[Exception] | None:
    try:
        module = importlib.import_module("safetensors")
    except ImportError:
        return None
    error = getattr(module, "SafetensorError", None)
    return error if isinstance(error, type) else None
