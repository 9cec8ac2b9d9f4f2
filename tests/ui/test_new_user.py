"""What a new user tripped on in the web UI: "Make it" preselects the variant it sits in and is
offered only for formats a live worker can make, sizes read as the CLI prints them, and the
activity charts' x-axis labels tell their points apart."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

import pytest

from tensor_registry.cli.output import format_size
from tests.ui.conftest import Seed, Server
from tests.ui.test_pages import open_page

try:
    from playwright.sync_api import expect
except ImportError:  # the conftest skips these tests without Playwright
    expect = None

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.browser


def test_make_it_preselects_its_variant_and_vllm_needs_a_capable_worker(
    signed_in: Page, ui_server: Server, seed: Seed
) -> None:
    page = signed_in
    workers = ui_server.api.get("/workers").json()["items"]
    vllm_capable = any(
        w["capabilities"].get("versions", {}).get("vllm") and "gpu" in w["queues"] for w in workers
    )
    open_page(page, f"#/models/{seed.model_id}")
    vllm_cell = page.locator('td[data-variant="float32 vllm · TP 1"]')
    if vllm_capable:
        expect(vllm_cell.get_by_role("link", name=re.compile("Tensorize"))).to_have_count(1)
    else:
        # The embedded worker has no vLLM: the vllm column offers nothing to make.
        expect(vllm_cell).to_have_text("no worker")
        expect(vllm_cell.get_by_role("link")).to_have_count(0)
    link = page.get_by_role("link", name="Tensorize float32 hf · TP 1")
    href = link.get_attribute("href") or ""
    asked = parse_qs(href.split("?", 1)[1])
    assert asked == {
        "version": ["1"],
        "dtype": ["float32"],
        "format": ["hf"],
        "tensor_parallel_size": ["1"],
    }, href
    link.click()
    page.get_by_role("heading", level=1, name=re.compile("Tensorize")).wait_for()
    expect(page.get_by_label("Dtype")).to_have_value("float32")
    expect(page.get_by_label("Format")).to_have_value("hf")
    expect(page.get_by_label("Tensor-parallel size")).to_have_value("1")
    offered = (
        page.get_by_label("Format")
        .locator("option")
        .evaluate_all("options => options.map(o => o.value)")
    )
    assert ("vllm" in offered) == vllm_capable
    # Another cell preselects another dtype (they all went to the same form before).
    open_page(page, f"#/models/{seed.model_id}")
    page.get_by_role("link", name="Tensorize float16 hf · TP 1").click()
    page.get_by_role("heading", level=1, name=re.compile("Tensorize")).wait_for()
    expect(page.get_by_label("Dtype")).to_have_value("float16")
    if not vllm_capable:
        # Asked for by hand, vllm is refused with a reason instead of silently switched.
        open_page(page, f"#/models/{seed.model_id}/tensorize?dtype=float16&format=vllm")
        expect(page.get_by_role("alert")).to_contain_text("Not offered by the live workers: vllm")


SIZES = [0, 1, 999, 1000, 1049, 1050, 1250, 565_312, 999_949, 999_950, 183_528_849,
         7_241_000_000, 10**12 + 5 * 10**10, 3 * 10**15]  # fmt: skip


def test_sizes_read_the_same_in_the_ui_and_the_cli(page: Page, ui_server: Server) -> None:
    page.goto("/ui/")
    shown = page.evaluate(
        """async (sizes) => {
          const { formatBytes } = await import('/ui/js/dom.js');
          return sizes.map(formatBytes);
        }""",
        SIZES,
    )
    assert shown == [format_size(n) for n in SIZES]
    assert shown[7] == "565.3 kB"  # 552.0 KiB before


def test_chart_x_axis_labels_are_distinct_and_name_their_times(page: Page) -> None:
    page.goto("/ui/")
    base = datetime(2026, 12, 6, 14, 30, 5, tzinfo=UTC)
    # Three jobs that finished within one minute, one a second later, one the next day.
    finished = [base, base + timedelta(seconds=20), base + timedelta(seconds=40)]
    labels = page.evaluate(
        """async (finished) => {
          const { throughputChart } = await import('/ui/js/views/activity.js');
          const { timeSeriesChart, buckets } = await import('/ui/js/charts.js');
          const jobs = finished.map((at, i) => ({
            id: String(i), kind: 'tensorize', status: 'succeeded', started_at: at,
            finished_at: at, result: { bytes_per_second: 1e6 * (i + 1) }, params: {},
          }));
          const bars = throughputChart(jobs);
          const hour = 3600000, now = Date.parse(finished[0]);
          const times = buckets(now - 24 * hour, now, hour);
          const series = [{ name: 'm', counts: times.map(() => 1) }];
          const line = timeSeriesChart({ title: 't', description: 'd', times, size: hour, series });
          const xOf = (el) => [...el.querySelectorAll('svg > g[data-bar] > text, svg > text')]
            .map((t) => t.textContent);
          return { bars: xOf(bars), line: xOf(line), times: times.length };
        }""",
        [t.isoformat() for t in finished],
    )
    assert len(labels["bars"]) == 3 and len(set(labels["bars"])) == 3, labels
    # Each bar names its own second (the browser runs in UTC here).
    for label, at in zip(labels["bars"], finished, strict=True):
        assert at.strftime("%M:%S") in label, (label, at)
    # 24 hourly buckets spanning two days: "14:00" would come twice; the labels say the day.
    assert labels["times"] == 25
    assert len(labels["line"]) >= 5 and len(set(labels["line"])) == len(labels["line"]), labels
