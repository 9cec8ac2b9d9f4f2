// Tokens (create with scopes/namespaces, secret shown once, revoke), workers, audit log.

import { api, auth, query } from "../api.js";
import {
  announce,
  badge,
  field,
  formatBytes,
  h,
  nextId,
  problemBox,
  replace,
  showFieldErrors,
  snippet,
  splitList,
  table,
  time,
} from "../dom.js";

const SCOPES = {
  "models:read": "read models, versions, artifacts",
  "models:write": "create models, upload, finalize, move aliases",
  tensorize: "start tensorize jobs",
  resolve: "resolve artifacts to signed URLs",
  "keys:read": "receive key URLs of encrypted artifacts",
  "tokens:write": "mint tokens holding at most its own scopes, expiring no later than itself",
  admin: "everything, including tokens of others and the audit log",
};
const EXPIRY = [
  ["", "Never"],
  [String(24 * 3600), "1 day"],
  [String(7 * 24 * 3600), "7 days"],
  [String(30 * 24 * 3600), "30 days"],
  [String(90 * 24 * 3600), "90 days"],
  [String(365 * 24 * 3600), "1 year"],
];

function tokenForm(onCreated) {
  const name = h("input", { type: "text", name: "name", required: true, maxlength: "128" });
  const namespaces = h("input", {
    type: "text",
    name: "namespaces",
    autocapitalize: "off",
    placeholder: "acme, research",
  });
  const expiry = h(
    "select",
    { name: "ttl_seconds" },
    EXPIRY.map(([v, label]) => h("option", { value: v }, label)),
  );
  const boxes = Object.entries(SCOPES).map(([scope, what]) => {
    const box = h("input", {
      type: "checkbox",
      name: "scopes",
      value: scope,
      id: nextId("scope"),
      checked: scope === "models:read",
    });
    return h(
      "div",
      { class: "checkbox" },
      box,
      h("label", { for: box.id }, h("code", {}, scope), ` ${what}`),
    );
  });
  const scopeError = h("p", { class: "field-error", hidden: true, id: nextId("err") });
  const fields = {
    name: field("Name", name, "Who or what uses it, e.g. 'rollout-bot'."),
    namespaces: field("Namespaces", namespaces, "Limit the token to these namespaces; leave empty for all."),
    ttl_seconds: field("Expires", expiry),
    scopes: { setError: (m) => ((scopeError.textContent = m || ""), (scopeError.hidden = !m)) },
  };
  const messages = h("div");
  const submit = h("button", { type: "submit" }, "Create token");
  return h(
    "form",
    {
      class: "card",
      onsubmit: async (event) => {
        event.preventDefault();
        replace(messages);
        const scopes = boxes
          .map((b) => b.querySelector("input"))
          .filter((b) => b.checked)
          .map((b) => b.value);
        if (!scopes.length) {
          fields.scopes.setError("Pick at least one scope.");
          return;
        }
        const body = { name: name.value.trim(), scopes };
        const ns = splitList(namespaces.value);
        if (ns.length) body.namespaces = ns;
        if (expiry.value) body.ttl_seconds = Number(expiry.value);
        submit.disabled = true;
        try {
          const created = await api("/tokens", { method: "POST", body });
          name.value = "";
          namespaces.value = "";
          onCreated(created);
        } catch (err) {
          const rest = showFieldErrors(fields, err);
          if (err.code !== "validation_error" || rest.length)
            messages.append(problemBox(err, { title: "Could not create the token" }));
        } finally {
          submit.disabled = false;
        }
      },
    },
    h("h2", {}, "Create a token"),
    fields.name,
    h("fieldset", {}, h("legend", {}, "Scopes"), boxes, scopeError),
    fields.namespaces,
    fields.ttl_seconds,
    submit,
    messages,
  );
}

function secretOnce(created, onDone) {
  const done = h("button", { type: "button", class: "secondary" }, "I have stored it");
  const box = h(
    "section",
    { class: "success secret", "aria-labelledby": "secret-heading", tabindex: "-1" },
    h("h2", { id: "secret-heading" }, `Token "${created.name}" created`),
    h("p", {}, h("strong", {}, "Copy it now: it is shown only this once."), " Only its hash is stored."),
    snippet("token", created.token, { id: "new-token" }),
    done,
  );
  done.addEventListener("click", () => {
    box.remove();
    onDone();
  });
  return box;
}

export async function tokensView(ctx) {
  ctx.setTitle("Tokens");
  const list = h("section", { "aria-labelledby": "tokens-heading" });
  const secretSlot = h("div");
  ctx.root.append(h("h1", {}, "API tokens"), secretSlot, list);

  async function load() {
    const page = await api(`/tokens${query({ limit: 500 })}`, { signal: ctx.signal });
    const rows = page.items.map((t) => {
      const revoke = h(
        "button",
        { type: "button", class: "danger small", "aria-label": `Revoke ${t.name}` },
        "Revoke",
      );
      let armed = false;
      revoke.addEventListener("click", async () => {
        if (!armed) {
          armed = true;
          revoke.textContent = "Confirm revoke";
          revoke.setAttribute("aria-label", `Confirm: revoke ${t.name}`);
          return;
        }
        revoke.disabled = true;
        try {
          await api(`/tokens/${t.id}`, { method: "DELETE" });
          announce(`Token ${t.name} revoked`);
          if (t.id === auth.self?.id) {
            auth.signOut();
            location.reload();
            return;
          }
          await load();
        } catch (err) {
          list.append(problemBox(err, { title: `Could not revoke ${t.name}` }));
          revoke.disabled = false;
        }
      });
      return h(
        "tr",
        {},
        h("th", { scope: "row" }, t.name, t.id === auth.self?.id ? " (this session)" : ""),
        h("td", {}, h("code", {}, t.prefix)),
        h("td", {}, t.scopes.join(", ")),
        h("td", {}, t.namespaces?.length ? t.namespaces.join(", ") : "all"),
        h("td", {}, time(t.created_at)),
        h("td", {}, time(t.expires_at)),
        h("td", {}, time(t.last_used_at)),
        h("td", {}, t.revoked_at ? badge("revoked") : revoke),
      );
    });
    replace(
      list,
      h("h2", { id: "tokens-heading" }, auth.has("admin") ? "All tokens" : "Your tokens"),
      table(
        "Tokens",
        ["Name", "Prefix", "Scopes", "Namespaces", "Created", "Expires", "Last used", "Actions"],
        rows,
      ),
    );
  }

  await load();
  ctx.root.append(
    tokenForm((created) => {
      const box = secretOnce(created, () => announce("Secret dismissed"));
      replace(secretSlot, box);
      box.focus();
      load();
    }),
  );
}

function plain(value) {
  if (Array.isArray(value)) return value.map(plain).join(", ") || "none";
  if (value && typeof value === "object") {
    return Object.entries(value)
      .map(([k, v]) => `${k} ${plain(v)}`)
      .join(", ");
  }
  return value === null || value === undefined ? "–" : String(value);
}

// The heartbeat's capabilities (tensor_registry_server/jobs/capabilities.py), the well-known parts first.
function capabilityList(c = {}) {
  const { cuda, cpu, versions, formats, encryption, ...rest } = c;
  const gpus = cuda?.devices?.length
    ? cuda.devices.map((d) => `${d.name} (${formatBytes(d.total_memory)})`).join(", ")
    : "none";
  const rows = [
    ["GPUs", gpus],
    ["CPUs", cpu ? `${cpu.count ?? "–"} cores, ${formatBytes(cpu.memory_total)} memory` : "–"],
    ["Formats", plain(formats ?? [])],
    ["Encryption", encryption ? "yes" : "no"],
    ...Object.entries(versions ?? {}).map(([name, v]) => [name, v ?? "not installed"]),
    ...Object.entries(rest).map(([k, v]) => [k, plain(v)]),
  ];
  return h(
    "dl",
    { class: "props compact" },
    rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
  );
}

export async function workersView(ctx) {
  ctx.setTitle("Workers");
  ctx.root.append(h("h1", {}, "Workers"));
  let page;
  try {
    page = await api("/workers", { signal: ctx.signal });
  } catch (err) {
    if (!err.missingRoute) throw err;
    ctx.root.append(h("p", { class: "notice" }, "This server does not report workers yet."));
    return;
  }
  const workers = Array.isArray(page) ? page : (page.items ?? []);
  if (!workers.length) {
    ctx.root.append(
      h("p", { class: "notice" }, "No live worker. Tensorize jobs wait in the queue until one connects."),
    );
    return;
  }
  ctx.root.append(
    h(
      "div",
      { class: "cards" },
      workers.map((w) =>
        h(
          "article",
          { class: "card", "aria-label": `Worker ${w.hostname ?? w.id}` },
          h("h2", {}, w.hostname ?? w.id),
          h(
            "dl",
            { class: "props" },
            h("dt", {}, "Id"),
            h("dd", {}, h("code", {}, w.id ?? "–")),
            h("dt", {}, "Queues"),
            h("dd", {}, (w.queues ?? []).join(", ") || "–"),
            h("dt", {}, "State"),
            h("dd", {}, badge(w.live === false ? "stale" : "live")),
            h("dt", {}, "Last heartbeat"),
            h("dd", {}, time(w.last_seen_at)),
            h("dt", {}, "Started"),
            h("dd", {}, time(w.started_at)),
          ),
          h("h3", {}, "Capabilities"),
          capabilityList(w.capabilities),
        ),
      ),
    ),
  );
}

// Audit actions the server writes, for the filter's suggestions.
const AUDIT_ACTIONS = [
  "resolve", "key.issue", "key.fetch", "tensorize.request", "alias.set", "alias.delete",
  "model.create", "model.update", "model.delete", "version.create", "version.finalize",
  "version.import", "version.delete", "version.file.upload", "version.file.delete",
  "artifact.register", "artifact.delete", "job.cancel", "token.create", "token.revoke",
  "token.bootstrap",
];

function detailValue(value) {
  if (value === true) return "yes";
  if (value === false) return "no";
  if (Array.isArray(value)) return value.map(detailValue).join(", ") || "none";
  if (value && typeof value === "object")
    return Object.entries(value)
      .map(([k, v]) => `${k}=${detailValue(v)}`)
      .join(", ");
  return String(value);
}

// One line that says what happened, for the actions people look for most; the rest of the
// detail follows as labelled values.
function auditSummary(e) {
  const d = e.detail ?? {};
  const variant = [d.filters?.dtype ?? d.dtype, d.filters?.format ?? d.format].filter(Boolean).join(" ");
  switch (e.action) {
    case "resolve":
      return `Resolved ${d.ref ?? "latest"} to version ${d.version ?? "–"}${variant ? ` (${variant})` : ""}${d.cached ? ", from cache" : ""}`;
    case "alias.set":
      return `Moved ${d.alias ?? "alias"}${d.from_version ? ` from version ${d.from_version}` : ""} to version ${d.to_version ?? d.version ?? "–"}`;
    case "alias.delete":
      return `Deleted alias ${d.alias ?? ""}`;
    case "tensorize.request":
      return `Asked for ${variant || "a variant"} of version ${d.version ?? "–"}`;
    case "key.issue":
      return `Issued a key URL for version ${d.version ?? "–"}`;
    case "key.fetch":
      return `Key fetched for version ${d.version ?? "–"}`;
    case "version.finalize":
      return `Finalized version ${d.version ?? "–"}`;
    default:
      return null;
  }
}

const SUMMARY_KEYS = {
  resolve: ["ref", "version", "filters", "cached"],
  "alias.set": ["alias", "from_version", "to_version", "version"],
  "alias.delete": ["alias"],
  "tensorize.request": ["version", "dtype", "format"],
  "key.issue": ["version"],
  "key.fetch": ["version"],
  "version.finalize": ["version"],
};

function auditDetail(e) {
  const summary = auditSummary(e);
  const skip = new Set(summary ? (SUMMARY_KEYS[e.action] ?? []) : []);
  const rest = Object.entries(e.detail ?? {}).filter(
    ([k, v]) => !skip.has(k) && v !== null && v !== undefined && v !== "",
  );
  return h(
    "td",
    { class: "detail" },
    summary ? h("p", { class: "audit-summary" }, summary) : null,
    rest.length
      ? h(
          "dl",
          { class: "props compact" },
          rest.map(([k, v]) => [h("dt", {}, k.replace(/_/g, " ")), h("dd", {}, detailValue(v))]),
        )
      : summary
        ? null
        : "–",
  );
}

function auditTarget(e) {
  const id = e.target_id ?? "";
  if (e.target_type === "job" && id) return h("a", { href: `#/jobs/${id}` }, `job ${id.slice(0, 8)}`);
  return `${e.target_type}${id ? ` ${id.slice(0, 8)}` : ""}`;
}

export async function auditView(ctx) {
  ctx.setTitle("Audit log");
  const action = ctx.query.get("action") ?? "";
  const model = ctx.query.get("model") ?? "";
  const cursor = ctx.query.get("cursor") ?? "";
  const actionInput = h("input", {
    type: "text",
    name: "action",
    value: action,
    placeholder: "alias.set",
    autocapitalize: "off",
    list: "audit-actions",
  });
  const modelInput = h("input", {
    type: "text",
    name: "model",
    value: model,
    placeholder: "acme/llama",
    autocapitalize: "off",
  });
  ctx.root.append(
    h("h1", {}, "Audit log"),
    h(
      "form",
      {
        class: "inline-form",
        role: "search",
        "aria-label": "Filter the audit log",
        onsubmit: (event) => {
          event.preventDefault();
          ctx.navigate(
            `/audit${query({ action: actionInput.value.trim(), model: modelInput.value.trim() })}`,
          );
        },
      },
      h("datalist", { id: "audit-actions" }, AUDIT_ACTIONS.map((a) => h("option", { value: a }))),
      field("Action", actionInput),
      field("Model", modelInput),
      h(
        "div",
        { class: "actions" },
        h("button", { type: "submit" }, "Filter"),
        action || model ? h("a", { href: "#/audit", class: "button-link secondary" }, "Clear filters") : null,
      ),
    ),
  );
  const page = await api(`/audit${query({ action, model, cursor, limit: 50 })}`, { signal: ctx.signal });
  const rows = page.items.map((e) =>
    h(
      "tr",
      { "data-action": e.action },
      h("td", {}, time(e.created_at)),
      h(
        "th",
        { scope: "row" },
        h("a", { href: `#/audit${query({ action: e.action, model })}`, title: "Show only this action" }, e.action),
      ),
      h("td", {}, e.actor_name ?? "system"),
      h(
        "td",
        {},
        e.model
          ? h("a", { href: `#/audit${query({ action, model: e.model })}`, title: "Show only this model" }, e.model)
          : "–",
      ),
      h("td", {}, auditTarget(e)),
      auditDetail(e),
    ),
  );
  ctx.root.append(
    table("Audit events", ["When", "Action", "Who", "Model", "Target", "What"], rows, {
      empty: "No events match.",
    }),
    h(
      "nav",
      { class: "pager", "aria-label": "Pages" },
      cursor ? h("a", { href: `#/audit${query({ action, model })}` }, "Newest") : null,
      page.next_cursor
        ? h(
            "a",
            { href: `#/audit${query({ action, model, cursor: page.next_cursor })}`, rel: "next" },
            "Older events",
          )
        : null,
    ),
  );
}
