// Jobs: every job the token may see, filtered by kind, status and model, refreshed while any
// is queued or running, with progress, throughput and time left (or taken), and a chart of
// the throughput of finished jobs.

import { api, query } from "../api.js";
import { badge, field, formatBytes, formatDuration, h, replace, table, time } from "../dom.js";
import { jobRate, throughputChart } from "./activity.js";

const KINDS = ["tensorize", "import", "verify"];
const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"];
const ACTIVE = new Set(["queued", "running"]);
const PAGE_SIZE = 50;
const REFRESH_MS = 2000;
const IDLE_REFRESH_MS = 5000;

export function jobEta(job) {
  if (!ACTIVE.has(job.status)) return null;
  const p = job.progress ?? {};
  const rate = jobRate(job);
  const total = Number(p.bytes_total ?? 0);
  return rate && total ? Math.max(0, (total - Number(p.bytes_done ?? 0)) / rate) : null;
}

// What a job makes, from its artifact's typed variant: "v1 bfloat16 · hf · TP 1 · encrypted"
// (tensorize, verify); "–" for an import, or once the artifact is gone.
export function jobMakes(job) {
  const v = job.variant;
  if (!v) return "–";
  const label = [v.dtype, v.format, `TP ${v.tensor_parallel_size}`, v.encrypted ? "encrypted" : null]
    .filter(Boolean)
    .join(" · ");
  return `v${v.version} ${label}`;
}

function took(job) {
  if (!job.started_at || !job.finished_at) return null;
  return (Date.parse(job.finished_at) - Date.parse(job.started_at)) / 1000;
}

function progressCell(job) {
  const p = job.progress ?? {};
  const total = Number(p.bytes_total ?? 0);
  const done = Number(p.bytes_done ?? 0);
  if (!total) return h("td", {}, p.stage ?? "–", done ? ` · ${formatBytes(done)}` : "");
  const ratio = job.status === "succeeded" ? 1 : Math.min(1, done / total);
  return h(
    "td",
    {},
    h("progress", { max: "1", value: String(ratio), "aria-label": `Job ${job.id.slice(0, 8)} progress` }),
    ` ${Math.floor(ratio * 100)}% · ${p.stage ?? "–"}`,
  );
}

// The rate beside "took N s": a finished job's bytes over that same duration, so the two agree
// (the worker's own figure covers its writing alone; the job's page and chart show that one).
export function shownRate(job) {
  const spent = took(job);
  const bytes = Number(job.progress?.bytes_done ?? 0);
  if (!ACTIVE.has(job.status) && spent > 0 && bytes > 0) return bytes / spent;
  return jobRate(job);
}

function row(job) {
  const rate = shownRate(job);
  const eta = jobEta(job);
  const spent = took(job);
  return h(
    "tr",
    { "data-job": job.id, "data-status": job.status },
    h("th", { scope: "row" }, h("a", { href: `#/jobs/${job.id}`, "aria-label": `Job ${job.id}` }, h("code", {}, job.id.slice(0, 8)))),
    h("td", {}, job.kind),
    h("td", {}, job.model_id ? h("a", { href: `#/models/${job.model_id}` }, job.model_name ?? job.model_id.slice(0, 8)) : "–"),
    h("td", {}, badge(job.status)),
    h("td", { "data-cell": "makes" }, jobMakes(job)),
    h("td", { "data-cell": "storage" }, job.variant?.storage ?? "–"),
    progressCell(job),
    h("td", { class: "num", "data-cell": "throughput" }, rate ? `${formatBytes(rate)}/s` : "–"),
    h(
      "td",
      { class: "num", "data-cell": "time" },
      eta !== null ? `${formatDuration(eta)} left` : spent !== null ? `took ${formatDuration(spent)}` : "–",
    ),
    h("td", {}, time(job.created_at)),
  );
}

export async function jobsView(ctx) {
  ctx.setTitle("Jobs");
  const kind = KINDS.includes(ctx.query.get("kind")) ? ctx.query.get("kind") : "";
  const status = STATUSES.includes(ctx.query.get("status")) ? ctx.query.get("status") : "";
  const modelId = ctx.query.get("model_id") ?? "";
  const cursor = ctx.query.get("cursor") ?? "";
  const select = (name, values, current) =>
    h(
      "select",
      { name },
      h("option", { value: "" }, "any"),
      values.map((v) => h("option", { value: v, selected: v === current }, v)),
    );
  const kindSelect = select("kind", KINDS, kind);
  const statusSelect = select("status", STATUSES, status);
  const listing = h("section", { "aria-labelledby": "jobs-heading", "aria-busy": "true" });
  const chart = h("section", { "aria-labelledby": "throughput-heading" });
  const note = h("p", { class: "hint", role: "status" });
  ctx.root.append(
    h("h1", {}, "Jobs"),
    h(
      "form",
      {
        class: "inline-form filters",
        role: "search",
        "aria-label": "Filter jobs",
        onsubmit: (event) => {
          event.preventDefault();
          ctx.navigate(`/jobs${query({ kind: kindSelect.value, status: statusSelect.value, model_id: modelId })}`);
        },
      },
      field("Kind", kindSelect),
      field("Status", statusSelect),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "submit" }, "Filter"),
        kind || status || modelId ? h("a", { href: "#/jobs", class: "button-link secondary" }, "Clear filters") : null,
      ),
    ),
    note,
    listing,
    chart,
  );

  let model = null;
  if (modelId) model = await api(`/models/${modelId}`, { signal: ctx.signal }).catch(() => null);

  async function load() {
    const page = await api(
      `/jobs${query({ kind, status, model_id: modelId, cursor, limit: PAGE_SIZE })}`,
      { signal: ctx.signal },
    );
    listing.removeAttribute("aria-busy");
    // A refresh redraws the table: keep keyboard focus on the same job's link.
    const focusedJob = listing.contains(document.activeElement)
      ? document.activeElement.closest("tr[data-job]")?.dataset.job
      : null;
    replace(
      listing,
      h("h2", { id: "jobs-heading" }, model ? `Jobs of ${model.name}` : kind || status ? "Matching jobs" : "All jobs"),
      table("Jobs", ["Job", "Kind", "Model", "Status", "Makes", "Storage", "Progress", "Throughput", "Time", "Created"], page.items.map(row), {
        empty: kind || status || modelId ? "No job matches these filters." : "No jobs yet.",
      }),
      h(
        "nav",
        { class: "pager", "aria-label": "Pages" },
        cursor ? h("a", { href: `#/jobs${query({ kind, status, model_id: modelId })}` }, "Newest") : null,
        page.next_cursor
          ? h("a", { href: `#/jobs${query({ kind, status, model_id: modelId, cursor: page.next_cursor })}`, rel: "next" }, "Older jobs")
          : null,
      ),
    );
    if (focusedJob) listing.querySelector(`tr[data-job="${focusedJob}"] a`)?.focus();
    replace(chart, h("h2", { id: "throughput-heading" }, "Throughput"), throughputChart(page.items));
    return page.items.some((j) => ACTIVE.has(j.status));
  }

  // The newest page stays live (new jobs appear, running ones move: every 2 s while one runs,
  // every 5 s otherwise); older pages hold still. Leaving the page stops it.
  let active = await load();
  if (cursor) return;
  note.textContent = "This list refreshes itself.";
  (async () => {
    while (!ctx.signal.aborted) {
      await new Promise((resolve) => setTimeout(resolve, active ? REFRESH_MS : IDLE_REFRESH_MS));
      if (ctx.signal.aborted) return;
      try {
        active = await load();
      } catch (err) {
        if (err.name === "AbortError") return;
        note.textContent = `Refresh stopped: ${err.message}`;
        return;
      }
    }
  })();
}
