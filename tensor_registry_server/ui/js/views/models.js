// Models: search, filter by tag, page through, create.

import { api, auth, query } from "../api.js";
import { append, field, formatBytes, h, problemBox, replace, showFieldErrors, splitList, table, time } from "../dom.js";

const PAGE_SIZE = 25;

function listHref(params) {
  return `#/models${query(params)}`;
}

function searchForm(ctx, q, tag) {
  const qInput = h("input", { type: "search", name: "q", value: q });
  const tagInput = h("input", { type: "text", name: "tag", value: tag, autocapitalize: "off" });
  return h(
    "form",
    {
      role: "search",
      class: "inline-form",
      "aria-label": "Search models",
      onsubmit: (event) => {
        event.preventDefault();
        ctx.navigate(`/models${query({ q: qInput.value.trim(), tag: tagInput.value.trim() })}`);
      },
    },
    field("Search name or description", qInput),
    field("Tag", tagInput),
    h(
      "div",
      { class: "actions" },
      h("button", { type: "submit" }, "Search"),
      q || tag ? h("a", { href: "#/models", class: "button-link secondary" }, "Clear filters") : null,
    ),
  );
}

function createForm(ctx) {
  const name = h("input", {
    type: "text",
    name: "name",
    required: true,
    autocapitalize: "off",
    spellcheck: "false",
    placeholder: "acme/llama-3-8b-instruct",
    maxlength: "128",
  });
  const description = h("textarea", { name: "description", rows: "3", maxlength: "10000" });
  const tags = h("input", { type: "text", name: "tags", autocapitalize: "off", placeholder: "chat, llama" });
  const fields = {
    name: field("Name", name, "namespace/name: lower-case letters, digits, '.', '_', '-'."),
    description: field("Description", description),
    tags: field("Tags", tags, "Separated by commas or spaces."),
  };
  const errors = h("div");
  const submit = h("button", { type: "submit" }, "Create model");
  const form = h(
    "form",
    {
      class: "card",
      novalidate: true,
      onsubmit: async (event) => {
        event.preventDefault();
        replace(errors);
        submit.disabled = true;
        try {
          const model = await api("/models", {
            method: "POST",
            body: { name: name.value.trim(), description: description.value, tags: splitList(tags.value) },
          });
          ctx.navigate(`/models/${model.id}`);
        } catch (err) {
          const rest = showFieldErrors(fields, err);
          if (err.code === "name_taken") fields.name.setError(err.message);
          else if (err.code !== "validation_error" || rest.length)
            errors.append(problemBox(err, { title: "Could not create the model" }));
        } finally {
          submit.disabled = false;
        }
      },
    },
    h("h2", {}, "Create a model"),
    Object.values(fields),
    submit,
    errors,
  );
  return form;
}

export async function modelsView(ctx) {
  const { root, query: params } = ctx;
  ctx.setTitle("Models");
  const q = params.get("q") ?? "";
  const tag = params.get("tag") ?? "";
  const cursor = params.get("cursor") ?? "";
  const results = h(
    "section",
    { "aria-labelledby": "results-heading", "aria-busy": "true" },
    h("h2", { id: "results-heading" }, "Models"),
    h("p", {}, "Loading…"),
  );
  append(root, [
    h("h1", {}, "Models"),
    searchForm(ctx, q, tag),
    results,
    auth.has("models:write") ? createForm(ctx) : null,
  ]);
  let page;
  try {
    page = await api(`/models${query({ q, tag, cursor, limit: PAGE_SIZE })}`, { signal: ctx.signal });
  } catch (err) {
    replace(results, h("h2", { id: "results-heading" }, "Models"), problemBox(err));
    return;
  }
  const filtered = q || tag;
  const rows = page.items.map((model) => {
    const summary = model.summary ?? {};
    const aliases = Object.entries(summary.aliases ?? {});
    return h(
      "tr",
      { "data-model": model.name },
      h("th", { scope: "row" }, h("a", { href: `#/models/${model.id}` }, model.name)),
      h("td", { class: "clip" }, model.description || "–"),
      h(
        "td",
        { "data-cell": "latest" },
        summary.latest_version
          ? h("a", { href: `#/models/${model.id}?version=${summary.latest_version}` }, `v${summary.latest_version}`)
          : "–",
        summary.version_count ? ` of ${summary.version_count}` : "",
      ),
      h("td", { "data-cell": "aliases" }, aliases.length ? aliases.map(([a, v]) => `${a} → v${v}`).join(", ") : "–"),
      h("td", { class: "num", "data-cell": "variants" }, String(summary.variant_count ?? 0)),
      h("td", { class: "num", "data-cell": "size" }, summary.latest_size ? formatBytes(summary.latest_size) : "–"),
      h(
        "td",
        {},
        model.tags.map((t) =>
          h("a", { class: "tag", href: listHref({ tag: t }), "aria-label": `Filter by tag ${t}` }, t),
        ),
      ),
      h("td", {}, time(model.updated_at)),
    );
  });
  results.removeAttribute("aria-busy");
  replace(
    results,
    h("h2", { id: "results-heading" }, filtered ? "Matching models" : "All models"),
    table("Models", ["Name", "Description", "Latest", "Aliases", "Ready variants (all versions)", "Size", "Tags", "Updated"], rows, {
      empty: filtered ? "No model matches these filters." : "No models yet. Create the first one below.",
    }),
    h(
      "nav",
      { class: "pager", "aria-label": "Pages" },
      cursor ? h("a", { href: listHref({ q, tag }) }, "First page") : null,
      page.next_cursor
        ? h("a", { href: listHref({ q, tag, cursor: page.next_cursor }), rel: "next" }, "Next page")
        : null,
    ),
  );
}
