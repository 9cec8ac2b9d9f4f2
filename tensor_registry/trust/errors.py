"""The error every check of the node's trust raises: nothing was loaded or kept."""

from __future__ import annotations

from tensor_registry.api.client import RegistryError
from tensor_registry.formats.signed_manifest import ManifestError


class TrustError(RegistryError):
    """A manifest or a file that fails verification; nothing was loaded or kept."""

    code = "untrusted_artifact"

    @classmethod
    def of(cls, exc: ManifestError) -> TrustError:
        return cls(exc.message, code=exc.code)
