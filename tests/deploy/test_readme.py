"""The README's deploy commands, run as written. No Docker engine or cluster here: `docker` and
`helm` are stand-ins that record their arguments; what they were given is then rendered (the
chart, with Helm's own engine) or validated (the compose file with the .env the block made)."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import helm_python
import yaml

from tensor_registry_server.trust.signing_keys import public_key_b64
from tests.deploy.test_compose import COMPOSE, ROOT
from tests.deploy.test_helm import CHART, by_kind

README = ROOT / "README.md"
STAND_IN = """#!{python}
import json, os, sys
with open(os.environ["STAND_IN_LOG"], "a") as log:
    log.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
if sys.argv[1:3] == ["compose", "logs"]:
    print("api-1  | export TENSOR_REGISTRY_TOKEN=trg_stand-in")
"""


def readme_block(heading: str, containing: str) -> str:
    section = README.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    [block] = [b for b in blocks if containing in b]
    return block


def run_block(block: str, cwd: Path, tmp_path: Path) -> list[list[str]]:
    bin_dir = tmp_path / "stand-ins"
    bin_dir.mkdir()
    for name in ("docker", "helm"):
        (bin_dir / name).write_text(STAND_IN.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "EDITOR": "true",
        "STAND_IN_LOG": str(log),
    }
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def helm_install_values(args: list[str]) -> tuple[str, Path, dict[str, Any]]:
    """`helm install NAME CHART --set a=b ...` as Helm reads it (its own --set parser)."""
    assert args[:2] == ["helm", "install"], args
    name, chart, *flags = args[2:]
    values: dict[str, Any] = {}
    while flags:
        flag, value, *flags = flags
        assert flag == "--set", f"{flag} is not handled by this test"
        values = _merge(values, helm_python.parse_set_string(value))
    return name, Path(chart), values


def test_readme_helm_block_builds_pushes_and_installs_what_the_pods_run(tmp_path: Path) -> None:
    calls = run_block(
        readme_block("Deploying on Kubernetes (Helm)", "helm install"), ROOT, tmp_path
    )
    targets = set(re.findall(r"^FROM \S+ AS (\w+)$", (ROOT / "Dockerfile").read_text(), re.M))
    built, pushed = set(), []
    for call in calls:
        if call[:2] == ["docker", "build"]:
            assert call[-1] == "." and call[call.index("--target") + 1] in targets, call
            built.add(call[call.index("-t") + 1])
        elif call[:2] == ["docker", "push"]:
            assert call[2] in built, f"{call[2]} pushed before it was built"
            pushed.append(call[2])
    [install] = [c for c in calls if c[0] == "helm"]
    name, chart, values = helm_install_values(install)
    assert (ROOT / chart).resolve() == CHART
    rendered = helm_python.Chart.load(ROOT / chart).render(
        values, name=name, namespace="default", is_install=True
    )
    docs = [
        d
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]
    images = {
        c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "Job"}
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images and images <= set(pushed), (images, pushed)
    # The keys are real: the manifest signing key is an Ed25519 seed.
    [secret] = by_kind(docs, "Secret").values()
    assert len(base64.b64decode(secret["stringData"]["manifest-signing-key"])) == 32
    assert len(secret["stringData"]["signing-key"]) >= 32
    # What the section says the block turns on is rendered.
    [ingress] = by_kind(docs, "Ingress").values()
    assert ingress["spec"]["rules"][0]["host"] == "registry.internal"
    assert by_kind(docs, "PrometheusRule") and by_kind(docs, "ServiceMonitor")


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable substitution: ${VAR}, ${VAR:-default}, ${VAR:?error}, $$."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3) or ""
        value = env.get(name, "")
        if op == ":?" and not value:
            raise AssertionError(f"compose refuses to start: {name}: {arg}")
        if op == ":-" and not value:
            return arg
        return value

    return re.sub(r"\$\$|\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, text)


def test_readme_compose_block_makes_an_env_the_stack_starts_with(tmp_path: Path) -> None:
    work = tmp_path / "checkout"
    (work / "scripts").mkdir(parents=True)
    for name in ("docker-compose.yml", ".env.example", "scripts/fill-env-secrets"):
        shutil.copy2(ROOT / name, work / name)
    block = readme_block("Deploying on a GPU host (docker compose)", "docker compose up")
    calls = run_block(block, work, tmp_path)
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    for call in calls:
        assert call[:2] == ["docker", "compose"], call
        assert call[2] in {"up", "ps", "logs"}, call
        named = [a for a in call[3:] if not a.startswith("-")]
        assert set(named) <= set(services), call
    env_file = work / ".env"
    filled = env_file.read_text()
    env = {k: v for k, _, v in (line.partition("=") for line in filled.splitlines())}
    # Every value the compose file requires is there, and the registry accepts them.
    compose = yaml.safe_load(_interpolate(COMPOSE.read_text(), env))
    registry_env = compose["x-registry-env"]
    keys = {
        name: registry_env[f"TENSOR_REGISTRY_SECURITY__{name}"]
        for name in ("SIGNING_KEY", "MASTER_KEY", "MANIFEST_SIGNING_KEY")
    }
    assert public_key_b64(keys["MANIFEST_SIGNING_KEY"])  # the registry's own seed check
    assert all(len(v) >= 32 for v in keys.values())
    assert len(set(keys.values())) == 3
    # One registry id for every host, in the setting's own form.
    assert re.fullmatch(r"tr-[0-9a-f]{32}", registry_env["TENSOR_REGISTRY_SECURITY__REGISTRY_ID"])
    # Passwords go into URLs: nothing there needs escaping.
    url = registry_env["TENSOR_REGISTRY_DATABASE__URL"]
    assert re.fullmatch(r"postgresql\+asyncpg://registry:[0-9a-f]{32,}@postgres:5432/registry", url)
    assert env_file.stat().st_mode & 0o777 == 0o600  # it holds the keys
    # Running it again keeps every value (a second run must not rotate the keys).
    subprocess.run(["./scripts/fill-env-secrets", ".env"], cwd=work, check=True, timeout=30)
    assert env_file.read_text() == filled


def test_every_compose_command_in_the_readme_names_real_services_and_profiles() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    profiles = {p for spec in services.values() for p in spec.get("profiles", [])}
    commands = re.findall(r"docker compose [^`\n#]+", README.read_text())
    assert len(commands) >= 5
    for command in commands:
        args = shlex.split(command)[2:]
        for i, arg in enumerate(args):
            if arg == "--profile":
                assert args[i + 1] in profiles, command
            if arg == "--scale":
                assert args[i + 1].split("=")[0] in services, command
