// One model, laid out like a Hugging Face / MLflow model page: facts of the shown version
// (architecture, parameters, size), its model card (README.md, rendered as safe Markdown), the
// tensor dtype breakdown, a file browser, the variants as a matrix, then all versions, aliases
// with history, the artifacts with their serve commands, details, and deletes that ask first.

import { api, auth, filePath, query, readText, request } from "../api.js";
import {
  announce,
  append,
  badge,
  className,
  confirmButton,
  crumbs,
  field,
  formatBytes,
  formatCount,
  h,
  problemBox,
  replace,
  showFieldErrors,
  splitList,
  table,
  time,
} from "../dom.js";
import { renderMarkdown, splitFrontMatter } from "../markdown.js";
import { activityChart } from "./activity.js";
import { artifactsSection, variantLabel } from "./serve.js";
import { FORMATS } from "../vocabulary.js";
import { DTYPES, liveWorkers, makeableFormats } from "./tensorize.js";

// A card bigger than this is not fetched into the page.
const CARD_LIMIT = 1024 * 1024;

async function allVersions(modelId, signal) {
  const items = [];
  let cursor = null;
  do {
    const page = await api(`/models/${modelId}/versions${query({ cursor, limit: 500 })}`, { signal });
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor);
  return items;
}

function detailsSection(state) {
  const section = h("section", { "aria-labelledby": "details-heading" });
  const render = () => {
    const { model } = state;
    const description = h("textarea", {
      name: "description",
      rows: "4",
      maxlength: "10000",
      value: model.description,
    });
    const tags = h("input", {
      type: "text",
      name: "tags",
      value: model.tags.join(", "),
      autocapitalize: "off",
    });
    const fields = {
      description: field("Description", description),
      tags: field("Tags", tags, "Separated by commas or spaces."),
    };
    const messages = h("div");
    const save = h("button", { type: "submit" }, "Save details");
    const form = h(
      "form",
      {
        class: "card",
        onsubmit: async (event) => {
          event.preventDefault();
          replace(messages);
          save.disabled = true;
          try {
            state.model = await api(`/models/${model.id}`, {
              method: "PATCH",
              headers: { "If-Match": model.etag },
              body: { description: description.value, tags: splitList(tags.value) },
            });
            announce("Details saved");
            render();
            state.refreshHeader();
          } catch (err) {
            if (err.status === 412) {
              state.model = await api(`/models/${model.id}`);
              render();
              state.refreshHeader();
              section
                .querySelector(".messages")
                .append(
                  h(
                    "p",
                    { class: "problem", role: "alert" },
                    "Someone else changed this model while you were editing. The form now shows their version; your changes were not saved.",
                  ),
                );
              return;
            }
            const rest = showFieldErrors(fields, err);
            if (err.code !== "validation_error" || rest.length)
              messages.append(problemBox(err, { title: "Could not save" }));
          } finally {
            save.disabled = false;
          }
        },
      },
      Object.values(fields),
      save,
    );
    messages.className = "messages";
    replace(
      section,
      h("h2", { id: "details-heading" }, "Details"),
      auth.has("models:write") ? [form, messages] : h("p", {}, model.description || "No description."),
    );
  };
  render();
  return section;
}

function versionsSection(state) {
  const { model, versions } = state;
  const rows = [...versions]
    .sort((a, b) => b.version - a.version)
    .map((v) => {
      let action = null;
      if (v.status === "draft")
        action = h(
          "a",
          { href: `#/models/${model.id}/publish/${v.version}` },
          `Continue version ${v.version}`,
        );
      else if (v.status === "ready")
        action = h(
          "a",
          { href: `#/models/${model.id}/tensorize${query({ version: v.version })}` },
          `Tensorize version ${v.version}`,
        );
      else if (v.job_id) action = h("a", { href: `#/jobs/${v.job_id}` }, "Open the import job");
      const pointing = state.aliases.items.filter((a) => a.version === v.version).map((a) => a.alias);
      const remove =
        auth.has("models:write") && v.status !== "importing"
          ? confirmButton("Delete", `version ${v.version}`, async () => {
              try {
                await request(`/models/${model.id}/versions/${v.version}`, { method: "DELETE" });
                announce(`Version ${v.version} deleted`);
                state.reload(v.version === state.shown?.version ? null : state.shown?.version);
              } catch (err) {
                state.messages(problemBox(err, { title: `Could not delete version ${v.version}` }));
              }
            })
          : null;
      return h(
        "tr",
        { "data-version": String(v.version) },
        h(
          "th",
          { scope: "row" },
          v.version === state.shown?.version
            ? h("span", { "aria-current": "true" }, `${v.version} (shown)`)
            : h("a", { href: `#/models/${model.id}${query({ version: v.version })}` }, `Show version ${v.version}`),
        ),
        h("td", {}, badge(v.status)),
        h("td", {}, String(v.files.length)),
        h("td", { class: "num" }, formatBytes(v.size)),
        h("td", {}, pointing.length ? pointing.join(", ") : "–"),
        h("td", {}, time(v.created_at)),
        h("td", {}, action ?? "–", remove ? [" ", remove] : null),
      );
    });
  return h(
    "section",
    { "aria-labelledby": "versions-heading" },
    h("h2", { id: "versions-heading" }, "Versions"),
    table("Versions", ["Version", "Status", "Files", "Size", "Aliases", "Created", "Actions"], rows, {
      empty: "No versions yet. Publish the first one.",
    }),
  );
}

function historyList(events) {
  if (!events.length) return h("p", { class: "empty" }, "No moves recorded.");
  return h(
    "ol",
    { class: "history" },
    events.map((e) =>
      h(
        "li",
        {},
        time(e.created_at),
        ` ${e.alias}: `,
        e.from_version === null ? "created at " : `${e.from_version} → `,
        e.to_version === null ? "deleted" : `version ${e.to_version}`,
        e.actor ? ` by ${e.actor}` : "",
      ),
    ),
  );
}

function aliasesSection(state) {
  const section = h("section", { "aria-labelledby": "aliases-heading", class: "aliases" });
  const messages = h("div", { class: "messages" });

  async function move(name, version, etag) {
    const headers = etag ? { "If-Match": etag } : {};
    return api(`/models/${state.model.id}/aliases/${encodeURIComponent(name)}`, {
      method: "PUT",
      headers,
      body: { version },
    });
  }

  async function reload() {
    state.aliases = await api(`/models/${state.model.id}/aliases`);
    render();
    state.aliasesChanged?.();
  }

  // 412: someone moved the alias since this page loaded. Show where it points now and let
  // the user choose, instead of overwriting their move silently.
  async function conflict(name, wanted) {
    await reload();
    const current = state.aliases.items.find((a) => a.alias === name);
    const retry = h("button", { type: "button" }, `Move ${name} to version ${wanted} anyway`);
    const keep = h(
      "button",
      { type: "button", class: "secondary" },
      `Keep version ${current?.version ?? "–"}`,
    );
    const box = h(
      "div",
      { class: "problem", role: "alert" },
      h("p", { class: "problem-title" }, `${name} was moved by someone else`),
      h(
        "p",
        {},
        `While you were looking, ${name} moved to version ${current?.version ?? "(deleted)"}. Your move to version ${wanted} was not applied.`,
      ),
      h("div", { class: "actions" }, retry, keep),
    );
    retry.addEventListener("click", async () => {
      retry.disabled = true;
      try {
        await move(name, wanted, current?.etag);
        await reload();
        announce(`${name} now points at version ${wanted}`);
      } catch (err) {
        if (err.status === 412) return conflict(name, wanted);
        replace(messages, problemBox(err, { title: "Could not move the alias" }));
      }
    });
    keep.addEventListener("click", () => {
      replace(messages);
      section.querySelector("select")?.focus();
    });
    replace(messages, box);
    retry.focus();
  }

  function render() {
    const items = state.aliases.items;
    const ready = state.versions.filter((v) => v.status === "ready").sort((a, b) => b.version - a.version);
    const rows = items.map((a) =>
      h(
        "tr",
        { "data-alias": a.alias },
        h("th", { scope: "row" }, a.alias),
        h("td", { class: "points-at" }, `version ${a.version}`),
        h(
          "td",
          {},
          h(
            "a",
            { href: `#/models/${state.model.id}/aliases/${encodeURIComponent(a.alias)}/rollout` },
            `${a.alias} rollout`,
          ),
        ),
        h("td", {}, time(a.updated_at)),
        h(
          "td",
          {},
          h("details", {}, h("summary", {}, `History (${a.history.length})`), historyList(a.history)),
        ),
        auth.has("models:write")
          ? h(
              "td",
              {},
              confirmButton("Delete", `alias ${a.alias}`, async () => {
                try {
                  await request(`/models/${state.model.id}/aliases/${encodeURIComponent(a.alias)}`, {
                    method: "DELETE",
                    headers: a.etag ? { "If-Match": a.etag } : {},
                  });
                  await reload();
                  announce(`Alias ${a.alias} deleted`);
                } catch (err) {
                  if (err.status === 412) await reload();
                  replace(messages, problemBox(err, { title: `Could not delete ${a.alias}` }));
                }
              }),
            )
          : null,
      ),
    );
    const nameInput = h("input", {
      type: "text",
      name: "alias",
      list: "alias-names",
      required: true,
      autocapitalize: "off",
      placeholder: "prod",
    });
    const versionSelect = h(
      "select",
      { name: "version", required: true },
      ready.map((v) => h("option", { value: String(v.version) }, `version ${v.version}`)),
    );
    const fields = {
      alias: field("Alias", nameInput, "An existing alias or a new name."),
      version: field("Version", versionSelect),
    };
    const submit = h("button", { type: "submit", disabled: !ready.length }, "Move alias");
    const form = h(
      "form",
      {
        class: "card inline-form",
        "aria-label": "Move an alias",
        onsubmit: async (event) => {
          event.preventDefault();
          replace(messages);
          const name = nameInput.value.trim();
          const version = Number(versionSelect.value);
          const current = state.aliases.items.find((a) => a.alias === name);
          submit.disabled = true;
          try {
            await move(name, version, current?.etag);
            await reload();
            announce(`${name} now points at version ${version}`);
          } catch (err) {
            if (err.status === 412) await conflict(name, version);
            else {
              const rest = showFieldErrors(fields, err);
              if (err.code === "invalid_alias" || err.code === "alias_reserved")
                fields.alias.setError(err.message);
              else if (err.code !== "validation_error" || rest.length)
                replace(messages, problemBox(err, { title: "Could not move the alias" }));
            }
          } finally {
            submit.disabled = !ready.length;
          }
        },
      },
      h(
        "datalist",
        { id: "alias-names" },
        items.map((a) => h("option", { value: a.alias })),
      ),
      Object.values(fields),
      h("div", { class: "actions" }, submit),
    );
    replace(
      section,
      h("h2", { id: "aliases-heading" }, "Aliases"),
      h("p", { class: "hint" }, "latest always means the highest ready version."),
      table(
        "Aliases",
        ["Alias", "Points at", "Fleet", "Moved", "History", ...(auth.has("models:write") ? ["Actions"] : [])],
        rows,
        { empty: "No aliases yet." },
      ),
      auth.has("models:write")
        ? ready.length
          ? form
          : h("p", { class: "hint" }, "Aliases point at ready versions; finalize a version first.")
        : null,
      messages,
    );
  }

  render();
  return section;
}

function factsList(state) {
  const v = state.shown;
  const ready = state.artifacts.filter((a) => a.status === "ready" && a.version === v?.version);
  const pointing = state.aliases.items.filter((a) => a.version === v?.version).map((a) => a.alias);
  const facts = [
    ["Version", v ? [`${v.version} `, badge(v.status)] : "–"],
    ["Architecture", v?.architecture ? className(v.architecture) : "–"],
    ["Parameters", v?.parameter_count ? formatCount(v.parameter_count) : "–"],
    ["Source size", v ? formatBytes(v.size) : "–"],
    ["Files", v ? String(v.files.length) : "–"],
    ["Ready variants", String(ready.length)],
    ["Aliases", pointing.length ? pointing.join(", ") : "–"],
    ["Finalized", v ? time(v.finalized_at) : "–"],
    ["Remote code", v?.remote_code ? remoteCode(v.remote_code) : "none"],
  ];
  return h(
    "dl",
    { class: "facts", "aria-label": "About this version" },
    facts.map(([k, val]) => h("div", { "data-fact": k }, h("dt", {}, k), h("dd", {}, val))),
  );
}

// Executable content besides weights (auto_map, *.py): loading it needs trust_remote_code,
// which runs those files; said on the page so it is never a surprise.
function remoteCode(code) {
  const parts = [...Object.keys(code.auto_map ?? {}).map((k) => `auto_map ${k}`), ...(code.files ?? [])];
  return h(
    "span",
    { class: "notice", "data-remote-code": "true", title: "Loading needs --trust-remote-code, which runs this code" },
    `needs --trust-remote-code: ${parts.join(", ")}`,
  );
}

async function modelCardSection(state, signal) {
  const section = h(
    "section",
    { "aria-labelledby": "card-heading" },
    h("h2", { id: "card-heading" }, "Model card"),
  );
  const v = state.shown;
  const readme = v?.files.find((f) => f.path.toLowerCase() === "readme.md");
  if (!readme) {
    section.append(h("p", { class: "empty" }, "This version has no README.md."));
    return section;
  }
  if (readme.size > CARD_LIMIT) {
    section.append(h("p", { class: "notice" }, `README.md is ${formatBytes(readme.size)}; too large to show here.`));
    return section;
  }
  let text;
  try {
    text = await readText(`/models/${state.model.id}/versions/${v.version}/files/${filePath(readme.path)}`, {
      signal,
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    section.append(problemBox(err, { title: "Could not load README.md" }));
    return section;
  }
  const { meta, body } = splitFrontMatter(text);
  const metaRows = Object.entries(meta).filter(([, value]) => (Array.isArray(value) ? value.length : value));
  append(section, [
    metaRows.length
      ? h(
          "dl",
          { class: "props compact card-meta" },
          metaRows.map(([k, value]) => [h("dt", {}, k), h("dd", {}, Array.isArray(value) ? value.join(", ") : value)]),
        )
      : null,
    h("article", { class: "model-card", "aria-label": "Model card" }, renderMarkdown(body)),
  ]);
  return section;
}

function dtypeSection(state) {
  const section = h(
    "section",
    { "aria-labelledby": "dtypes-heading" },
    h("h2", { id: "dtypes-heading" }, "Tensors by dtype"),
  );
  const breakdown = state.shown?.dtype_breakdown;
  if (!breakdown || !Object.keys(breakdown).length) {
    section.append(
      h(
        "p",
        { class: "empty" },
        state.shown?.status === "ready"
          ? "Not recorded for this version (finalized before the registry kept it)."
          : "Counted when the version is finalized.",
      ),
    );
    return section;
  }
  const entries = Object.entries(breakdown).sort((a, b) => b[1].parameters - a[1].parameters);
  const totalParams = entries.reduce((sum, [, c]) => sum + c.parameters, 0) || 1;
  const bar = h("div", { class: "share-bar", "aria-hidden": "true" });
  entries.forEach(([, c], i) => {
    const part = h("span", { class: `swatch-${i % 8}` });
    part.style.width = `${(100 * c.parameters) / totalParams}%`;
    bar.append(part);
  });
  const rows = entries.map(([dtype, c], i) =>
    h(
      "tr",
      { "data-dtype": dtype },
      h("th", { scope: "row" }, h("span", { class: `swatch swatch-${i % 8}`, "aria-hidden": "true" }), dtype),
      h("td", { class: "num" }, c.tensors.toLocaleString()),
      h("td", { class: "num" }, `${formatCount(c.parameters)} (${c.parameters.toLocaleString()})`),
      h("td", { class: "num" }, formatBytes(c.bytes)),
      h("td", { class: "num" }, `${((100 * c.parameters) / totalParams).toFixed(1)}%`),
    ),
  );
  section.append(bar, table("Tensors by dtype", ["Dtype", "Tensors", "Parameters", "Bytes", "Share"], rows));
  return section;
}

function filesSection(state) {
  const files = state.shown?.files ?? [];
  const section = h(
    "section",
    { "aria-labelledby": "files-heading" },
    h("h2", { id: "files-heading" }, `Files (${files.length})`),
  );
  if (!files.length) {
    section.append(h("p", { class: "empty" }, "No files in this version yet."));
    return section;
  }
  const filter = h("input", { type: "search", name: "file-filter", autocapitalize: "off", spellcheck: "false" });
  const slot = h("div");
  const render = () => {
    const needle = filter.value.trim().toLowerCase();
    const shown = files.filter((f) => f.path.toLowerCase().includes(needle));
    const rows = shown.map((f) =>
      h(
        "tr",
        { "data-path": f.path },
        h("th", { scope: "row" }, h("code", {}, f.path)),
        h("td", { class: "num", title: `${f.size.toLocaleString()} bytes` }, formatBytes(f.size)),
        h("td", {}, h("code", { class: "sha256", title: f.sha256 }, f.sha256)),
      ),
    );
    replace(
      slot,
      table("Files", ["Path", "Size", "SHA-256"], rows, { empty: "No file matches." }),
      h(
        "p",
        { class: "hint" },
        `${shown.length} of ${files.length} files, ${formatBytes(shown.reduce((sum, f) => sum + f.size, 0))}.`,
      ),
    );
  };
  filter.addEventListener("input", render);
  render();
  append(section, [files.length > 8 ? field("Filter files", filter) : null, slot]);
  return section;
}

// dtype × (format, tensor-parallel size, encryption): what exists for the shown version, with
// its status, and what could be made.
function variantsMatrix(state) {
  const v = state.shown;
  const section = h(
    "section",
    { "aria-labelledby": "matrix-heading" },
    h("h2", { id: "matrix-heading" }, "Variants"),
  );
  if (!v || v.status !== "ready") {
    section.append(h("p", { class: "empty" }, "Variants are made from ready versions."));
    return section;
  }
  const mine = state.artifacts.filter((a) => a.version === v.version);
  const key = (format, tp, enc) => `${format}|${tp}|${enc ? 1 : 0}`;
  const columns = new Map(FORMATS.map((format) => [key(format, 1, false), { format, tp: 1, enc: false }]));
  for (const a of mine) {
    columns.set(key(a.format, a.tensor_parallel_size, a.encryption?.enabled), {
      format: a.format,
      tp: a.tensor_parallel_size,
      enc: Boolean(a.encryption?.enabled),
    });
  }
  const cols = [...columns.values()].sort(
    (a, b) => a.format.localeCompare(b.format) || a.tp - b.tp || Number(a.enc) - Number(b.enc),
  );
  const label = (c) => `${c.format} · TP ${c.tp}${c.enc ? " · encrypted" : ""}`;
  const dtypes = [...new Set([...DTYPES, ...mine.map((a) => a.dtype)])];
  const rows = dtypes.map((dtype) =>
    h(
      "tr",
      { "data-dtype": dtype },
      h("th", { scope: "row" }, dtype),
      cols.map((c) => {
        const found = mine
          .filter((a) => a.dtype === dtype && a.format === c.format && a.tensor_parallel_size === c.tp)
          .filter((a) => Boolean(a.encryption?.enabled) === c.enc)
          .sort((a, b) => String(b.created_at).localeCompare(String(a.created_at)))[0];
        const cell = h("td", { class: "matrix-cell", "data-variant": `${dtype} ${label(c)}` });
        if (!found) {
          const makeable = state.makeable.has(c.format);
          const link = `#/models/${state.model.id}/tensorize${query({
            version: v.version,
            dtype,
            format: c.format,
            tensor_parallel_size: c.tp,
            encrypt: c.enc ? "true" : undefined,
          })}`;
          cell.append(
            auth.has("tensorize") && makeable
              ? h("a", { href: link, "aria-label": `Tensorize ${dtype} ${label(c)}` }, "Make it")
              : auth.has("tensorize")
                ? h("span", { title: `No live worker can make ${c.format} artifacts` }, "no worker")
                : "–",
          );
          return cell;
        }
        append(cell, [
          found.job_id && found.status !== "ready"
            ? h("a", { href: `#/jobs/${found.job_id}`, "aria-label": `${found.status}: open the job` }, badge(found.status))
            : badge(found.status),
          found.status === "ready" ? ` ${formatBytes((found.files ?? []).reduce((sum, f) => sum + f.size, 0))}` : null,
          auth.has("models:write") && found.status !== "pending" && found.status !== "running"
            ? confirmButton("Delete", `artifact ${variantLabel(found)}`, async () => {
                try {
                  await request(`/artifacts/${found.id}`, { method: "DELETE" });
                  announce(`Artifact ${variantLabel(found)} deleted`);
                  state.reload(v.version);
                } catch (err) {
                  state.messages(problemBox(err, { title: "Could not delete the artifact" }));
                }
              })
            : null,
        ]);
        return cell;
      }),
    ),
  );
  section.append(
    h("p", { class: "hint" }, "Rows: dtype. Columns: format, tensor-parallel size, encryption. Only ready variants resolve."),
    table(`Variants of version ${v.version}`, ["Dtype", ...cols.map(label)], rows),
  );
  return section;
}

function dangerZone(state) {
  const name = state.model.name;
  const input = h("input", { type: "text", name: "confirm-name", autocapitalize: "off", spellcheck: "false" });
  const button = h("button", { type: "submit", class: "danger", disabled: true }, "Delete this model");
  input.addEventListener("input", () => {
    button.disabled = input.value.trim() !== name;
  });
  const messages = h("div");
  return h(
    "section",
    { "aria-labelledby": "danger-heading" },
    h("h2", { id: "danger-heading" }, "Delete the model"),
    h(
      "form",
      {
        class: "card danger-zone",
        onsubmit: async (event) => {
          event.preventDefault();
          if (input.value.trim() !== name) return;
          button.disabled = true;
          try {
            await request(`/models/${state.model.id}`, {
              method: "DELETE",
              headers: { "If-Match": state.model.etag },
            });
            announce(`Model ${name} deleted`);
            location.hash = "#/models";
          } catch (err) {
            replace(messages, problemBox(err, { title: "Could not delete the model" }));
            button.disabled = false;
          }
        },
      },
      h(
        "p",
        {},
        "Deletes every version, artifact, alias and stored byte of this model. Serving nodes that resolve it will get 404.",
      ),
      field(`Type ${name} to confirm`, input),
      button,
      messages,
    ),
  );
}

async function allArtifacts(modelId, signal) {
  try {
    const page = await api(`/models/${modelId}/artifacts${query({ limit: 500 })}`, { signal });
    return Array.isArray(page) ? page : (page.items ?? []);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    return [];
  }
}

export async function modelView(ctx) {
  const { root, params, signal } = ctx;
  const id = params[0];
  const [model, versions, aliases, artifacts, workers] = await Promise.all([
    api(`/models/${id}`, { signal }),
    allVersions(id, signal),
    api(`/models/${id}/aliases`, { signal }),
    allArtifacts(id, signal),
    auth.has("tensorize") ? liveWorkers(signal) : null,
  ]);
  ctx.setTitle(model.name);
  const wanted = Number(ctx.query.get("version"));
  const byNumber = [...versions].sort((a, b) => b.version - a.version);
  const shown =
    byNumber.find((v) => v.version === wanted) ??
    byNumber.find((v) => v.status === "ready") ??
    byNumber[0] ??
    null;
  const messages = h("div", { class: "messages", "aria-live": "polite" });
  const state = {
    model,
    versions,
    aliases,
    artifacts,
    shown,
    // What "Make it" may offer: the formats a live worker can make now.
    makeable: makeableFormats(workers),
    messages: (node) => replace(messages, node),
    reload: (version) =>
      ctx.navigate(`/models/${id}${query({ version: version ?? undefined })}`),
  };
  const header = h("div", { class: "model-header" });
  state.refreshHeader = () =>
    replace(
      header,
      h("h1", {}, state.model.name),
      h("p", { class: "lead" }, state.model.description || "No description."),
      state.model.tags.length
        ? h(
            "p",
            { class: "tags" },
            state.model.tags.map((t) =>
              h(
                "a",
                { class: "tag", href: `#/models${query({ tag: t })}`, "aria-label": `Models tagged ${t}` },
                t,
              ),
            ),
          )
        : null,
    );
  state.refreshHeader();
  const hasReady = versions.some((v) => v.status === "ready");
  const picker =
    versions.length > 1
      ? h(
          "form",
          { class: "inline-form", "aria-label": "Choose the version shown" },
          field(
            "Shown version",
            h(
              "select",
              {
                name: "shown-version",
                onchange: (event) => ctx.navigate(`/models/${id}${query({ version: event.target.value })}`),
              },
              byNumber.map((v) =>
                h(
                  "option",
                  { value: String(v.version), selected: v.version === shown?.version },
                  `version ${v.version} (${v.status})`,
                ),
              ),
            ),
          ),
        )
      : null;
  append(root, [
    crumbs(["Models", "#/models"], model.name),
    header,
    h(
      "div",
      { class: "actions" },
      auth.has("models:write")
        ? h("a", { class: "button-link", href: `#/models/${id}/publish` }, "Publish a version")
        : null,
      auth.has("tensorize") && hasReady
        ? h("a", { class: "button-link secondary", href: `#/models/${id}/tensorize` }, "Tensorize")
        : null,
      h("a", { class: "button-link secondary", href: `#/jobs${query({ model_id: id })}` }, "Jobs"),
    ),
    messages,
    picker,
  ]);
  // Facts and the versions table show aliases too: redraw them when an alias moves or goes.
  let facts = factsList(state);
  let versionsEl = versionsSection(state);
  state.aliasesChanged = () => {
    const nextFacts = factsList(state);
    const nextVersions = versionsSection(state);
    facts.replaceWith(nextFacts);
    versionsEl.replaceWith(nextVersions);
    facts = nextFacts;
    versionsEl = nextVersions;
  };
  root.append(facts);
  root.append(await modelCardSection(state, signal));
  root.append(
    dtypeSection(state),
    filesSection(state),
    variantsMatrix(state),
    versionsEl,
    aliasesSection(state),
  );
  // Artifacts come from a route that may be missing on older servers: load them last.
  const placeholder = h("p", {}, "Loading artifacts…");
  root.append(placeholder);
  placeholder.replaceWith(await artifactsSection(model, signal));
  if (auth.has("admin")) root.append(await activityChart({ model: model.name, signal }));
  root.append(detailsSection(state));
  if (auth.has("models:write")) root.append(dangerZone(state));
}
