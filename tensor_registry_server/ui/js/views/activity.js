// Activity: resolves and key fetches per model over time, read from the audit log (admin), and
// tensorize throughput of finished jobs. Drawn as SVG by js/charts.js; nothing is fetched from
// outside. Blob downloads are not audited (they are the hot path), so "loads" here are what the
// audit log sees: resolves, and key fetches of encrypted artifacts.

import { api, auth, query } from "../api.js";
import { barChart, buckets, distinctTimeLabels, timeSeriesChart } from "../charts.js";
import { append, field, formatBytes, h, problemBox } from "../dom.js";

const HOUR = 3_600_000;
const DAY = 24 * HOUR;
export const RANGES = {
  "24h": { label: "Last 24 hours", span: DAY, size: HOUR },
  "7d": { label: "Last 7 days", span: 7 * DAY, size: DAY },
  "30d": { label: "Last 30 days", span: 30 * DAY, size: DAY },
};
// At most this many audit rows are read per chart (newest first): 4 pages of 500.
const MAX_PAGES = 4;
const TOP_MODELS = 6;

async function eventsSince(action, since, { model, signal }) {
  const out = [];
  let cursor = null;
  for (let pageNo = 0; pageNo < MAX_PAGES; pageNo += 1) {
    const page = await api(`/audit${query({ action, model, cursor, limit: 500 })}`, { signal });
    for (const e of page.items) {
      if (Date.parse(e.created_at) < since) return { events: out, truncated: false };
      out.push(e);
    }
    cursor = page.next_cursor;
    if (!cursor) return { events: out, truncated: false };
  }
  return { events: out, truncated: true };
}

// Counts per model per bucket; models beyond the busiest TOP_MODELS are summed as "others".
export function countPerModel(events, times, size) {
  const index = new Map(times.map((t, i) => [t, i]));
  const perModel = new Map();
  for (const e of events) {
    const bucket = Math.floor(Date.parse(e.created_at) / size) * size;
    const i = index.get(bucket);
    if (i === undefined) continue;
    const name = e.model ?? "(no model)";
    if (!perModel.has(name)) perModel.set(name, new Array(times.length).fill(0));
    perModel.get(name)[i] += 1;
  }
  const ranked = [...perModel.entries()].sort(
    (a, b) => b[1].reduce((x, y) => x + y, 0) - a[1].reduce((x, y) => x + y, 0),
  );
  const series = ranked.slice(0, TOP_MODELS).map(([name, counts]) => ({ name, counts }));
  if (ranked.length > TOP_MODELS) {
    const others = new Array(times.length).fill(0);
    for (const [, counts] of ranked.slice(TOP_MODELS)) counts.forEach((v, i) => (others[i] += v));
    series.push({ name: `${ranked.length - TOP_MODELS} other models`, counts: others });
  }
  return series;
}

async function perModelChart({ action, title, noun, range, model, signal }) {
  const { span, size, label } = RANGES[range];
  const now = Date.now();
  const since = now - span;
  const { events, truncated } = await eventsSince(action, since, { model, signal });
  const times = buckets(since, now, size);
  const series = countPerModel(events, times, size);
  const wrap = h("div", { class: "chart-block", "data-chart": action });
  if (!series.length) {
    wrap.append(h("h3", {}, title), h("p", { class: "empty" }, `No ${noun} in the ${label.toLowerCase()}.`));
    return wrap;
  }
  const total = events.length;
  append(wrap, [
    timeSeriesChart({
      title,
      description: `${total} ${noun} in the ${label.toLowerCase()}, per ${size === HOUR ? "hour" : "day"}, ${series
        .map((one) => `${one.name}: ${one.counts.reduce((x, y) => x + y, 0)}`)
        .join("; ")}.`,
      times,
      size,
      series,
    }),
    truncated ? h("p", { class: "hint" }, `Only the newest ${total} ${noun} are drawn.`) : null,
  ]);
  return wrap;
}

// Resolves of one model over the last 7 days (the model page, for admins).
export async function activityChart({ model, signal }) {
  const section = h(
    "section",
    { "aria-labelledby": "activity-heading" },
    h("h2", { id: "activity-heading" }, "Activity"),
  );
  try {
    section.append(
      await perModelChart({ action: "resolve", title: "Resolves per day", noun: "resolves", range: "7d", model, signal }),
    );
  } catch (err) {
    if (err.name === "AbortError") throw err;
    section.append(problemBox(err, { title: "Could not read the audit log" }));
  }
  return section;
}

export function jobRate(job) {
  const result = job.result ?? {};
  if (Number(result.bytes_per_second) > 0) return Number(result.bytes_per_second);
  const p = job.progress ?? {};
  const started = Date.parse(job.started_at ?? "");
  if (!Number.isFinite(started)) return null;
  const end = job.finished_at ? Date.parse(job.finished_at) : Date.now();
  const seconds = (end - started) / 1000;
  const bytes = Number(p.bytes_done ?? 0);
  return seconds > 0 && bytes > 0 ? bytes / seconds : null;
}

// Throughput of finished jobs, oldest first.
export function throughputChart(jobs) {
  const done = jobs
    .filter((j) => j.status === "succeeded" && jobRate(j))
    .sort((a, b) => String(a.finished_at).localeCompare(String(b.finished_at)));
  if (!done.length) return h("p", { class: "empty" }, "No finished job with a measured throughput yet.");
  const kinds = [...new Set(done.map((j) => j.kind))];
  const labels = distinctTimeLabels(done.map((j) => Date.parse(j.finished_at)));
  return barChart({
    title: "Throughput of finished jobs",
    description: `${done.length} jobs, oldest first; fastest ${formatBytes(Math.max(...done.map(jobRate)))}/s.`,
    bars: done.map((j, i) => ({
      label: labels[i],
      value: jobRate(j),
      group: kinds.indexOf(j.kind),
      title: `${j.kind} ${j.model_name ?? ""} ${j.variant?.dtype ?? ""}: ${formatBytes(jobRate(j))}/s`.replace(/\s+/g, " "),
    })),
    yFormat: (v) => `${formatBytes(v)}/s`,
    base: 1000,
  });
}

export async function activityView(ctx) {
  ctx.setTitle("Activity");
  const range = RANGES[ctx.query.get("range")] ? ctx.query.get("range") : "7d";
  const select = h(
    "select",
    { name: "range", onchange: (event) => ctx.navigate(`/activity${query({ range: event.target.value })}`) },
    Object.entries(RANGES).map(([value, r]) => h("option", { value, selected: value === range }, r.label)),
  );
  ctx.root.append(
    h("h1", {}, "Activity"),
    h(
      "p",
      { class: "hint" },
      "From the audit log: every resolve, and every key fetch of an encrypted artifact (a node loading it). Signed blob downloads are not audited.",
    ),
    h("form", { class: "inline-form", "aria-label": "Choose the period" }, field("Time range", select)),
  );
  if (!auth.has("admin")) {
    ctx.root.append(h("p", { class: "notice" }, "The audit log, and so these charts, need an admin token."));
  } else {
    ctx.root.append(
      h("h2", {}, "Resolves per model"),
      await perModelChart({ action: "resolve", title: "Resolves per model", noun: "resolves", range, signal: ctx.signal }),
      h("h2", {}, "Loads of encrypted artifacts"),
      await perModelChart({ action: "key.fetch", title: "Key fetches per model", noun: "key fetches", range, signal: ctx.signal }),
    );
  }
  const jobs = await api(`/jobs${query({ status: "succeeded", limit: 100 })}`, { signal: ctx.signal });
  ctx.root.append(h("h2", {}, "Job throughput"), throughputChart(jobs.items));
}
