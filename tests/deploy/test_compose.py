"""docker-compose.yml, Dockerfile and .env.example: no engine runs here, so the files are
validated instead of started (docker-compose config, and the rules a real GPU host needs)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tensor_registry_server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
ENV_EXAMPLE = ROOT / ".env.example"
IN_CI = os.environ.get("CI", "").lower() == "true"
VARIABLE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
OWN_IMAGES = {"tensor-registry", "tensor-registry-worker", "tensor-registry-worker-vllm"}
# What .env.example leaves empty for the operator to fill in (secrets, and the registry id that
# every host must share).
REGISTRY_ID = "TENSOR_REGISTRY_SECURITY__REGISTRY_ID"
SECRETS = {
    "TENSOR_REGISTRY_SECURITY__SIGNING_KEY": "s" * 48,
    "TENSOR_REGISTRY_SECURITY__MASTER_KEY": "m" * 48,
    "TENSOR_REGISTRY_SECURITY__MANIFEST_SIGNING_KEY": "A" * 43 + "=",
    REGISTRY_ID: "tr-" + "0123456789abcdef" * 2,
    "POSTGRES_PASSWORD": "pg-password",
    "MINIO_ROOT_PASSWORD": "minio-password",
    "GRAFANA_ADMIN_PASSWORD": "grafana-password",
}


def _compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


def _env_example() -> dict[str, str]:
    values = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value
    return values


def assert_is_setting(name: str) -> None:
    assert name.startswith("TENSOR_REGISTRY_"), name
    path = name.removeprefix("TENSOR_REGISTRY_").lower().split("__")
    node: Any = Settings.model_fields
    for part in path:
        assert part in node, f"{name}: no setting {part!r}"
        annotation = node[part].annotation
        node = getattr(annotation, "model_fields", {})


def _runs_the_registry(spec: dict[str, Any]) -> bool:
    return str(spec.get("image", "")).rpartition(":")[0] in OWN_IMAGES


def _one_shot(services: dict[str, Any], name: str) -> bool:
    """A job that runs once: every service depending on it waits for it to complete."""
    waits = [
        spec["depends_on"][name]["condition"]
        for spec in services.values()
        if isinstance(spec.get("depends_on"), dict) and name in spec["depends_on"]
    ]
    return (
        services[name].get("restart") == "no"
        and bool(waits)
        and all(c == "service_completed_successfully" for c in waits)
    )


@pytest.mark.parametrize("profiles", [[], ["vllm", "monitoring", "cache"]])
def test_compose_file_passes_docker_compose_config(tmp_path: Path, profiles: list[str]) -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        if IN_CI:
            pytest.fail("docker-compose (Debian package) is required in CI to validate the file")
        pytest.skip("docker-compose not installed")
    env_file = tmp_path / ".env"
    filled = {**_env_example(), **SECRETS}
    env_file.write_text("".join(f"{k}={v}\n" for k, v in filled.items()))
    clean = {k: v for k, v in os.environ.items() if k not in filled}
    args = [binary, "--env-file", str(env_file), "-f", str(COMPOSE)]
    for profile in profiles:
        args += ["--profile", profile]
    result = subprocess.run(
        [*args, "config"], env=clean, capture_output=True, text=True, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)["services"]
    expected = {"postgres", "redis", "minio", "minio-init", "migrate", "api", "lb", "worker"}
    if profiles:
        expected |= {"worker-vllm", "prometheus", "grafana", "cache"}
    # (docker-compose 1.29's config lists profile services whether or not they are enabled.)
    assert expected <= set(rendered)
    api_env = rendered["api"]["environment"]
    assert (
        api_env["TENSOR_REGISTRY_SECURITY__SIGNING_KEY"]
        == SECRETS["TENSOR_REGISTRY_SECURITY__SIGNING_KEY"]
    )
    assert api_env["TENSOR_REGISTRY_PUBLIC_URL"] == _env_example()["TENSOR_REGISTRY_PUBLIC_URL"]
    # One registry id for every process that runs the registry's code (API, workers, migration).
    registry_hosts = {n for n, spec in rendered.items() if _runs_the_registry(spec)}
    assert {"api", "worker", "migrate"} <= registry_hosts
    if profiles:
        assert "worker-vllm" in registry_hosts
    ids = {rendered[n]["environment"].get(REGISTRY_ID) for n in registry_hosts}
    assert ids == {SECRETS[REGISTRY_ID]}
    # Without the secrets the stack refuses to start instead of running with empty keys.
    env_file.write_text("".join(f"{k}={v}\n" for k, v in _env_example().items()))
    refused = subprocess.run(
        [*args, "config", "-q"], env=clean, capture_output=True, text=True, cwd=tmp_path
    )
    assert refused.returncode != 0 and "set " in refused.stderr


def test_compose_has_the_scaled_topology() -> None:
    services = _compose()["services"]
    assert {"postgres", "redis", "minio", "minio-init", "migrate", "api", "worker", "lb"} <= set(
        services
    )
    assert services["migrate"]["command"] == ["tensor-registry", "migrate"]
    assert services["api"]["depends_on"]["migrate"] == {
        "condition": "service_completed_successfully"
    }
    for name in ("worker", "worker-vllm"):
        gpu = services[name]["deploy"]["resources"]["reservations"]["devices"][0]
        assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"], name
    assert "--no-worker" in services["api"]["command"]
    assert services["worker-vllm"]["profiles"] == ["vllm"]


def test_the_cache_tier_runs_the_shipped_nginx_config_in_front_of_the_api() -> None:
    # tests/deploy/test_blob_cache.py runs the same file in front of a real serve.
    cache = _compose()["services"]["cache"]
    assert cache["profiles"] == ["cache"]
    assert "./deploy/nginx-cache.conf:/etc/nginx/conf.d/default.conf:ro" in cache["volumes"]
    assert any(v.startswith("cache-data:/var/cache/nginx") for v in cache["volumes"])
    assert cache["depends_on"]["api"] == {"condition": "service_healthy"}
    config = (ROOT / "deploy" / "nginx-cache.conf").read_text()
    assert "http://api:8000" in config and "listen 8080;" in config


def test_every_long_running_service_has_a_healthcheck() -> None:
    services = _compose()["services"]
    for name, spec in services.items():
        if _one_shot(services, name):
            assert "healthcheck" not in spec, name
            continue
        check = spec.get("healthcheck")
        assert check and check["test"][0] in {"CMD", "CMD-SHELL"}, f"{name}: no healthcheck"
    # What the others wait for as healthy really is checked.
    for spec in services.values():
        for dependency, rule in (spec.get("depends_on") or {}).items():
            if rule["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], dependency
    assert {n for n in services if _one_shot(services, n)} == {"migrate", "minio-init"}


def test_every_api_and_worker_host_shares_one_registry_id_from_env() -> None:
    services = _compose()["services"]
    hosts = {name for name, spec in services.items() if _runs_the_registry(spec)}
    assert {"api", "migrate", "worker", "worker-vllm"} <= hosts
    # The same reference everywhere, and one that refuses to start without it: with no value,
    # each container would make up an id of its own and nodes would pin whichever they met.
    values = {str(services[name]["environment"].get(REGISTRY_ID)) for name in hosts}
    assert values == {f"${{{REGISTRY_ID}:?set {REGISTRY_ID}}}"}, values
    example = ENV_EXAMPLE.read_text()
    comment = example.split(f"\n{REGISTRY_ID}=")[0].rsplit("\n\n", 1)[-1]
    assert "every API replica and worker" in comment and "Generate it once" in comment
    # What the example tells the operator to generate passes the setting's own check.
    Settings(security={"registry_id": SECRETS[REGISTRY_ID]})  # type: ignore[arg-type]


def test_images_are_pinned() -> None:
    for name, spec in _compose()["services"].items():
        image = spec["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"
        if repository in OWN_IMAGES:
            assert "build" in spec or any(
                s.get("image") == image and "build" in s for s in _compose()["services"].values()
            ), f"{name}: {image} is built by no service"
        else:
            assert "build" not in spec, name
    assert re.search(r"^FROM python:3\.11\.\d+-slim-\w+ AS runtime$", DOCKERFILE.read_text(), re.M)


def test_build_arguments_exist_in_the_dockerfile() -> None:
    dockerfile = DOCKERFILE.read_text()
    declared = set(re.findall(r"^ARG (\w+)", dockerfile, re.M))
    targets = set(re.findall(r"^FROM \S+ AS (\w+)$", dockerfile, re.M))
    assert {"TORCH_INDEX_URL", "TORCH_VERSION", "VLLM_VERSION"} <= declared
    for name, spec in _compose()["services"].items():
        build = spec.get("build")
        if build is None:
            continue
        assert build["target"] in targets, name
        assert set(build.get("args", {})) <= declared, name
    assert _compose()["services"]["worker"]["build"]["args"]["TORCH_INDEX_URL"].endswith(
        "/whl/cu130}"
    )
    constraints = (ROOT / "constraints.txt").read_text()
    torch_pin = re.search(r"^torch==(\S+)$", constraints, re.M)
    assert torch_pin and f"ARG TORCH_VERSION={torch_pin.group(1)}" in dockerfile


def test_every_variable_the_compose_uses_is_in_env_example_and_settings_are_real() -> None:
    text = COMPOSE.read_text()
    used = set(VARIABLE_RE.findall(text))
    example = _env_example()
    assert not used - set(example), f"missing from .env.example: {sorted(used - set(example))}"
    assert not set(example) - used, f"unused in compose: {sorted(set(example) - used)}"
    for name in example:
        if name.startswith("TENSOR_REGISTRY_"):
            assert_is_setting(name)
    for name, value in _compose()["x-registry-env"].items():
        assert_is_setting(name)
        # A registry setting given through .env has the setting's own name there.
        referenced = VARIABLE_RE.findall(str(value))
        if referenced and referenced[0].startswith("TENSOR_REGISTRY_"):
            assert referenced == [name], name
    assert example["TENSOR_REGISTRY_PUBLIC_URL"].startswith("http")
    for secret in SECRETS:
        assert example[secret] == "", f"{secret} must be left for the operator to fill in"


NGINX_LB = ROOT / "deploy" / "nginx-lb.conf"


def test_nginx_looks_api_addresses_up_per_request_through_dockers_dns(tmp_path: Path) -> None:
    text = re.sub(r"#.*", "", NGINX_LB.read_text())
    assert re.search(r"^\s*resolver\s+127\.0\.0\.11\b[^;]*\bvalid=\d+s", text, re.M), text
    passes = re.findall(r"proxy_pass\s+([^;]+);", text)
    assert passes and all(target.startswith("$") for target in passes), passes
    # A proxy_pass naming a host (or an upstream block of names) is resolved once at start;
    # through a variable it is not, so the file loads where `api` does not resolve at all.
    assert "upstream" not in text
    lb = _compose()["services"]["lb"]
    assert any(v.startswith("./deploy/nginx-lb.conf:/etc/nginx/conf.d/") for v in lb["volumes"])
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"error_log stderr;\npid {tmp_path}/nginx.pid;\nevents {{}}\n"
        f"http {{ include {NGINX_LB}; }}\n"
    )
    (tmp_path / "logs").mkdir()
    result = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(main)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_workers_spool_and_work_on_a_scratch_volume() -> None:
    compose = _compose()
    data_dir = re.search(r"^ENV TENSOR_REGISTRY_DATA_DIR=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert data_dir
    for name in ("worker", "worker-vllm"):
        spec = compose["services"][name]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in spec["volumes"]}
        volume = mounts[data_dir.group(1)]
        # A named volume (not the container's writable layer, not a host path).
        assert volume in compose["volumes"], name
        env = spec["environment"]
        # The work directories live under the data dir
        # (tensor_registry_server/artifacts/making/attempt.py), the S3
        # sink's spool file in the temporary directory: both on the volume.
        assert env["TMPDIR"] == data_dir.group(1), name
        assert "TENSOR_REGISTRY_DATA_DIR" not in env or env["TENSOR_REGISTRY_DATA_DIR"] == (
            data_dir.group(1)
        )
    # The API replicas keep nothing on disk.
    assert "volumes" not in compose["services"]["api"]
