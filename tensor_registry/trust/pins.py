"""Keys pinned per registry identity (``config_dir()/trusted-keys.json``)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tensor_registry.config import config_dir
from tensor_registry.trust.keys_document import public_key
from tensor_registry.trust.state_files import read_state, write_state

PINS_FILE = "trusted-keys.json"


class PinStore:
    """Pinned keys per registry identity, in ``config_dir()/trusted-keys.json`` (mode 0600):
    ``{"registries": {ID: {"keys": {keyid: base64}, "urls": [...], "revoked": [keyid]}}}``.

    ID is the ``registry_id`` the registry publishes with its keys (its stable identity, not
    its URL or port); the URLs it was reached at find it. Entries written before identities
    existed are keyed by URL and still read.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.path = (root or config_dir()) / PINS_FILE

    def _read(self) -> dict[str, Any]:
        return read_state(self.path)

    def find(self, registry: str) -> tuple[str, dict[str, Any]] | None:
        """The entry of a registry id or of a URL it was reached at: (its key, the entry)."""
        entries = self._read()["registries"]
        url = registry.rstrip("/")
        if isinstance(entries.get(url), dict):
            return url, entries[url]
        for ident, entry in entries.items():
            if isinstance(entry, dict) and url in (entry.get("urls") or []):
                return ident, entry
        return None

    def get(self, registry: str) -> dict[str, bytes] | None:
        found = self.find(registry)
        if found is None:
            return None
        return {kid: public_key(b64) for kid, b64 in dict(found[1].get("keys") or {}).items()}

    def forget(self, registry: str) -> None:
        data = self._read()
        if data["registries"].pop(registry.rstrip("/"), None) is not None:
            write_state(self.path, data)

    def holding(self, kid: str) -> dict[str, bytes] | None:
        """The pinned keys of the registry whose pins hold key ``kid`` (offline checks)."""
        for entry in self._read()["registries"].values():
            if isinstance(entry, dict) and kid in (entry.get("keys") or {}):
                return {k: public_key(b64) for k, b64 in dict(entry["keys"]).items()}
        return None

    def put(
        self,
        registry: str,
        keys: Mapping[str, bytes],
        *,
        url: str | None = None,
        revoked: Iterable[str] = (),
        replace: bool = False,
    ) -> None:
        """Pin ``keys`` for ``registry`` (its id), reached at ``url``; ``replace`` (`trust
        --replace`, after an out-of-band check) also forgets the keys it had revoked."""
        data = self._read()
        registries = data["registries"]
        old = registries.get(registry.rstrip("/")) or {}
        if replace:
            old = {"urls": old.get("urls") or []}
        urls = set(old.get("urls") or [])
        if url is not None and url.rstrip("/") != registry.rstrip("/"):
            urls.add(url.rstrip("/"))
            for ident, entry in list(registries.items()):  # one registry per URL
                if ident != registry and isinstance(entry, dict):
                    entry["urls"] = [u for u in entry.get("urls") or [] if u != url.rstrip("/")]
        registries[registry.rstrip("/")] = {
            "keys": {kid: base64.b64encode(raw).decode() for kid, raw in sorted(keys.items())},
            "urls": sorted(urls),
            "revoked": sorted(set(old.get("revoked") or []) | set(revoked)),
            # The model-signing keys the manifest keys endorsed (model.sig), kept beside them.
            **{k: v for k, v in old.items() if k == "model_signing_keys"},
        }
        write_state(self.path, data)

    def get_model_signing(self, registry: str) -> dict[str, bytes]:
        """The registry's pinned model-signing keys (key hint → public key PEM), found by its
        identity or a URL it was reached at, like its manifest keys."""
        found = self.find(registry)
        entry = found[1] if found is not None else {}
        return {
            str(hint): str(pem).encode()
            for hint, pem in dict(entry.get("model_signing_keys") or {}).items()
        }

    def put_model_signing(self, registry: str, keys: Mapping[str, bytes]) -> None:
        data = self._read()
        found = self.find(registry)
        ident = found[0] if found is not None else registry.rstrip("/")
        entry = data["registries"].setdefault(ident, {})
        entry["model_signing_keys"] = {h: pem.decode() for h, pem in sorted(keys.items())}
        write_state(self.path, data)
