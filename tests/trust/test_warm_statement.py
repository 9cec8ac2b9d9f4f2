"""A warm bundle's signed statement, as the node checks it before restoring anything: the
registry's key, this artifact and this bundle, the listed key equal to the signed one; unsigned
is refused unless the node opted out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tensor_registry.formats.signed_manifest import ManifestFile
from tensor_registry.formats.warm import BUNDLE_FILE, WarmKey
from tensor_registry.formats.warm_bundle import WarmBundleError
from tensor_registry.warm.node import check_statement, restore_for
from tensor_registry_server.settings import Settings
from tensor_registry_server.trust.signing_keys import manifest_keys
from tensor_registry_server.trust.statements import signed_warm_bundle

KEY = WarmKey("0.24.0", "2.11.0", "9.0", 1, "bfloat16", "/models/a", ("--max-model-len=512",))


def _entry(settings: Settings, **bundle: Any) -> dict[str, Any]:
    statement = signed_warm_bundle(
        manifest_keys(settings),
        registry="http://127.0.0.1",
        bundle={
            "id": "b1",
            "artifact_id": "a1",
            "model_id": "m",
            "model": "acme/x",
            "version": 1,
            **bundle,
        },
        key=KEY.as_dict(),
        cache={"dirs": ["torch_compile_cache/0123456789"], "factors": {}},
        tar=ManifestFile(BUNDLE_FILE, 10, "a" * 64),
        signed_at="2026-12-07T00:00:00Z",
    )
    return {
        "id": "b1",
        "key": KEY.as_dict(),
        "statement": statement.decode(),
        "url": "x",
        "size": 10,
        "sha256": "a" * 64,
    }


def test_the_registrys_signature_over_this_bundle_is_accepted(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    predicate = check_statement(
        _entry(settings), manifest_keys(settings).trusted(), artifact_id="a1"
    )
    assert predicate["key"] == KEY.as_dict()


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ("stranger", "untrusted_signing_key"),
        ("other_artifact", "statement_mismatch"),
        ("tampered", "signature_invalid"),
        ("unsigned", "unsigned_bundle"),
    ],
)
def test_a_bundle_the_node_cannot_trust_is_refused(tmp_path: Path, change: str, code: str) -> None:
    settings = Settings(data_dir=tmp_path / "registry")
    keys = manifest_keys(settings).trusted()
    entry = _entry(settings)
    artifact = "a1"
    if change == "stranger":
        keys = manifest_keys(Settings(data_dir=tmp_path / "stranger")).trusted()
    elif change == "other_artifact":
        artifact = "a2"
    elif change == "tampered":
        import base64
        import json

        envelope = json.loads(entry["statement"])
        payload = json.loads(base64.b64decode(envelope["payload"]))
        payload["predicate"]["key"]["model"] = "/elsewhere"
        envelope["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
        entry["statement"] = json.dumps(envelope)
    else:
        entry["statement"] = ""
    with pytest.raises(WarmBundleError) as caught:
        check_statement(entry, keys, artifact_id=artifact)
    assert caught.value.code == code


def test_without_trusted_keys_nothing_is_restored_unless_the_node_opts_out(tmp_path: Path) -> None:
    entry = _entry(Settings(data_dir=tmp_path / "registry"))
    answer = {"artifact": {"id": "a1"}, "warm_bundles": [entry]}
    with pytest.raises(WarmBundleError) as caught:
        restore_for(answer, KEY, tmp_path / "cache", keys={})
    assert caught.value.code == "untrusted_signing_key"
    assert not list((tmp_path / "cache").glob("torch_compile_cache*"))
