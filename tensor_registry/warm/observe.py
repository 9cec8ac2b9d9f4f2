"""Did vLLM use the restored bundle? Hit or miss, decided from what vLLM did (docs/warm-state.md).

vLLM 0.24 names its compile-cache directory from its own hash and logs it once per process:
``Using cache directory: <VLLM_CACHE_ROOT>/torch_compile_cache/<hash>/rank_<r>_<dp>/<prefix>
for vLLM's torch.compile`` (vllm/compilation/backends.py), creating the directory when it is
new. So after vLLM started:

- **hit**: every cache directory vLLM logged lies in a hash directory the bundle holds (without
  a log: vLLM made no new hash directory and the bundle's are there);
- **miss**: vLLM used (made) another hash directory. The miss names what differed: the key
  parts checked before start (vLLM/torch version, GPU, TP size, dtype, model, serve arguments),
  and vLLM's own factors of the new directory (its ``cache_key_factors.json``: ``config_hash``,
  ``code_hash``, ``compiler_hash``, ``env`` variables) against the bundle's; when nothing of
  that differs the miss says so, never an empty reason;
- **unused**: vLLM logged that its compile cache is disabled, or compiled nothing
  (``--enforce-eager``); counted as a miss with that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensor_registry.formats.warm import factor_differences
from tensor_registry.formats.warm_bundle import DISABLED_RE, hash_dirs, logged_dirs, read_factors


@dataclass
class Outcome:
    result: str  # "hit" | "miss"
    differed: list[str] = field(default_factory=list)
    # The hash directories vLLM used (logged, or made when there is no log).
    used: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"result": self.result, "differed": self.differed, "used": self.used}


def observe(
    cache_root: Path,
    *,
    bundle_dirs: Iterable[str],
    bundle_factors: Mapping[str, Mapping[str, Any]],
    before: Iterable[str],
    key_differences: Iterable[str] = (),
    log_text: str | None = None,
) -> Outcome:
    """Hit or miss after vLLM started with ``cache_root`` as VLLM_CACHE_ROOT. ``before``: the
    hash directories there just after the restore; ``key_differences``: what the check before
    start found (tensor_registry/formats/warm.py ``differences``)."""
    ours = set(bundle_dirs)
    pre = list(key_differences)
    if log_text is not None and DISABLED_RE.search(log_text):
        return Outcome(
            "miss", ["vLLM's torch.compile cache is disabled (VLLM_DISABLE_COMPILE_CACHE)"]
        )
    logged = logged_dirs(cache_root, log_text) if log_text is not None else None
    if logged is not None:
        used = logged
    else:
        used = sorted(hash_dirs(cache_root) - set(before))
        if not used:
            if ours and ours <= hash_dirs(cache_root):
                return Outcome("hit", [], sorted(ours))
            return Outcome(
                "miss", pre or ["vLLM compiled nothing (enforce-eager?) and the bundle is absent"]
            )
    if log_text is not None and not used:
        return Outcome("miss", ["vLLM compiled nothing (--enforce-eager or compilation off)"])
    foreign = [d for d in used if d not in ours]
    if not foreign:
        return Outcome("hit", [], used)
    differed = list(pre)
    reference = next(iter(bundle_factors.values()), None)
    for hash_dir in foreign:
        seen = read_factors(cache_root, hash_dir) if not hash_dir.startswith("(") else None
        if reference is not None and seen is not None:
            differed.extend(f"{hash_dir}: {d}" for d in factor_differences(reference, seen))
    if not differed:
        differed.append(
            f"vLLM used {', '.join(foreign)}, not the bundle's "
            f"{', '.join(sorted(ours)) or '(none)'}, "
            "and neither the key parts nor vLLM's recorded factors explain it"
        )
    return Outcome("miss", differed, used)
