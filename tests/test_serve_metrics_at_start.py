"""A freshly started `serve` exports its counters at 0 before any traffic (issue 26 §7.9):
rate() and absent-series alerts work from the first scrape, and no model name is among them."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness.serve_process import ServeProcess, free_port


def test_counters_are_exported_at_zero_from_the_start(tmp_path: Path) -> None:
    server = ServeProcess(data_dir=tmp_path / "data", port=free_port()).start()
    try:
        text = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    expected = [
        ("tensor_registry_resolves_total", (("cache", "off"), ("model", "all"))),
        ("tensor_registry_key_issues_total", (("model", "all"),)),
        ("tensor_registry_blob_bytes_served_total", (("storage", "local"),)),
        ("tensor_registry_blob_responses_total", (("status", "499"), ("storage", "local"))),
        ("tensor_registry_signed_url_failures_total", (("purpose", "blob"), ("reason", "expired"))),
        ("tensor_registry_jobs_finished_total", (("kind", "tensorize"), ("state", "failed"))),
        ("tensor_registry_upload_bytes_total", ()),
        ("tensor_registry_job_oldest_running_seconds", (("kind", "tensorize"),)),
        ("tensor_registry_job_progress_age_seconds", (("kind", "import"),)),
    ]
    for key in expected:
        assert samples.get(key) == 0.0, (key, samples.get(key))
