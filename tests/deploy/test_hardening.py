"""Deploy files run the registry unprivileged and behind a proxy it can see through
(issue 26 §5, issue 29 §5): the Dockerfile's targets end as a non-root user, every pod of the
Helm chart refuses root and privilege escalation, compose trusts exactly its nginx's network
for X-Forwarded-For, and nginx re-resolves the replicas and keeps /metrics off the public port.
Parsed and rendered as tests/deploy/ does elsewhere (no engine runs here)."""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path
from typing import Any

import yaml

from tensor_registry_server.middleware import _networks, client_address
from tests.deploy.test_compose import COMPOSE, DOCKERFILE, _compose, _env_example
from tests.deploy.test_helm import render

NGINX_LB = Path(__file__).resolve().parents[2] / "deploy" / "nginx-lb.conf"
DEFAULT_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}")


def _substitute(text: str, env: dict[str, str]) -> str:
    return DEFAULT_RE.sub(lambda m: env.get(m.group(1)) or m.group(2), text)


def _final_user_per_stage() -> dict[str, str | None]:
    """Each Dockerfile stage's effective USER (inherited from its base stage)."""
    users: dict[str, str | None] = {}
    stage = None
    for line in DOCKERFILE.read_text().splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            base, stage = words[1], words[-1]
            users[stage] = users.get(base)
        elif words[0] == "USER" and stage is not None:
            users[stage] = words[1]
    return users


def test_every_image_target_runs_as_a_numeric_non_root_user() -> None:
    users = _final_user_per_stage()
    assert set(users) == {"runtime", "vllm"}
    for stage, user in users.items():
        assert user is not None, f"{stage} runs as root"
        uid = user.split(":")[0]
        assert uid.isdigit() and int(uid) != 0, (stage, user)
    # The helm chart's runAsUser is the image's user.
    uid = int(str(users["runtime"]).split(":")[0])
    pods = [_pod_spec(d) for d in render() if _pod_spec(d)]
    assert pods and all(p["securityContext"]["runAsUser"] == uid for p in pods)


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    template = doc.get("spec", {}).get("template", {})
    return dict(template.get("spec", {}))


def test_every_chart_pod_refuses_root_and_privilege_escalation() -> None:
    for values in ({}, {"workers": {"vllm": {"enabled": True}}}):
        pods = [(d["metadata"]["name"], _pod_spec(d)) for d in render(values) if _pod_spec(d)]
        assert len(pods) >= 3  # api, migrate, at least one worker
        for name, spec in pods:
            pod = spec["securityContext"]
            assert pod["runAsNonRoot"] is True, name
            assert pod["runAsUser"] != 0 and pod["seccompProfile"] == {"type": "RuntimeDefault"}
            for container in spec["containers"]:
                ctx = container["securityContext"]
                assert ctx["allowPrivilegeEscalation"] is False, (name, container["name"])
                assert ctx["privileged"] is False
                assert ctx["capabilities"]["drop"] == ["ALL"]


def test_compose_trusts_its_own_network_for_forwarded_addresses() -> None:
    compose = _compose()
    env = _env_example()
    trusted = json.loads(
        _substitute(compose["x-registry-env"]["TENSOR_REGISTRY_SECURITY__TRUSTED_PROXIES"], env)
    )
    (subnet,) = compose["networks"]["default"]["ipam"]["config"]
    network = ipaddress.ip_network(_substitute(subnet["subnet"], env))
    assert trusted == [str(network)]
    # Every registry container gets it (the anchor is shared by api, migrate and workers).
    for service in ("api", "worker"):
        assert (
            "TENSOR_REGISTRY_SECURITY__TRUSTED_PROXIES"
            in compose["services"][service]["environment"]
            or compose["services"][service]["environment"] is compose["x-registry-env"]
        )
    # What the API then records for a request nginx (an address on that network) forwards,
    # and for a peer outside it that claims to forward.
    nginx = str(next(network.hosts()))
    proxies = _networks(trusted)
    assert client_address(nginx, "203.0.113.7", proxies) == "203.0.113.7"
    assert client_address("198.51.100.9", "203.0.113.7", proxies) == "198.51.100.9"


def test_nginx_re_resolves_the_replicas_and_hides_metrics() -> None:
    text = NGINX_LB.read_text()
    directives = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    assert any(re.fullmatch(r"resolver 127\.0\.0\.11( \S+)* ?;", d) for d in directives), text
    # The replicas are named through a variable, so nginx asks that resolver per request
    # (test_compose's nginx -t run checks the file parses in a real nginx).
    assert "proxy_pass $registry_api;" in directives, text
    assert "set $registry_api http://api:8000;" in directives, text
    metrics = re.search(r"location = /metrics \{(.*?)\}", text, re.S)
    assert metrics is not None and "return 404" in metrics.group(1)
    # The file compose mounts is this one.
    assert any("deploy/nginx-lb.conf" in v for v in _compose()["services"]["lb"]["volumes"])
    assert yaml.safe_load(COMPOSE.read_text())  # still a YAML document
