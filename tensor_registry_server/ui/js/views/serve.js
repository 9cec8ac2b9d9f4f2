// Artifacts of a model, and for each ready one how to serve it: the resolve request, the
// `tensor-registry pull` command and the `vllm serve` command, each with a copy button.

import { api, auth, query } from "../api.js";
import {
  pullCommand as buildPullCommand,
  resolveCommand as buildResolveCommand,
  resolveParams,
  vllmCommand,
  vllmKeyfile,
} from "../commands.js";
import { badge, busy, formatBytes, h, problemBox, replace, snippet, time } from "../dom.js";

export function variantLabel(a) {
  const enc = a.encryption?.enabled ? " · encrypted" : "";
  return `v${a.version} · ${a.dtype} · ${a.format} · TP ${a.tensor_parallel_size}${enc}`;
}

function artifactSize(a) {
  if (typeof a.size === "number") return a.size;
  return (a.files ?? []).reduce((sum, f) => sum + (f.size ?? 0), 0);
}

export function resolveCommand(model, a) {
  return buildResolveCommand(location.origin, model, a);
}

export function pullCommand(model, a) {
  return buildPullCommand(location.origin, model, a);
}

function servePanel(model, a) {
  const vllmSlot = h("div", { class: "vllm-slot" });
  const show = h("button", { type: "button", class: "secondary" }, "Show the vllm serve command");
  show.addEventListener("click", () =>
    busy(show, async () => {
      show.textContent = "Resolving…";
      const params = { ...resolveParams(model, a) };
      if (a.encryption?.enabled) params.keyfile = vllmKeyfile(model, a);
      try {
        const resolved = await api(`/resolve${query(params)}`);
        replace(
          vllmSlot,
          snippet("vllm serve command", vllmCommand(model, a, resolved)),
          h(
            "p",
            { class: "hint" },
            "Run it where the pull command wrote config and tokenizer files. Its signed URLs expire at ",
            time(resolved.expires_at),
            a.encryption?.enabled ? "; the key file is written by the pull command (needs keys:read)." : ".",
          ),
        );
        show.hidden = true;
        vllmSlot.querySelector("button")?.focus();
      } catch (err) {
        replace(
          vllmSlot,
          err.missingRoute
            ? h("p", { class: "notice" }, "This server does not resolve artifacts yet.")
            : problemBox(err, { title: "Could not resolve this artifact" }),
        );
      }
    }),
  );
  return h(
    "div",
    { class: "serve" },
    h("h4", {}, "Serve it"),
    snippet("resolve request", resolveCommand(model, a)),
    snippet("pull command", pullCommand(model, a)),
    auth.has("resolve")
      ? [show, vllmSlot]
      : h("p", { class: "hint" }, "The vllm serve command needs a token with the resolve scope."),
  );
}

// Provenance and signature (issue 14, docs/trust.md): what the worker recorded in the
// artifact's stats when it signed manifest.sig.json. The browser does not check the signature
// itself; `tensor-registry verify` and every load do.
function trustRows(a) {
  const signed = (a.files ?? []).some((f) => f.path === "manifest.sig.json");
  const keyId = a.stats?.manifest_key_id;
  const rows = [
    [
      "Signature",
      signed
        ? `signed manifest (key ${keyId ? `${String(keyId).slice(0, 16)}…` : "–"})`
        : "unsigned (published before signed manifests)",
    ],
  ];
  const p = a.stats?.provenance;
  if (p) {
    const source = p.source_version ?? {};
    rows.push(["Source", `version ${source.number ?? "–"} (${(source.files ?? []).length} files)`]);
    rows.push(["Job", p.job_id ? h("a", { href: `#/jobs/${p.job_id}` }, String(p.job_id)) : "–"]);
    const tools = p.toolchain ?? {};
    const listed = ["tensorizer", "torch", "transformers", "vllm"].filter((k) => tools[k]);
    rows.push(["Toolchain", listed.map((k) => `${k} ${tools[k]}`).join(", ") || "–"]);
    rows.push(["GPU", p.gpu ? `${p.gpu.name} (compute ${p.gpu.capability})` : "none (CPU)"]);
  }
  if (a.stats?.compatibility_key) {
    rows.push(["Compatibility key", `${String(a.stats.compatibility_key).slice(0, 23)}…`]);
  }
  return rows;
}

function artifactCard(model, a) {
  const enc = a.encryption?.enabled
    ? `yes (${a.encryption.algorithm ?? "tensorizer"}, key ${a.encryption.key_id ?? "–"})`
    : "no";
  const rows = [
    ["Status", badge(a.status)],
    ["Dtype", a.dtype],
    ["Format", a.format],
    ["Tensor-parallel size", String(a.tensor_parallel_size)],
    ["Encryption", enc],
    ["Size", formatBytes(artifactSize(a))],
    ["Tensorizer", a.tensorizer_version ?? "–"],
    ["Storage", a.storage ?? "–"],
    ["Created", time(a.created_at)],
    ...trustRows(a),
  ];
  const jobLink =
    a.job_id && a.status !== "ready"
      ? h("p", {}, h("a", { href: `#/jobs/${a.job_id}` }, "Open the job"))
      : null;
  const error =
    a.status === "failed" && a.error ? h("p", { class: "problem" }, String(a.error.detail ?? a.error)) : null;
  return h(
    "article",
    { class: "card artifact", "aria-label": `Artifact ${variantLabel(a)}`, "data-artifact": a.id },
    h("h3", {}, variantLabel(a)),
    h(
      "dl",
      { class: "props" },
      rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
    ),
    jobLink,
    error,
    a.status === "ready" ? servePanel(model, a) : null,
  );
}

export async function artifactsSection(model, signal) {
  const section = h(
    "section",
    { "aria-labelledby": "artifacts-heading" },
    h("h2", { id: "artifacts-heading" }, "Artifacts"),
  );
  let page;
  try {
    page = await api(`/models/${model.id}/artifacts${query({ limit: 200 })}`, { signal });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    section.append(
      err.missingRoute
        ? h("p", { class: "notice" }, "This server does not list artifacts yet.")
        : problemBox(err),
    );
    return section;
  }
  const items = Array.isArray(page) ? page : (page.items ?? []);
  if (!items.length) {
    section.append(h("p", { class: "empty" }, "No artifacts yet. Tensorize a ready version to make one."));
  } else {
    section.append(
      h(
        "div",
        { class: "cards" },
        items.map((a) => artifactCard(model, a)),
      ),
    );
  }
  return section;
}
