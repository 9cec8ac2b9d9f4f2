"""deploy/helm/tensor-registry, rendered by Helm's own engine (helm-python-sdk: Helm v4's Go
SDK behind a C ABI, from PyPI) and checked document by document — no cluster involved."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.test_compose import assert_is_setting

IN_CI = os.environ.get("CI", "").lower() == "true"
CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "tensor-registry"
REQUIRED: dict[str, Any] = {
    "publicUrl": "https://registry.example.internal",
    "secrets": {
        "signingKey": "s" * 48,
        "masterKey": "m" * 48,
        "manifestSigningKey": "A" * 43 + "=",
        "databaseUrl": "postgresql+asyncpg://registry:pw@postgres:5432/registry",
    },
}
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ALIVE_FILE = "/tmp/tensor-registry-worker.alive"


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and key in out else value
    return out


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    chart = helm_python.Chart.load(CHART)
    manifests = chart.render(
        _merge(REQUIRED, values or {}), name="registry", namespace="ml", is_install=True
    )
    docs = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [doc for doc in yaml.safe_load_all(text) if doc]
    return docs


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def containers(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    return list(deployment["spec"]["template"]["spec"]["containers"])


def test_chart_lints_clean() -> None:
    report = helm_python.lint(CHART, REQUIRED, strict=True)
    assert report["errors"] == [], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


def test_default_render_has_api_service_workers_migrate_and_secret() -> None:
    docs = render()
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs)
    assert kinds == [
        ("Deployment", "registry-tensor-registry-api"),
        ("Deployment", "registry-tensor-registry-worker-gpu"),
        ("Job", "registry-tensor-registry-migrate"),
        ("Secret", "registry-tensor-registry-secrets"),
        ("Service", "registry-tensor-registry-api"),
    ]
    for doc in docs:
        assert doc["apiVersion"] and NAME_RE.match(doc["metadata"]["name"]), doc["metadata"]
        assert len(doc["metadata"]["name"]) <= 63
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "registry"


def test_pods_are_wired_to_real_settings_and_existing_secret_keys() -> None:
    docs = render({"secrets": {"adminToken": "trg_" + "a" * 30}})
    [secret] = by_kind(docs, "Secret").values()
    keys = set(secret["stringData"])
    wanted = {"signing-key", "master-key", "manifest-signing-key", "database-url", "admin-token"}
    assert wanted <= keys
    workloads = [*by_kind(docs, "Deployment").values(), *by_kind(docs, "Job").values()]
    for workload in workloads:
        template = workload["spec"]["template"]
        if workload["kind"] == "Deployment":
            selector = workload["spec"]["selector"]["matchLabels"]
            assert selector.items() <= template["metadata"]["labels"].items()
        for container in containers(workload):
            repository, _, tag = container["image"].rpartition(":")
            assert repository and tag == "0.1.0", container["image"]
            env = {e["name"]: e for e in container["env"]}
            assert len(env) == len(container["env"]), "duplicate env"
            for name, entry in env.items():
                assert_is_setting(name)
                ref = entry.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == secret["metadata"]["name"]
                    assert ref["key"] in keys or ref.get("optional"), ref
            assert env["TENSOR_REGISTRY_PUBLIC_URL"]["value"] == REQUIRED["publicUrl"]
            assert env["TENSOR_REGISTRY_STORAGE__DEFAULT_BACKEND"]["value"] == "s3"
    # Secrets never appear as plain env values.
    rendered = yaml.safe_dump(workloads)
    for secret_value in REQUIRED["secrets"].values():
        assert secret_value not in rendered


def test_api_deployment_and_service() -> None:
    docs = render({"api": {"replicas": 3}})
    api = by_kind(docs, "Deployment")["registry-tensor-registry-api"]
    [service] = by_kind(docs, "Service").values()
    assert api["spec"]["replicas"] == 3
    [container] = containers(api)
    assert container["command"][:2] == ["tensor-registry", "serve"]
    assert {"--no-worker", "--no-migrate"} <= set(container["command"])
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000}
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def test_gpu_workers_request_gpus_and_a_cpu_worker_does_not() -> None:
    docs = render(
        {
            "workers": {
                "gpu": {"gpus": 2},
                "vllm": {"enabled": True},
                "cpu": {"enabled": True, "replicas": 1, "queues": "cpu", "concurrency": 2,
                        "gpus": 0, "resources": {"requests": {"cpu": "2"}}},
            }
        }
    )  # fmt: skip
    workers = by_kind(docs, "Deployment")
    gpu = containers(workers["registry-tensor-registry-worker-gpu"])[0]
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert gpu["resources"]["requests"]["nvidia.com/gpu"] == 2
    assert gpu["image"] == "tensor-registry-worker:0.1.0"
    assert gpu["command"] == [
        "tensor-registry", "worker", "--queues", "gpu,cpu", "--concurrency", "1"
    ]  # fmt: skip
    tolerations = workers["registry-tensor-registry-worker-gpu"]["spec"]["template"]["spec"][
        "tolerations"
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    vllm = containers(workers["registry-tensor-registry-worker-vllm"])[0]
    assert vllm["image"] == "tensor-registry-worker-vllm:0.1.0"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    cpu = containers(workers["registry-tensor-registry-worker-cpu"])[0]
    assert "nvidia.com/gpu" not in cpu["resources"].get("limits", {})
    assert cpu["command"][3] == "cpu"
    for container in (gpu, vllm, cpu):
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TENSOR_REGISTRY_WORKER__ALIVE_FILE"] == ALIVE_FILE
        assert ALIVE_FILE in " ".join(container["livenessProbe"]["exec"]["command"])


def test_migrate_job_runs_as_a_hook_after_the_secret_it_reads() -> None:
    docs = render()
    [job] = by_kind(docs, "Job").values()
    [secret] = by_kind(docs, "Secret").values()
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    secret_hook = secret["metadata"]["annotations"]
    assert set(secret_hook["helm.sh/hook"].split(",")) == {"pre-install", "pre-upgrade"}
    assert int(secret_hook["helm.sh/hook-weight"]) < int(annotations["helm.sh/hook-weight"])
    assert secret_hook["helm.sh/resource-policy"] == "keep"
    [container] = containers(job)
    assert container["command"] == ["tensor-registry", "migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert not any(d["kind"] == "Job" for d in render({"migrate": {"enabled": False}}))


def test_service_monitor_is_optional_and_scrapes_the_api_as_job_tensor_registry() -> None:
    assert not by_kind(render(), "ServiceMonitor")
    docs = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kp"}}}})
    [monitor] = by_kind(docs, "ServiceMonitor").values()
    [service] = by_kind(docs, "Service").values()
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kp"
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "tensor-registry"


def test_existing_secret_replaces_the_chart_secret() -> None:
    docs = render(
        {"secrets": {"existingSecret": "registry-keys", "signingKey": "", "masterKey": "",
                     "manifestSigningKey": "",
                     "databaseUrl": ""}}
    )  # fmt: skip
    assert not by_kind(docs, "Secret")
    for deployment in by_kind(docs, "Deployment").values():
        for container in containers(deployment):
            refs = [e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e]
            assert refs and {r["name"] for r in refs} == {"registry-keys"}


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ({"publicUrl": ""}, "publicUrl is required"),
        ({"secrets": {"signingKey": ""}}, "secrets.signingKey is required"),
        ({"secrets": {"masterKey": ""}}, "secrets.masterKey is required"),
        ({"secrets": {"manifestSigningKey": ""}}, "secrets.manifestSigningKey is required"),
        ({"secrets": {"databaseUrl": ""}}, "secrets.databaseUrl is required"),
    ],
)
def test_missing_required_values_fail_the_render(missing: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=re.escape(message)):
        render(missing)


def test_values_file_documents_every_top_level_key() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    top_level = [i for i, line in enumerate(lines) if re.match(r"^[A-Za-z]\w*:", line)]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert len(top_level) == len(values)
    undocumented = [lines[i].split(":")[0] for i in top_level if not lines[i - 1].startswith("#")]
    assert not undocumented, undocumented


def test_ingress_is_optional_and_routes_publicurls_host_to_the_api_service() -> None:
    assert not by_kind(render(), "Ingress")
    tls = [{"hosts": ["registry.example.internal"], "secretName": "registry-tls"}]
    docs = render({"ingress": {"enabled": True, "className": "nginx", "tls": tls}})
    [ingress] = by_kind(docs, "Ingress").values()
    [service] = by_kind(docs, "Service").values()
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == tls
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "registry.example.internal"  # publicUrl's host
    [path] = rule["http"]["paths"]
    assert path["path"] == "/" and path["pathType"] == "Prefix"
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    # Weights stream through unbuffered and uploads are not capped by the controller.
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"] == "0"
    other = render({"ingress": {"enabled": True, "host": "models.example"},
                    "publicUrl": "http://10.0.0.5:8000"})  # fmt: skip
    assert by_kind(other, "Ingress")["registry-tensor-registry"]["spec"]["rules"][0]["host"] == (
        "models.example"
    )


def test_prometheus_rule_is_optional_and_carries_the_alerts_file_unchanged() -> None:
    assert not by_kind(render(), "PrometheusRule")
    docs = render({"metrics": {"prometheusRule": {"enabled": True, "labels": {"release": "kp"}}}})
    [rule] = by_kind(docs, "PrometheusRule").values()
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kp"
    alerts = yaml.safe_load((CHART.parents[1] / "prometheus" / "alerts.yml").read_text())
    # Same rules, same {{ $labels }} templates (Helm must not have expanded them).
    assert rule["spec"]["groups"] == alerts["groups"]


def test_chart_with_everything_on_lints_clean() -> None:
    values = _merge(
        REQUIRED,
        {
            "ingress": {"enabled": True},
            "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
            "cache": {"enabled": True},
        },
    )
    report = helm_python.lint(CHART, values, strict=True)
    assert report["errors"] == [], report
    assert not [m for m in report["messages"] if m["severity"] >= 2], report["messages"]


def test_agent_daemonset_runs_the_agent_on_the_serving_nodes() -> None:
    from tensor_registry.cli.main import build_parser

    assert "registry-tensor-registry-agent" not in by_kind(render(), "DaemonSet")
    docs = render(
        {
            "agent": {
                "enabled": True,
                "watch": ["acme/llama:prod", "acme/mistral:staging"],
                "dtype": "bfloat16",
                "tensorParallelSize": 2,
                "maxCacheSize": "500GB",
                "token": {"secretName": "agent-token"},
                "nodeSelector": {"nvidia.com/gpu.present": "true"},
            }
        }
    )
    daemonset = by_kind(docs, "DaemonSet")["registry-tensor-registry-agent"]
    [container] = containers(daemonset)
    command = [c.replace("$(NODE_NAME)", "gpu-node-1") for c in container["command"]]
    args = build_parser().parse_args(command[1:])
    assert args.watch == ["acme/llama:prod", "acme/mistral:staging"]
    assert (args.dtype, args.tp, args.max_cache_size) == ("bfloat16", 2, "500GB")
    assert args.node_id == "gpu-node-1"
    env = {e["name"]: e for e in container["env"]}
    assert env["TENSOR_REGISTRY_URL"]["value"] == REQUIRED["publicUrl"]
    assert env["TENSOR_REGISTRY_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "agent-token"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    cache = env["TENSOR_REGISTRY_CACHE_DIR"]["value"]
    assert container["volumeMounts"] == [{"name": "cache", "mountPath": cache}]
    [volume] = daemonset["spec"]["template"]["spec"]["volumes"]
    assert volume["hostPath"]["path"] == "/var/cache/tensor-registry"
    spec = daemonset["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    with pytest.raises(helm_python.HelmRenderError, match=r"agent\.watch"):
        render({"agent": {"enabled": True, "token": {"secretName": "t"}}})


REGISTRY_ID_RE = re.compile(r"^[A-Za-z0-9._-]{8,64}$")


def registry_id_refs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each API, worker and migration container's TENSOR_REGISTRY_SECURITY__REGISTRY_ID entry."""
    out = {}
    for workload in [*by_kind(docs, "Deployment").values(), *by_kind(docs, "Job").values()]:
        for container in containers(workload):
            if container["name"] == "nginx":
                continue
            env = {e["name"]: e for e in container["env"]}
            out[f"{workload['metadata']['name']}/{container['name']}"] = env[
                "TENSOR_REGISTRY_SECURITY__REGISTRY_ID"
            ]
    return out


def test_every_api_and_worker_pod_reads_one_registry_id_from_the_chart_secret() -> None:
    docs = render({"workers": {"vllm": {"enabled": True}}, "cache": {"enabled": True}})
    [secret] = by_kind(docs, "Secret").values()
    generated = secret["stringData"]["registry-id"]
    # Generated at install: a valid setting, and not something a reader could guess.
    assert REGISTRY_ID_RE.match(generated) and re.fullmatch(r"tr-[a-z0-9]{32}", generated)
    refs = registry_id_refs(docs)
    assert set(refs) == {
        "registry-tensor-registry-api/api",
        "registry-tensor-registry-worker-gpu/worker",
        "registry-tensor-registry-worker-vllm/worker",
        "registry-tensor-registry-migrate/migrate",
    }, refs
    for where, entry in refs.items():
        # From the Secret, never a literal value a pod could differ in; not optional: a pod
        # without it would make up an identity of its own.
        assert "value" not in entry, where
        assert entry["valueFrom"]["secretKeyRef"] == {
            "name": secret["metadata"]["name"],
            "key": "registry-id",
        }, where
    rendered = yaml.safe_dump([d for d in docs if d["kind"] != "Secret"])
    assert generated not in rendered


def test_a_given_registry_id_is_kept_and_a_malformed_one_fails_the_render() -> None:
    given = "tr-0123456789abcdef0123456789abcdef"
    [secret] = by_kind(render({"secrets": {"registryId": given}}), "Secret").values()
    assert secret["stringData"]["registry-id"] == given
    for bad in ["short", "a" * 65, "tr-id\nmaster-key: stolen", "tr id with spaces", "tr/../x"]:
        with pytest.raises(helm_python.HelmRenderError, match=r"secrets\.registryId must be"):
            render({"secrets": {"registryId": bad}})


def test_an_existing_secret_supplies_the_registry_id_too() -> None:
    docs = render(
        {"secrets": {"existingSecret": "registry-keys", "signingKey": "", "masterKey": "",
                     "manifestSigningKey": "", "databaseUrl": ""}}
    )  # fmt: skip
    for where, entry in registry_id_refs(docs).items():
        ref = entry["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "registry-keys", "key": "registry-id"}, where


CACHE_CONF = CHART.parents[1] / "nginx-cache.conf"
CACHE = "registry-tensor-registry-cache"


def test_cache_tier_is_off_by_default() -> None:
    docs = render()
    assert not [d for d in docs if d["metadata"]["name"] == CACHE]


def test_cache_tier_runs_the_shipped_nginx_config_unchanged_with_the_pods_security() -> None:
    docs = render({"cache": {"enabled": True}})
    [config] = [d for d in by_kind(docs, "ConfigMap").values() if d["metadata"]["name"] == CACHE]
    # One copy: the ConfigMap holds deploy/nginx-cache.conf byte for byte.
    assert config["data"]["nginx-cache.conf"].encode() == CACHE_CONF.read_bytes()
    configure = CHART / "files" / "cache-configure.sh"
    assert config["data"]["cache-configure.sh"].encode() == configure.read_bytes()

    deployment = by_kind(docs, "Deployment")[CACHE]
    spec = deployment["spec"]["template"]["spec"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert spec["securityContext"] == values["podSecurityContext"]
    [init] = spec["initContainers"]
    [nginx] = spec["containers"]
    for container in (init, nginx):
        assert container["image"] == "nginxinc/nginx-unprivileged:1.27.4-bookworm"
        assert container["securityContext"] == {
            **values["securityContext"],
            "readOnlyRootFilesystem": True,
        }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["config"]["configMap"]["name"] == CACHE
    assert volumes["cache"]["emptyDir"] == {"sizeLimit": "100Gi"}
    mounts = {m["mountPath"]: m["name"] for m in nginx["volumeMounts"]}
    # The shipped file's proxy_cache_path is on the cache volume; what nginx writes besides
    # (pid, temp files) goes to /tmp, so the root filesystem stays read-only.
    assert "proxy_cache_path /var/cache/nginx/blobs " in CACHE_CONF.read_text()
    assert mounts == {"/etc/nginx/conf.d": "conf-d", "/var/cache/nginx": "cache", "/tmp": "tmp"}
    assert {m["mountPath"]: m["name"] for m in init["volumeMounts"]} == {
        "/etc/tensor-registry": "config",
        "/etc/nginx/conf.d": "conf-d",
    }
    assert init["command"] == ["sh", "/etc/tensor-registry/cache-configure.sh"]
    # The origin is the chart's api Service.
    api_service = by_kind(docs, "Service")["registry-tensor-registry-api"]
    env = {e["name"]: e["value"] for e in init["env"]}
    api_port = api_service["spec"]["ports"][0]["port"]
    assert env == {
        "CACHE_ORIGIN": f"http://registry-tensor-registry-api.ml.svc.cluster.local:{api_port}",
        "CACHE_MAX_SIZE": "90g",
    }
    service = by_kind(docs, "Service")[CACHE]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert not service["spec"]["selector"].items() <= (
        by_kind(docs, "Deployment")["registry-tensor-registry-api"]["spec"]["template"]["metadata"][
            "labels"
        ].items()
    )
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    assert nginx["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert "listen 8080;" in CACHE_CONF.read_text()
    claimed = render({"cache": {"enabled": True, "storage": {"existingClaim": "blob-cache"}}})
    claimed_spec = by_kind(claimed, "Deployment")[CACHE]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in claimed_spec["volumes"]}
    assert volumes["cache"] == {
        "name": "cache",
        "persistentVolumeClaim": {"claimName": "blob-cache"},
    }


def _run_configure(
    docs: list[dict[str, Any]], tmp_path: Path, source: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The rendered init step, run by sh here as the pod would run it, on the ConfigMap's file."""
    [config] = [d for d in by_kind(docs, "ConfigMap").values() if d["metadata"]["name"] == CACHE]
    [init] = by_kind(docs, "Deployment")[CACHE]["spec"]["template"]["spec"]["initContainers"]
    (tmp_path / "configure.sh").write_text(config["data"]["cache-configure.sh"])
    (tmp_path / "nginx-cache.conf").write_text(source or config["data"]["nginx-cache.conf"])
    (tmp_path / "resolv.conf").write_text("search ml.svc.cluster.local\nnameserver 10.96.0.10\n")
    env = {e["name"]: e["value"] for e in init["env"]}
    return subprocess.run(
        ["sh", str(tmp_path / "configure.sh")],
        env={
            "PATH": os.environ["PATH"],
            **env,
            "CACHE_CONF_SOURCE": str(tmp_path / "nginx-cache.conf"),
            "CACHE_CONF_TARGET": str(tmp_path / "default.conf"),
            "CACHE_RESOLV_CONF": str(tmp_path / "resolv.conf"),
        },
        capture_output=True,
        text=True,
    )


def test_cache_init_step_changes_only_origin_resolver_and_size_and_nginx_accepts_it(
    tmp_path: Path,
) -> None:
    docs = render({"cache": {"enabled": True, "maxSize": "40g"}})
    result = _run_configure(docs, tmp_path)
    assert result.returncode == 0, result.stderr
    written = (tmp_path / "default.conf").read_text().splitlines()
    shipped = CACHE_CONF.read_text().splitlines()
    assert len(written) == len(shipped)
    changed = [(a, b) for a, b in zip(shipped, written, strict=True) if a != b]
    assert changed == [
        ("                 max_size=200g inactive=7d use_temp_path=off;",
         "                 max_size=40g inactive=7d use_temp_path=off;"),
        ("resolver 127.0.0.11 valid=10s ipv6=off;", "resolver 10.96.0.10 valid=10s ipv6=off;"),
        ("    set $tensor_registry_origin http://api:8000;",
         "    set $tensor_registry_origin http://registry-tensor-registry-api.ml.svc.cluster.local:8000;"),
    ]  # fmt: skip
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        if IN_CI:
            pytest.fail("nginx (Debian package) is required in CI to check the cache config")
        pytest.skip("nginx not installed")
    # nginx -t on what the pod runs (the cache folder moved to tmp_path: -t creates it).
    text = (tmp_path / "default.conf").read_text()
    text = text.replace("/var/cache/nginx/blobs", str(tmp_path / "blobs"))
    (tmp_path / "logs").mkdir()
    (tmp_path / "nginx.conf").write_text(
        f"error_log stderr;\npid {tmp_path}/nginx.pid;\nevents {{}}\nhttp {{\n{text}\n}}\n"
    )
    checked = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stderr


def test_cache_init_step_refuses_a_config_it_does_not_recognise(tmp_path: Path) -> None:
    docs = render({"cache": {"enabled": True}})
    moved = CACHE_CONF.read_text().replace("http://api:8000;", "http://registry-api:8000;")
    result = _run_configure(docs, tmp_path, source=moved)
    assert result.returncode != 0
    assert "no single line matching 'http://api:8000;'" in result.stderr
    assert not (tmp_path / "default.conf").exists()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"maxSize": "90g; proxy_pass http://evil"}, r"cache\.maxSize must be an nginx size"),
        ({"maxSize": "90G|"}, r"cache\.maxSize must be an nginx size"),
        ({"clusterDomain": "cluster.local;rm"}, r"cache\.clusterDomain must be a DNS name"),
        ({"replicas": 2, "storage": {"existingClaim": "one"}}, r"cache\.storage\.existingClaim"),
    ],
)
def test_cache_values_that_would_break_the_config_fail_the_render(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(helm_python.HelmRenderError, match=message):
        render({"cache": {"enabled": True, **values}})


def test_with_the_cache_on_the_ingress_sends_blob_urls_through_it() -> None:
    docs = render({"ingress": {"enabled": True}, "cache": {"enabled": True}})
    [ingress] = by_kind(docs, "Ingress").values()
    [rule] = ingress["spec"]["rules"]
    backends = {p["path"]: p["backend"]["service"]["name"] for p in rule["http"]["paths"]}
    assert backends == {"/api/v1/blobs/": CACHE, "/": "registry-tensor-registry-api"}
    # Uploads and the API go straight to the API (the cache would spool request bodies).
    without = by_kind(render({"ingress": {"enabled": True}}), "Ingress")
    [only] = without["registry-tensor-registry"]["spec"]["rules"][0]["http"]["paths"]
    assert only["path"] == "/"


def test_sso_limits_and_retention_values_become_settings_the_registry_accepts() -> None:
    """The chart's sso/limits/retention values reach every pod as settings that parse (a
    12-digit byte quota stays an integer, roles stay JSON), the client secret only through the
    chart Secret; with the defaults SSO is off and no limit is set (issue 36)."""
    roles = [{"group": "ml-platform", "namespaces": ["acme"], "role": "publisher"}]
    docs = render(
        {
            "sso": {"issuer": "https://idp.example.internal/ml", "clientId": "tr", "roles": roles},
            "limits": {
                "storageBytes": 1_000_000_000_000,
                "concurrentJobs": 8,
                "ratePerSecond": 2.5,
            },
            "retention": {"defaultKeepLast": 5, "gcIntervalSeconds": 3600},
            "secrets": {"ssoClientSecret": "sso-secret-value"},
        }
    )
    [secret] = by_kind(docs, "Secret").values()
    assert secret["stringData"]["sso-client-secret"] == "sso-secret-value"
    workloads = [*by_kind(docs, "Deployment").values(), *by_kind(docs, "Job").values()]
    assert "sso-secret-value" not in yaml.safe_dump(workloads)
    for workload in workloads:
        for container in containers(workload):
            env = {e["name"]: e.get("value") for e in container["env"]}
            environ = {k: v for k, v in env.items() if v is not None}
            environ["TENSOR_REGISTRY_SSO__CLIENT_SECRET"] = "sso-secret-value"
            settings = _settings_from(environ)
            assert settings.sso.issuer == "https://idp.example.internal/ml"
            assert settings.sso.client_secret.get_secret_value() == "sso-secret-value"
            assert [(r.group, r.role) for r in settings.sso.roles] == [("ml-platform", "publisher")]
            assert settings.limits.storage_bytes == 1_000_000_000_000
            assert settings.limits.concurrent_jobs == 8 and settings.limits.upload_bytes is None
            assert settings.limits.rate_per_second == 2.5
            assert settings.retention.default_keep_last == 5
            assert settings.retention.gc_interval_seconds == 3600

    plain = by_kind(render(), "Deployment")
    for workload in plain.values():
        for container in containers(workload):
            names = {e["name"] for e in container["env"]}
            assert not any(n.startswith("TENSOR_REGISTRY_SSO__") for n in names)
            assert not {"TENSOR_REGISTRY_LIMITS__STORAGE_BYTES"} & names
            assert "TENSOR_REGISTRY_RETENTION__DEFAULT_KEEP_LAST" not in names


def _settings_from(environ: dict[str, str]) -> Any:
    """The registry's settings as a pod with this environment reads them."""
    from tensor_registry_server.settings import Settings

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(environ)
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)
