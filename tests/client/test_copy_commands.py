"""Every command the web UI offers to copy, and every command the CLI prints for copying, is run.

The UI's commands come from tensor_registry_server/ui/js/commands.js itself, run under node (the
module has no
DOM dependency for this reason), with the artifact and resolve JSON the UI would have fetched.
They run through bash with `tensor-registry` on PATH (this checkout's CLI). `vllm serve` lines
run a stand-in `vllm` (tests/client/vllm_stub.py: vLLM's flags and choices, plus checks that
the directory, signed URLs and key file it names work), because vLLM is not installed here.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.artifacts import CONFIG, TOKENIZER, MadeArtifact, make_artifact
from harness.serve_process import ROOT
from tensor_registry.formats.model_signature import KEYFILE_PATH, PULL_RECORD
from tests.client.conftest import Registry

COMMANDS_JS = ROOT / "tensor_registry_server" / "ui" / "js" / "commands.js"


@dataclass
class Shell:
    registry: Registry
    bin: Path
    cwd: Path
    vllm_seen: Path

    def env(self, token: str | None = None) -> dict[str, str]:
        env = self.registry.cli_env(token=token)
        env["PATH"] = f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}"
        env["VLLM_STUB_OUT"] = str(self.vllm_seen)
        env["TENSOR_REGISTRY_CACHE_DIR"] = str(self.cwd.parent / "node-cache")
        # The UI's commands name the server with --url; nothing else may point them at it.
        env.pop("TENSOR_REGISTRY_URL")
        return env

    def run(self, command: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=self.cwd,
            env=self.env(token),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        return result

    def vllm_runs(self) -> list[dict[str, Any]]:
        if not self.vllm_seen.exists():
            return []
        return [json.loads(line) for line in self.vllm_seen.read_text().splitlines()]


@pytest.fixture
def shell(registry: Registry, tmp_path: Path) -> Shell:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in (
        ("tensor-registry", f"{shlex.quote(sys.executable)} -m tensor_registry.cli"),
        ("vllm", f"{shlex.quote(sys.executable)} {ROOT / 'tests' / 'client' / 'vllm_stub.py'}"),
    ):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        script.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    return Shell(registry, bin_dir, work, tmp_path / "vllm-seen.jsonl")


def ui_commands(
    origin: str,
    model: dict[str, Any],
    artifact: dict[str, Any],
    resolved: dict[str, Any] | None = None,
) -> dict[str, str]:
    script = f"""
        import * as c from {json.dumps(COMMANDS_JS.as_uri())};
        const [origin, model, a, resolved] = JSON.parse(process.argv[1]);
        console.log(JSON.stringify({{
          resolve: c.resolveCommand(origin, model, a),
          pull: c.pullCommand(origin, model, a),
          keyfile: c.vllmKeyfile(model, a),
          resolveParams: c.resolveParams(model, a),
          vllm: resolved ? c.vllmCommand(model, a, resolved) : null,
        }}));
    """
    result = subprocess.run(
        [
            "node",
            "--input-type=module",
            "-e",
            script,
            json.dumps([origin, model, artifact, resolved]),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return dict(json.loads(result.stdout))


async def _model_with(
    registry: Registry, **variant: Any
) -> tuple[dict[str, Any], dict[str, Any], MadeArtifact]:
    name = f"acme/copy-{uuid.uuid4().hex[:8]}"
    model = registry.ready_model(name)
    made = await make_artifact(registry.settings, model=name, version=1, **variant)
    with registry.http() as http:
        listed = http.get(f"/api/v1/models/{model['id']}/artifacts").json()["items"]
    artifact = next(a for a in listed if a["id"] == str(made.id))
    return model, artifact, made


@pytest.mark.parametrize(
    "variant",
    [
        {"dtype": "float16", "format": "hf"},
        {"dtype": "bfloat16", "format": "vllm", "tensor_parallel_size": 2, "encrypted": True},
    ],
    ids=["plain-tp1", "encrypted-tp2"],
)
async def test_the_ui_copy_commands_run(
    registry: Registry, shell: Shell, variant: dict[str, Any]
) -> None:
    model, artifact, made = await _model_with(registry, **variant)
    # A second, other variant of the same version: the commands must pick exactly this one.
    other = await make_artifact(
        registry.settings,
        model=model["name"],
        version=1,
        dtype="float32",
        encrypted=not variant.get("encrypted", False),
    )
    commands = ui_commands(registry.url, model, artifact)

    # "Copy resolve request": curl with the token from the environment.
    resolved = json.loads(shell.run(commands["resolve"]).stdout)
    assert resolved["artifact"]["id"] == artifact["id"] != str(other.id)

    # "Copy pull command": the CLI accepts every flag and writes the files (and the key).
    pulled = shell.run(commands["pull"])
    # The UI names the key file where `pull` writes it: DEST's node state directory.
    assert commands["keyfile"].endswith("/" + KEYFILE_PATH), commands["keyfile"]
    dest = shell.cwd / commands["keyfile"].removesuffix("/" + KEYFILE_PATH)
    assert (dest / "config.json").read_bytes() == CONFIG
    assert (dest / "tokenizer.json").read_bytes() == TOKENIZER
    manifest = json.loads((dest / PULL_RECORD).read_text())
    assert manifest["artifact"]["id"] == artifact["id"]
    if variant.get("encrypted"):
        assert (dest / KEYFILE_PATH).read_bytes() == made.key
        assert (dest / KEYFILE_PATH).stat().st_mode & 0o777 == 0o600

    # The `vllm serve` line the CLI printed runs (from anywhere: its paths are absolute).
    shell.run(pulled.stdout.strip())
    # "Copy vllm serve command": built from the resolve answer the UI fetches (with keyfile).
    encrypted = bool(artifact["encryption"]["enabled"])
    params = {**commands["resolveParams"], "encrypted": str(encrypted).lower()}
    if artifact["encryption"]["enabled"]:
        params["keyfile"] = commands["keyfile"]
    with registry.http() as http:
        answer = http.get("/api/v1/resolve", params=params)
    assert answer.status_code == 200, answer.text
    ui_vllm = ui_commands(registry.url, model, artifact, answer.json())["vllm"]
    shell.run(ui_vllm)

    runs = shell.vllm_runs()
    assert len(runs) == 2
    for seen in runs:
        assert seen["model"] == str(dest.resolve())
        assert seen["load_format"] == "tensorizer"
        assert seen["dtype"] == artifact["dtype"]
        assert seen["tensor_parallel_size"] == artifact["tensor_parallel_size"]
        assert ("encryption_keyfile" in seen["model_loader_extra_config"]) == bool(
            artifact["encryption"]["enabled"]
        )


async def test_the_printed_vllm_commands_run_with_local_weights_and_vllm_args(
    registry: Registry, shell: Shell
) -> None:
    model, _, made = await _model_with(
        registry, dtype="bfloat16", format="vllm", tensor_parallel_size=2, encrypted=True
    )
    name = model["name"]
    dest = shell.cwd / "local"
    pulled = shell.run(
        f"tensor-registry pull {name} --url {registry.url} -tp 2 --dtype bfloat16 --encrypted "
        f"--weights --dest {dest}"
    )
    assert (dest / "model-rank-001.tensors").read_bytes() == made.files["model-rank-001.tensors"]
    shell.run(pulled.stdout.strip())
    extra = shell.vllm_runs()[-1]["model_loader_extra_config"]
    assert extra["tensorizer_uri"] == f"{dest.resolve()}/model-rank-%03d.tensors"

    # `vllm-args` prints arguments for a `vllm serve` line; its quoting is for eval.
    shell.run(
        f'eval "vllm serve {dest} $(tensor-registry vllm-args {name} --url {registry.url} '
        f'--tensor-parallel-size 2 --encrypted --keyfile {dest}/{KEYFILE_PATH})"'
    )
    seen = shell.vllm_runs()[-1]
    assert seen["tensor_parallel_size"] == 2
    assert seen["model_loader_extra_config"]["tensorizer_uri"].startswith(registry.url)
    # Without --keyfile, vllm-args names the key relative to DEST, where `pull` wrote it: the
    # line runs from DEST (the stand-in checks the file it names holds 32 bytes).
    shell.run(
        f'cd {dest} && eval "vllm serve . $(tensor-registry vllm-args {name} '
        f'--url {registry.url} --tensor-parallel-size 2 --encrypted)"'
    )
    extra = shell.vllm_runs()[-1]["model_loader_extra_config"]
    assert extra["encryption_keyfile"] == KEYFILE_PATH


def test_the_stub_refuses_what_vllm_refuses(registry: Registry, shell: Shell) -> None:
    """The stand-in can fail: the old UI pull flags and a bad vLLM flag are refused."""
    (shell.cwd / "m").mkdir()
    (shell.cwd / "m" / "config.json").write_text("{}")
    for command in (
        "vllm serve m --tp 2",  # not a vLLM flag
        "vllm serve m --dtype fp8",
        "vllm serve m --load-format tensorizer --model-loader-extra-config "
        '\'{"tensorizer_uri": "m/none.tensors"}\'',
        "vllm serve m --load-format tensorizer --model-loader-extra-config "
        '\'{"tensorizer_uri": "m/config.json", "dtype": "float16"}\'',
    ):
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=shell.cwd,
            env=shell.env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode != 0, command
    probe = httpx.get(f"{registry.url}/healthz")
    assert probe.status_code == 200


@pytest.mark.parametrize(
    "variant",
    [
        {"dtype": "float16", "format": "hf"},
        {"dtype": "bfloat16", "format": "vllm", "tensor_parallel_size": 2, "encrypted": True},
    ],
    ids=["fp16-tp1", "bf16-tp2-encrypted"],
)
async def test_every_printed_command_agrees_with_the_artifact(
    registry: Registry, shell: Shell, variant: dict[str, Any]
) -> None:
    """Issue 26 §7.2: each `vllm serve` line the CLI (`pull`, `vllm-args`), the UI and the
    resolve answer print goes through one parser (vLLM's flags: tests/client/vllm_stub.py) and
    names the artifact's dtype, load format, TP size and key file; each `tensor-registry` line
    the UI prints goes through the CLI's own parser and names its dtype, format and TP size."""
    from tensor_registry.cli.main import build_parser
    from tests.client.vllm_stub import serve_parser

    model, artifact, _ = await _model_with(registry, **variant)
    name, tp = model["name"], artifact["tensor_parallel_size"]
    encrypted = bool(artifact["encryption"]["enabled"])
    commands = ui_commands(registry.url, model, artifact)
    keyfile = commands["keyfile"]
    dest = commands["keyfile"].removesuffix("/" + KEYFILE_PATH)
    params = {**commands["resolveParams"], "encrypted": str(encrypted).lower()}
    params["keyfile"] = keyfile
    with registry.http() as http:
        answer = http.get("/api/v1/resolve", params=params)
    assert answer.status_code == 200, answer.text
    flags = ["--dtype", artifact["dtype"], "--format", artifact["format"], "-tp", str(tp)]
    flags.append("--encrypted" if encrypted else "--no-encrypted")
    vllm_args = shell.run(
        shlex.join(["tensor-registry", "vllm-args", f"{name}:1", "--url", registry.url, *flags])
        + (f" --keyfile {shlex.quote(keyfile)}" if encrypted else "")
    ).stdout
    printed = {
        "resolve answer": ["vllm", "serve", dest, *answer.json()["vllm"]["args"]],
        "ui": shlex.split(ui_commands(registry.url, model, artifact, answer.json())["vllm"]),
        "pull": shlex.split(shell.run(commands["pull"]).stdout.strip()),
        "vllm-args": shlex.split(f"vllm serve {shlex.quote(dest)} {vllm_args}"),
    }
    for where, words in printed.items():
        assert words[:2] == ["vllm", "serve"], where
        parsed = serve_parser().parse_args(words[2:])
        assert Path(shell.cwd / parsed.model).resolve() == (shell.cwd / dest).resolve(), where
        assert parsed.dtype == artifact["dtype"], where
        assert parsed.load_format == "tensorizer", where
        assert parsed.tensor_parallel_size == tp, where
        seen_key = parsed.model_loader_extra_config.get("encryption_keyfile")
        if encrypted:
            assert (shell.cwd / seen_key).resolve() == (shell.cwd / keyfile).resolve(), where
        else:
            assert seen_key is None, where
    ui_pull = build_parser().parse_args(shlex.split(commands["pull"])[1:])
    assert (ui_pull.dtype, ui_pull.format, ui_pull.tp, ui_pull.encrypted) == (
        artifact["dtype"],
        artifact["format"],
        tp,
        encrypted,
    )
