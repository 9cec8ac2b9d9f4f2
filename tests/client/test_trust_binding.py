"""The signature binds what the node asked for (issue 26 §2), against a real `serve` with a man
in the middle on 127.0.0.1 (tests/mitm.py) between it and the CLI:

- another model's (another namespace's) validly signed answer, or an older version's, is refused;
- an alias's signed binding: expired (injected clock, documented skew) and rolled back (an
  older move than one the node saw) are refused, each saying which;
- a pull that outlives its signed URLs (``--ttl 1``, a download held while the alias moves)
  re-resolves pinned to its artifact and never mixes two artifacts; a gone artifact is said;
- the printed vLLM command is derived from signed facts: nothing injected into the answer's
  ``vllm`` block or advice reaches it;
- stripping ``manifest.sig.json`` once keys are pinned is refused (``--allow-unsigned`` opts out);
- ``verify DIR`` finds the pins by the registry's identity, whatever port it served on.
"""

from __future__ import annotations

import base64
import calendar
import json
import shlex
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from harness.artifacts import MadeArtifact, make_artifact
from harness.waiting import poll
from tensor_registry import RegistryClient
from tensor_registry.api.resolution import Resolution
from tensor_registry.formats.model_signature import PULL_RECORD
from tensor_registry.formats.signed_manifest import MANIFEST_FILE
from tensor_registry.trust import CLOCK_SKEW_SECONDS, SeenAliases, TrustError, verify_resolution
from tensor_registry_server.trust.signing_keys import manifest_keys
from tests.client.conftest import Registry
from tests.client.vllm_stub import serve_parser
from tests.mitm import Mitm, mitm


@pytest.fixture(autouse=True)
def client_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "client-config"
    monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(path))
    for name in (
        "TENSOR_REGISTRY_TRUSTED_KEYS",
        "TENSOR_REGISTRY_REQUIRE_SIGNED",
        "TENSOR_REGISTRY_ALLOW_UNSIGNED",
    ):
        monkeypatch.delenv(name, raising=False)
    return path


async def signed(registry: Registry, name: str, version: int, **variant: Any) -> MadeArtifact:
    """A ready artifact of ``name`` version ``version`` with its signed manifest."""
    from tensor_registry_server.artifacts.making.signatures import backfill_manifest
    from tensor_registry_server.core.db import create_engine, make_sessionmaker, session_scope
    from tensor_registry_server.storage.registry import StorageRegistry

    made = await make_artifact(
        registry.settings,
        model=name,
        version=version,
        layout=True,
        extra_files={"config.json": json.dumps({"v": version, "name": name}).encode()},
        **variant,
    )
    storages = StorageRegistry(registry.settings)
    engine = create_engine(registry.settings.database_url)
    try:
        async with session_scope(make_sessionmaker(engine)) as session:
            assert await backfill_manifest(
                session, registry.settings, storages.get("local"), made.id
            )
    finally:
        await engine.dispose()
        await storages.close()
    made.files[MANIFEST_FILE] = (made.directory / MANIFEST_FILE).read_bytes()
    return made


def set_alias(registry: Registry, model: dict[str, Any], alias: str, version: int) -> None:
    with registry.http() as http:
        r = http.put(f"/api/v1/models/{model['id']}/aliases/{alias}", json={"version": version})
        assert r.status_code in (200, 201), r.text


def cli(
    registry: Registry, config: Path, *args: str, url: str | None = None
) -> tuple[int, str, str]:
    env: dict[str, str | None] = {"TENSOR_REGISTRY_CONFIG_DIR": str(config)}
    if url is not None:
        env["TENSOR_REGISTRY_URL"] = url
    done = registry.cli(*args, env=env)
    return done.returncode, done.stdout, done.stderr


def pulled_files(dest: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in dest.iterdir() if p.is_file() and not p.name.startswith(".")
    }


# ---------------------------------------------------------------------------------------------
# Another model's or an older version's signed answer


async def test_a_proxy_answering_with_another_models_or_an_older_signed_artifact_is_refused(
    registry: Registry, tmp_path: Path, client_config: Path
) -> None:
    ours, theirs = f"acme/bind-{uuid.uuid4().hex[:8]}", f"other/bind-{uuid.uuid4().hex[:8]}"
    registry.ready_model(ours, versions=2)
    registry.ready_model(theirs)
    await signed(registry, ours, 1)
    await signed(registry, ours, 2)
    await signed(registry, theirs, 1)

    def swap(to_model: str, to_ref: str) -> Any:
        def rewrite(path: str, data: Any) -> Any:
            if not path.startswith("/api/v1/resolve"):
                return data
            with registry.http() as http:
                r = http.get("/api/v1/resolve", params={"model": to_model, "ref": to_ref})
            assert r.status_code == 200, r.text
            return json.loads(r.text.replace(registry.url, proxy.url))

        return rewrite

    with mitm(registry.url) as proxy:
        for asked, (to_model, to_ref), says in (
            (f"{ours}:1", (theirs, "1"), f"is for model '{theirs}'"),
            (f"{ours}:2", (ours, "1"), "version 2 was asked for"),
        ):
            proxy.rewrite = swap(to_model, to_ref)
            dest = tmp_path / f"dest-{uuid.uuid4().hex[:6]}"
            code, out, err = cli(
                registry, client_config, "pull", asked, "--dest", str(dest), url=proxy.url
            )
            assert code == 1, (out, err)
            assert "ref_mismatch" in err and says in err, err
            assert "verified" not in err and out == ""
            assert not dest.exists() or pulled_files(dest) == {}

        # The same answers through the client library.
        proxy.rewrite = swap(theirs, "1")
        with (
            RegistryClient(proxy.url, registry.token) as client,
            pytest.raises(TrustError) as caught,
        ):
            verify_resolution(client, client.resolve(ours, "1"))
        assert caught.value.code == "ref_mismatch"


# ---------------------------------------------------------------------------------------------
# The alias binding: expiry (injected clock) and rollback


async def test_an_alias_binding_expires_and_an_older_alias_move_is_a_rollback(
    registry: Registry, tmp_path: Path, client_config: Path
) -> None:
    name = f"acme/alias-{uuid.uuid4().hex[:8]}"
    model = registry.ready_model(name, versions=2)
    v1, v2 = await signed(registry, name, 1), await signed(registry, name, 2)
    set_alias(registry, model, "prod", 1)
    public = base64.b64encode(
        manifest_keys(registry.settings).trusted()[manifest_keys(registry.settings).active_id]
    ).decode()

    with RegistryClient(registry.url, registry.token) as client:
        old = client.resolve(name, "prod", ttl=60)
        binding = json.loads(base64.b64decode(json.loads(old.data["binding"])["payload"]))
        predicate = binding["predicate"]
        assert (predicate["model"], predicate["ref"], predicate["version"]) == (name, "prod", 1)
        assert predicate["artifact"]["id"] == str(v1.id)
        assert predicate["alias"]["name"] == "prod" and predicate["alias"]["revision"] >= 1
        assert predicate["registry_id"] == manifest_keys(registry.settings).registry_id
        expires = time.time() + 60

        # Expiry, by an injected clock: the skew allowance is documented and honoured.
        def at(moment: float) -> Any:
            return lambda: moment

        seen = SeenAliases(tmp_path / "seen-clock")
        assert verify_resolution(
            client, old, trusted=[public], seen=seen, now=at(expires + CLOCK_SKEW_SECONDS - 5)
        )
        with pytest.raises(TrustError) as caught:
            verify_resolution(
                client, old, trusted=[public], seen=seen, now=at(expires + CLOCK_SKEW_SECONDS + 5)
            )
        assert caught.value.code == "binding_expired" and "expired at" in caught.value.detail
        with pytest.raises(TrustError) as caught:
            verify_resolution(client, old, trusted=[public], seen=seen, now=at(time.time() - 3600))
        assert caught.value.code == "binding_not_yet_valid"

        # Rollback: the node saw prod move to 2; an answer from before is refused, saying so.
        assert verify_resolution(client, old)
        set_alias(registry, model, "prod", 2)
        new = client.resolve(name, "prod")
        assert new.version == 2 and verify_resolution(client, new)
        with pytest.raises(TrustError) as caught:
            verify_resolution(client, old)
        assert caught.value.code == "alias_rollback"
        assert "already saw it move later, to version 2" in caught.value.detail
        seen_file = client_config / "seen-aliases.json"
        recorded = json.loads(seen_file.read_text())["registries"]
        assert recorded[manifest_keys(registry.settings).registry_id][f"{name}:prod"][
            "artifact"
        ] == str(v2.id)

    # Through the CLI and a proxy replaying the old answer: refused, nothing placed.
    with mitm(registry.url) as proxy:
        replayed = json.loads(json.dumps(old.data).replace(registry.url, proxy.url))
        proxy.rewrite = lambda path, data: replayed if path.startswith("/api/v1/resolve") else data
        dest = tmp_path / "replayed"
        code, out, err = cli(
            registry, client_config, "pull", f"{name}:prod", "--dest", str(dest), url=proxy.url
        )
    assert code == 1 and "alias_rollback" in err, (out, err)
    assert not dest.exists() or pulled_files(dest) == {}

    # A binding stripped from an alias answer is refused too.
    with mitm(registry.url) as proxy:

        def strip(path: str, data: Any) -> Any:
            if path.startswith("/api/v1/resolve"):
                data.pop("binding")
            return data

        proxy.rewrite = strip
        code, out, err = cli(
            registry, client_config, "pull", f"{name}:prod", "--dest", str(dest), url=proxy.url
        )
    assert code == 1 and "unsigned_binding" in err, (out, err)


# ---------------------------------------------------------------------------------------------
# A pull that outlives its signed URLs while the alias moves


def _expired(proxy: Mitm) -> bool:
    _, answer = proxy.answers[0]
    ends = calendar.timegm(time.strptime(answer["expires_at"], "%Y-%m-%dT%H:%M:%SZ"))
    return time.time() > ends + 1.2


@pytest.mark.parametrize("outcome", ["kept", "gone"])
async def test_a_pull_outliving_its_urls_keeps_its_artifact_while_the_alias_moves(
    registry: Registry, tmp_path: Path, client_config: Path, outcome: str
) -> None:
    name = f"acme/move-{uuid.uuid4().hex[:8]}"
    model = registry.ready_model(name, versions=2)
    v1, v2 = await signed(registry, name, 1), await signed(registry, name, 2)
    set_alias(registry, model, "prod", 1)
    dest = tmp_path / "dest"
    with mitm(registry.url) as proxy:
        held = proxy.hold("/tokenizer.json")
        process = registry_popen(
            registry,
            client_config,
            "pull",
            f"{name}:prod",
            "--ttl",
            "1",
            "--dest",
            str(dest),
            url=proxy.url,
        )
        try:
            assert held.arrived.wait(120), "the pull never asked for tokenizer.json"
            set_alias(registry, model, "prod", 2)
            if outcome == "gone":
                with registry.http() as http:
                    r = http.delete(f"/api/v1/artifacts/{v1.id}")
                    assert r.status_code in (200, 202, 204), r.text
            poll(lambda: _expired(proxy), what="the signed URLs to expire", timeout=30)
        finally:
            held.release.set()
        out, err = process.communicate(timeout=120)
        pinned = [q for q in proxy.resolves()[1:] if q.get("artifact_id")]

    assert pinned, proxy.requests
    assert all(q["artifact_id"] == [str(v1.id)] and q["ref"] == ["1"] for q in pinned)
    if outcome == "gone":
        assert process.returncode == 1, (out, err)
        assert "artifact_gone" in err and str(v1.id) in err, err
        assert "verified" not in err
        assert not (dest / PULL_RECORD).exists()
        assert all(data == v1.files[path] for path, data in pulled_files(dest).items())
        return
    assert process.returncode == 0, (out, err)
    assert "resolving again (the same artifact)" in err and "signed manifest verified" in err
    record = json.loads((dest / PULL_RECORD).read_text())
    assert record["artifact"]["id"] == str(v1.id) and record["version"] == 1
    files = pulled_files(dest)
    assert files and all(data == v1.files[path] for path, data in files.items())
    assert files["config.json"] != v2.files["config.json"]
    # Offline, the folder verifies as v1's artifact.
    code, shown, err = cli(registry, client_config, "verify", str(dest))
    assert code == 0, err
    assert json.loads(shown)["artifact"] == str(v1.id)


def registry_popen(
    registry: Registry, config: Path, *args: str, url: str
) -> Any:  # subprocess.Popen[str]
    import subprocess
    import sys

    from harness.serve_process import ROOT

    env = registry.cli_env(env={"TENSOR_REGISTRY_CONFIG_DIR": str(config)})
    env["TENSOR_REGISTRY_URL"] = url
    return subprocess.Popen(
        [sys.executable, "-m", "tensor_registry.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# ---------------------------------------------------------------------------------------------
# The vLLM command comes from signed facts


def _inject(path: str, data: Any) -> Any:
    if not path.startswith("/api/v1/resolve"):
        return data
    data["vllm"]["args"] += ["--trust-remote-code"]
    data["vllm"]["model_loader_extra_config"]["trust_remote_code"] = True
    data["vllm"]["model_loader_extra_config"]["tensorizer_uri"] = "http://127.0.0.1:9/evil"
    data["deserializer"] = {"num_readers": 100000, "verify_hash": False}
    return data


async def test_nothing_injected_into_the_answers_vllm_block_reaches_the_printed_command(
    registry: Registry, tmp_path: Path, client_config: Path
) -> None:
    name = f"acme/inject-{uuid.uuid4().hex[:8]}"
    registry.ready_model(name)
    made = await signed(registry, name, 1, dtype="bfloat16")
    with mitm(registry.url) as proxy:
        proxy.rewrite = _inject
        code, args_out, err = cli(registry, client_config, "vllm-args", name, url=proxy.url)
        assert code == 0, err
        dest = tmp_path / "dest"
        code, pull_out, err = cli(
            registry, client_config, "pull", name, "--dest", str(dest), url=proxy.url
        )
        assert code == 0, err

        # The unsigned facts of the answer changed: refused, not believed.
        def dtype(path: str, data: Any) -> Any:
            if path.startswith("/api/v1/resolve"):
                data["artifact"]["dtype"] = "float16"
            return data

        proxy.rewrite = dtype
        code, out, err = cli(registry, client_config, "vllm-args", name, url=proxy.url)
        assert code == 1 and "manifest_mismatch" in err and out == "", err

    for line in (f"vllm serve {dest} {args_out.strip()}", pull_out.strip()):
        assert "trust-remote-code" not in line and "evil" not in line
        words = shlex.split(line)
        parsed = serve_parser().parse_args(words[2:])
        assert parsed.dtype == "bfloat16" and parsed.load_format == "tensorizer"
        extra = parsed.model_loader_extra_config
        assert set(extra) == {"tensorizer_uri", "num_readers", "verify_hash"}
        assert 1 <= extra["num_readers"] <= 64 and extra["verify_hash"] is True
        assert urlsplit(extra["tensorizer_uri"]).path.endswith(f"/{made.id}/model.tensors")


# ---------------------------------------------------------------------------------------------
# Fail closed once keys are pinned


async def test_a_stripped_manifest_is_refused_once_keys_are_pinned(
    registry: Registry, tmp_path: Path, client_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"acme/strip-{uuid.uuid4().hex[:8]}"
    registry.ready_model(name)
    await signed(registry, name, 1)

    def strip(path: str, data: Any) -> Any:
        if path.startswith("/api/v1/resolve"):
            data["files"] = [f for f in data["files"] if f["path"] != MANIFEST_FILE]
            data["manifest_path"] = None
        return data

    with mitm(registry.url) as proxy:
        code, _, err = cli(
            registry, client_config, "pull", name, "--dest", str(tmp_path / "a"), url=proxy.url
        )
        assert code == 0 and "signed manifest verified" in err, err  # pins the keys
        proxy.rewrite = strip
        dest = tmp_path / "b"
        code, out, err = cli(
            registry, client_config, "pull", name, "--dest", str(dest), url=proxy.url
        )
        assert code == 1 and "unsigned_artifact" in err and "--allow-unsigned" in err, err
        assert pulled_files(dest) == {} if dest.exists() else True
        code, out, err = cli(registry, client_config, "vllm-args", name, url=proxy.url)
        assert code == 1 and "unsigned_artifact" in err and out == ""
        # The explicit opt-out.
        code, _, err = cli(
            registry,
            client_config,
            "pull",
            name,
            "--dest",
            str(dest),
            "--allow-unsigned",
            url=proxy.url,
        )
        assert code == 0 and "UNSIGNED" in err, err
        # Configured keys, on a node that pinned nothing: refused as well.
        fresh = tmp_path / "fresh-config"
        monkeypatch.setenv("TENSOR_REGISTRY_CONFIG_DIR", str(fresh))
        with RegistryClient(proxy.url, registry.token) as client:
            answer = client.resolve(name)
            with pytest.raises(TrustError) as caught:
                verify_resolution(
                    client,
                    answer,
                    trusted=[
                        base64.b64encode(
                            next(iter(manifest_keys(registry.settings).trusted().values()))
                        ).decode()
                    ],
                )
            assert caught.value.code == "unsigned_artifact"
            assert not (fresh / "trusted-keys.json").exists()


def test_what_binds_is_the_request_and_the_unsigned_advice_is_bounded() -> None:
    """What the node asked for is its own request, never the answer; the answer's reader and
    engine advice is bounded and hash verification is what the node asked."""
    from tensor_registry.trust.binding import asked_for

    lying = {
        "model": "x/y",
        "deserializer": {"num_readers": 100000, "verify_hash": False},
        "engine": {"connections": 10**6, "block_bytes": 1 << 40, "register_fraction": 7.5},
    }
    asked = Resolution(lying, {"model": "a/b", "ref": "3", "dtype": "bfloat16"})
    assert asked_for(asked) == ("a/b", "3", {"dtype": "bfloat16"})
    assert asked.num_readers == 64 and asked.verify_hash is True
    advice = asked.engine_advice
    assert (advice["connections"], advice["block_bytes"], advice["register_fraction"]) == (
        64,
        256 << 20,
        1.0,
    )
    assert advice["verify"] is True
    off = Resolution(lying, {"model": "a/b", "ref": "3", "verify_hash": "false"})
    assert off.verify_hash is False


# ---------------------------------------------------------------------------------------------
# The identity a node pins does not depend on the port


async def test_the_pinned_identity_survives_another_port_and_verify_dir_finds_it(
    tmp_path: Path, client_config: Path
) -> None:
    from harness.serve_process import ServeProcess, free_port
    from tensor_registry_server.settings import Settings
    from tests.client.conftest import TOKEN

    data_dir = tmp_path / "data"
    settings = Settings(
        data_dir=data_dir,
        database={"url": f"sqlite+aiosqlite:///{data_dir / 'registry.db'}"},  # type: ignore[arg-type]
        storage={},  # type: ignore[arg-type]
        security={},  # type: ignore[arg-type]
    )
    name = f"acme/port-{uuid.uuid4().hex[:8]}"
    outputs = []
    for round_ in (1, 2):
        server = ServeProcess(
            data_dir=data_dir,
            port=free_port(),
            env={"TENSOR_REGISTRY_ADMIN_TOKEN": TOKEN},
            set_public_url=False,
        ).start()
        registry = Registry(
            server=server, token=TOKEN, settings=settings, config_home=tmp_path / "xdg"
        )
        try:
            if round_ == 1:
                registry.ready_model(name)
                await signed(registry, name, 1)
            dest = tmp_path / f"dest-{round_}"
            code, _, err = cli(registry, client_config, "pull", name, "--dest", str(dest))
            assert code == 0 and "signed manifest verified" in err, err
            outputs.append((server.url, err))
        finally:
            server.stop()
        # Offline, without --trusted-key: the pins are found by the manifest's registry_id.
        code, shown, err = cli(registry, client_config, "verify", str(dest))
        assert code == 0, err
        assert json.loads(shown)["model"] == name

    ident = manifest_keys(settings).registry_id
    assert "trusting the manifest keys" in outputs[0][1]
    assert "trusting the manifest keys" not in outputs[1][1]  # the same registry, another port
    pins = json.loads((client_config / "trusted-keys.json").read_text())["registries"]
    assert list(pins) == [ident]
    assert sorted(pins[ident]["urls"]) == sorted(url for url, _ in outputs)
    manifest = json.loads((tmp_path / "dest-1" / MANIFEST_FILE).read_text())
    assert json.loads(base64.b64decode(manifest["payload"]))["predicate"]["registry_id"] == ident
