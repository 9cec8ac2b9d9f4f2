"""deploy/grafana and deploy/prometheus: valid files, and every metric they name is on a real
/metrics scrape of the app after traffic that moves each figure (tests/metrics_traffic.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import yaml
from fastapi import FastAPI
from prometheus_client import REGISTRY

from tensor_registry_server.settings import Settings
from tests.metrics_traffic import drive_traffic, scrape

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "tensor-registry.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
# Series Prometheus makes itself, not the app.
SYNTHETIC = {"up"}
PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "inf", "nan",
}  # fmt: skip
DURATION_RE = re.compile(r"^\d+[smhdw]$")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names, grouping labels, durations or Grafana variables."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\$\w+|\$\{\w+\}", "1m", text)  # Grafana variables ($__rate_interval)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end() :].lstrip()
        if following.startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        if text[max(match.start() - 1, 0)].isdigit():  # 1e-9, 5m
            continue
        names.add(word)
    return names


def test_metric_names_are_found_in_promql() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le) (rate(a_bucket{route="/x", s=~"5.."}[5m]))) '
        "/ clamp_min(sum(rate(b_total[$__rate_interval])), 1e-9) > 0.5 and on() max(c) == 0"
    )
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def test_dashboard_is_a_grafana_dashboard() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= 10
    for panel in panels:
        assert panel["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]) and panel["gridPos"]["w"] <= 24
        assert panel["datasource"]["uid"] == "${datasource}"
        assert panel["targets"] and all(t["expr"] and t["refId"] for t in panel["targets"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"


def test_alert_rules_are_prometheus_rules() -> None:
    rules = _alert_rules()
    assert len(rules) >= 8
    assert len({r["alert"] for r in rules}) == len(rules)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert rule["alert"].startswith("TensorRegistry") and rule["expr"].strip()
        assert DURATION_RE.match(rule.get("for", "0s")), rule["for"]
        assert rule["labels"]["severity"] in {"page", "warn"}
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


async def test_every_metric_named_exists_on_a_real_scrape(
    app: FastAPI, client: httpx.AsyncClient, settings: Settings
) -> None:
    await drive_traffic(client, app, settings)
    scraped = (await scrape(client)).names()
    named = {
        name: where
        for where, exprs in (("dashboard", _dashboard_exprs()), ("alerts", _rule_exprs()))
        for expr in exprs
        for name in metric_names(expr)
    }
    missing = {n: w for n, w in named.items() if n not in scraped and n not in SYNTHETIC}
    assert not missing, f"named but not on /metrics: {missing}"
    assert len(named) >= 12


def _rule_exprs() -> list[str]:
    return [r["expr"] for r in _alert_rules()]


def test_every_registry_metric_is_on_the_dashboard() -> None:
    import tensor_registry_server.main  # noqa: F401 - registers every metric module

    families = {
        metric.name for metric in REGISTRY.collect() if metric.name.startswith("tensor_registry_")
    }
    on_dashboard = {n for e in _dashboard_exprs() for n in metric_names(e)}
    stems = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in on_dashboard} | on_dashboard
    assert families and not families - stems, sorted(families - stems)


def test_compose_monitoring_scrapes_the_job_the_alerts_name() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["job_name"] == "tensor-registry" and job["metrics_path"] == "/metrics"
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    jobs_named = {m for r in _rule_exprs() for m in re.findall(r'job="([^"]+)"', r)}
    assert jobs_named == {"tensor-registry"}
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    [source] = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    [provider] = yaml.safe_load((provisioning / "dashboards" / "tensor-registry.yml").read_text())[
        "providers"
    ]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
