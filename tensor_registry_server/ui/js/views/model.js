// One model, laid out like a Hugging Face / MLflow model page: facts of the shown version
// (architecture, parameters, size), its model card (README.md, rendered as safe Markdown), the
// tensor dtype breakdown, a file browser, the variants as a matrix, then all versions, aliases
// with history, the artifacts with their serve commands, details, and deletes that ask first.
// The shown version's facts, card, dtypes and files are views/model_card.js; the variants matrix is
// views/model_variants.js.

import { api, auth, query, request } from "../api.js";
import {
  announce,
  append,
  badge,
  confirmButton,
  crumbs,
  field,
  formatBytes,
  h,
  problemBox,
  replace,
  showFieldErrors,
  splitList,
  table,
  time,
} from "../dom.js";
import { activityChart } from "./activity.js";
import { dtypeSection, factsList, filesSection, modelCardSection } from "./model_card.js";
import { variantsMatrix } from "./model_variants.js";
import { artifactsSection } from "./serve.js";
import { liveWorkers, makeableFormats } from "./tensorize.js";
import { warmSection } from "./warm.js";

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
  root.append(await warmSection(model, artifacts, signal));
  if (auth.has("admin")) root.append(await activityChart({ model: model.name, signal }));
  root.append(detailsSection(state));
  if (auth.has("models:write")) root.append(dangerZone(state));
}
