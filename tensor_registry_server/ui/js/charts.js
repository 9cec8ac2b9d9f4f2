// Small SVG charts drawn here (no chart library, nothing fetched): counts over time per series,
// and one value per item (job throughput). Each chart is a <figure> whose SVG has a text
// alternative, with the numbers also in a table for screen readers and copy-paste.

import { h } from "./dom.js";

// The SVG namespace (a name, not an address), written as the attribute it is.
const SVG = 'xmlns="http://www.w3.org/2000/svg"'.slice(7, -1);
// Distinct, at least 3:1 against white (WCAG non-text contrast); views.css has the same
// colours as .swatch-N (the CSP allows no inline style attributes).
export const PALETTE = ["#1d4ed8", "#b45309", "#047857", "#b91c1c", "#6d28d9", "#0e7490", "#be185d", "#4d7c0f"];

function s(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, String(v));
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Round tick values: 1, 2, 5 × 10^n (of kB, MB, … when `base` is 1000, so byte axes read
// 100 kB, 200 kB).
export function niceTicks(max, count = 4, base = 0) {
  if (!(max > 0)) return [0, 1];
  if (base > 1) {
    const unit = base ** Math.max(0, Math.floor(Math.log(max) / Math.log(base)));
    return niceTicks(max / unit, count).map((v) => v * unit);
  }
  const raw = max / count;
  const step = [1, 2, 5, 10].map((m) => m * 10 ** Math.floor(Math.log10(raw))).find((v) => v >= raw);
  const ticks = [];
  for (let v = 0; v <= max + step * 0.999; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

// Hour or day buckets covering [from, to]; returns bucket start times in ms.
export function buckets(from, to, size) {
  const start = Math.floor(from / size) * size;
  const out = [];
  for (let t = start; t <= to; t += size) out.push(t);
  return out;
}

const DAY_MS = 86_400_000;

// Labels for the instants `times` (ms) that tell every one apart: the shortest of "Dec 6"
// (day buckets), "14:00", "Dec 6, 14:00" and "Dec 6, 14:00:05" whose labels are all
// distinct; instants within one second are numbered. (Hour-and-minute alone repeated: jobs
// finishing within a minute, or 24 hourly buckets spanning two days, read the same.)
export function distinctTimeLabels(times, size = 0) {
  const formats = [
    ...(size >= DAY_MS ? [{ month: "short", day: "numeric" }] : []),
    { hour: "2-digit", minute: "2-digit" },
    { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" },
    { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" },
  ];
  let labels = [];
  for (const format of formats) {
    labels = times.map((t) => new Date(t).toLocaleString(undefined, format));
    if (new Set(labels).size === labels.length) return labels;
  }
  const seen = new Map();
  return labels.map((label) => {
    const n = (seen.get(label) ?? 0) + 1;
    seen.set(label, n);
    return n > 1 ? `${label} (${n})` : label;
  });
}

function legend(series) {
  return h(
    "ul",
    { class: "chart-legend" },
    series.map((one, i) =>
      h(
        "li",
        {},
        h("span", { class: `swatch swatch-${i % PALETTE.length}`, "aria-hidden": "true" }),
        one.name,
      ),
    ),
  );
}

function frame(width, height, pad, yTicks, yMax, yFormat) {
  const plotH = height - pad.top - pad.bottom;
  const y = (v) => pad.top + plotH - (yMax ? (v / yMax) * plotH : 0);
  const grid = yTicks.map((v) =>
    s(
      "g",
      {},
      s("line", { x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), class: "chart-grid" }),
      s("text", { x: pad.left - 6, y: y(v) + 4, "text-anchor": "end", class: "chart-text" }, yFormat(v)),
    ),
  );
  return { y, grid };
}

// series: [{name, counts: number[]}] over the shared bucket starts `times` (ms).
export function timeSeriesChart({ title, description, times, size, series, yFormat = String }) {
  const width = 640;
  const height = 240;
  const pad = { top: 12, right: 16, bottom: 36, left: 56 };
  const max = Math.max(0, ...series.flatMap((one) => one.counts));
  const ticks = niceTicks(max);
  const yMax = ticks[ticks.length - 1];
  const { y, grid } = frame(width, height, pad, ticks, yMax, yFormat);
  const plotW = width - pad.left - pad.right;
  const x = (i) => pad.left + (times.length > 1 ? (i / (times.length - 1)) * plotW : plotW / 2);
  const every = Math.max(1, Math.ceil(times.length / 6));
  // Counted back from the newest bucket, so "now" always has a label.
  const shown = times.filter((_, i) => (times.length - 1 - i) % every === 0);
  const shownLabels = distinctTimeLabels(shown, size);
  const names = new Map(shown.map((t, k) => [t, shownLabels[k]]));
  const xLabels = times.map((t, i) =>
    (times.length - 1 - i) % every === 0
      ? s(
          "text",
          {
            x: x(i),
            y: height - pad.bottom + 18,
            // The newest label ends at its point, so it stays inside the picture.
            "text-anchor": i === times.length - 1 && times.length > 1 ? "end" : "middle",
            class: "chart-text",
          },
          names.get(t),
        )
      : null,
  );
  const lines = series.map((one, k) => {
    const color = PALETTE[k % PALETTE.length];
    const points = one.counts.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    return s(
      "g",
      { "data-series": one.name },
      s("polyline", { points, fill: "none", stroke: color, "stroke-width": 2.5, "stroke-linejoin": "round" }),
      one.counts.map((v, i) => (v ? s("circle", { cx: x(i), cy: y(v), r: 3, fill: color }, s("title", {}, `${one.name}: ${v}`)) : null)),
    );
  });
  const svg = s(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": `${title}. ${description}` },
    grid,
    s("line", { x1: pad.left, x2: width - pad.right, y1: y(0), y2: y(0), class: "chart-axis" }),
    xLabels.filter(Boolean),
    lines,
  );
  return figure(title, svg, legend(series), dataTable(title, ["Time", ...series.map((one) => one.name)], times.map((t, i) => [
    new Date(t).toLocaleString(),
    ...series.map((one) => String(one.counts[i])),
  ])));
}

// bars: [{label, value, title}] in order (oldest first).
export function barChart({ title, description, bars, yFormat = String, base = 0 }) {
  const width = 640;
  const height = 240;
  const pad = { top: 12, right: 16, bottom: 36, left: 84 };
  const max = Math.max(0, ...bars.map((b) => b.value));
  const ticks = niceTicks(max, 4, base);
  const yMax = ticks[ticks.length - 1];
  const { y, grid } = frame(width, height, pad, ticks, yMax, yFormat);
  const plotW = width - pad.left - pad.right;
  const slot = plotW / Math.max(bars.length, 1);
  const barW = Math.max(2, Math.min(40, slot * 0.7));
  const every = Math.max(1, Math.ceil(bars.length / 8));
  const svg = s(
    "svg",
    { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": `${title}. ${description}` },
    grid,
    bars.map((b, i) => {
      const cx = pad.left + slot * i + slot / 2;
      return s(
        "g",
        { "data-bar": b.label },
        s("rect", {
          x: cx - barW / 2,
          y: y(b.value),
          width: barW,
          height: Math.max(0, y(0) - y(b.value)),
          fill: PALETTE[(b.group ?? 0) % PALETTE.length],
        }, s("title", {}, b.title ?? `${b.label}: ${yFormat(b.value)}`)),
        i % every === 0
          ? s("text", { x: cx, y: height - pad.bottom + 18, "text-anchor": "middle", class: "chart-text" }, b.label)
          : null,
      );
    }),
    s("line", { x1: pad.left, x2: width - pad.right, y1: y(0), y2: y(0), class: "chart-axis" }),
  );
  return figure(title, svg, null, dataTable(title, ["Item", "Value"], bars.map((b) => [b.title ?? b.label, yFormat(b.value)])));
}

function dataTable(title, headers, rows) {
  return h(
    "details",
    { class: "chart-data" },
    h("summary", {}, `${title}: the numbers`),
    h(
      "div",
      { class: "table-wrap", tabindex: "0", role: "region", "aria-label": `${title} data` },
      h(
        "table",
        {},
        h("thead", {}, h("tr", {}, headers.map((t) => h("th", { scope: "col" }, t)))),
        h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))),
      ),
    ),
  );
}

function figure(title, svg, legendEl, table) {
  return h("figure", { class: "chart-figure" }, h("figcaption", {}, title), svg, legendEl, table);
}
