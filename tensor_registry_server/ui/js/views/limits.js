// Limits (admin): every namespace's usage against its limits, who is near one, and a form to
// set a namespace's overrides (PUT /api/v1/namespaces/{ns}/limits).

import { api } from "../api.js";
import { announce, badge, field, formatBytes, h, problemBox, replace, table } from "../dom.js";

const NEAR = 0.9;

function share(used, limit) {
  return limit === null || limit === undefined ? null : limit === 0 ? (used > 0 ? 1 : 0) : used / limit;
}

function figure(used, limit, format) {
  const ratio = share(used, limit);
  const text = `${format(used)} of ${limit === null ? "unlimited" : format(limit)}`;
  if (ratio === null) return h("td", {}, text);
  const meter = h("meter", {
    min: "0",
    max: "1",
    low: String(NEAR * 0.8),
    high: String(NEAR),
    optimum: "0",
    value: String(Math.min(ratio, 1)),
    "aria-label": text,
  });
  return h("td", {}, text, " ", meter);
}

function state(item) {
  const ratios = [
    share(item.usage.storage_bytes, item.limits.storage_bytes),
    share(item.usage.active_jobs, item.limits.concurrent_jobs),
  ].filter((r) => r !== null);
  if (ratios.some((r) => r >= 1)) return badge("at limit");
  if (ratios.some((r) => r >= NEAR)) return badge("near limit");
  return badge("ok");
}

function count(n) {
  return String(n);
}

function limitsForm(onSaved) {
  const ns = h("input", { type: "text", name: "namespace", required: true, autocapitalize: "off", pattern: "[a-z0-9][a-z0-9._\\-]*" });
  const storage = h("input", { type: "number", name: "storage_bytes", min: "0", step: "1" });
  const upload = h("input", { type: "number", name: "upload_bytes", min: "0", step: "1" });
  const jobs = h("input", { type: "number", name: "concurrent_jobs", min: "0", step: "1" });
  const status = h("div", { class: "form-status" });
  const value = (input) => (input.value.trim() === "" ? null : Number(input.value));
  const form = h(
    "form",
    {
      class: "inline-form",
      "aria-label": "Set a namespace's limits",
      onsubmit: async (event) => {
        event.preventDefault();
        replace(status);
        try {
          await api(`/namespaces/${encodeURIComponent(ns.value.trim())}/limits`, {
            method: "PUT",
            body: { storage_bytes: value(storage), upload_bytes: value(upload), concurrent_jobs: value(jobs) },
          });
          announce(`Limits of ${ns.value.trim()} saved.`);
          onSaved();
        } catch (err) {
          replace(status, problemBox(err, { title: "The limits were not saved" }));
        }
      },
    },
    field("Namespace", ns),
    field("Storage quota (bytes)", storage, "Empty: the server's default"),
    field("Largest upload (bytes)", upload, "Empty: the server's default"),
    field("Concurrent jobs", jobs, "Empty: the server's default"),
    h("div", { class: "actions" }, h("button", { type: "submit" }, "Save limits")),
    status,
  );
  return form;
}

export async function limitsView(ctx) {
  ctx.setTitle("Limits");
  const list = h("div");
  const load = async () => {
    const page = await api("/namespaces", { signal: ctx.signal });
    const rows = page.items.map((item) =>
      h(
        "tr",
        { "data-namespace": item.namespace },
        h("th", { scope: "row" }, item.namespace),
        figure(item.usage.storage_bytes, item.limits.storage_bytes, formatBytes),
        h("td", {}, item.limits.upload_bytes === null ? "unlimited" : formatBytes(item.limits.upload_bytes)),
        figure(item.usage.active_jobs, item.limits.concurrent_jobs, count),
        h("td", {}, state(item)),
      ),
    );
    replace(
      list,
      table("Namespaces", ["Namespace", "Storage", "Largest upload", "Jobs", "State"], rows, {
        empty: "No namespace has a model or a limit yet.",
      }),
    );
  };
  ctx.root.append(
    h("h1", {}, "Limits"),
    h("p", {}, "Usage of each namespace against its limits; near means 90% or more."),
    list,
    h("h2", {}, "Set a namespace's limits"),
    limitsForm(() => load().catch(() => {})),
  );
  await load();
}
