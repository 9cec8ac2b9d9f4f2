// Publish: start or continue a draft version and upload into it (upload.js), or import a
// version from a source URI.

import { api, query, request } from "../api.js";
import { badge, busy, crumbs, field, formatBytes, h, problemBox, replace, showFieldErrors } from "../dom.js";
import { uploadArea } from "./upload.js";

function importForm(ctx, model) {
  const input = h("input", {
    type: "text",
    name: "source_uri",
    required: true,
    autocapitalize: "off",
    spellcheck: "false",
    placeholder: "s3://bucket/prefix/",
  });
  const fields = {
    source_uri: field(
      "Source URI",
      input,
      "s3://bucket/prefix/, https://… (a manifest) or file:///… on the server's allow-list.",
    ),
  };
  const messages = h("div");
  const submit = h("button", { type: "submit" }, "Import");
  return h(
    "form",
    {
      class: "card",
      onsubmit: async (event) => {
        event.preventDefault();
        replace(messages);
        submit.disabled = true;
        try {
          const { data } = await request(`/models/${model.id}/versions`, {
            method: "POST",
            body: { source_uri: input.value.trim() },
          });
          ctx.navigate(data.job_id ? `/jobs/${data.job_id}` : `/models/${model.id}`);
        } catch (err) {
          const rest = showFieldErrors(fields, err);
          if (["invalid_source_uri", "import_root_forbidden"].includes(err.code))
            fields.source_uri.setError(err.message);
          else if (err.code !== "validation_error" || rest.length)
            messages.append(problemBox(err, { title: "Could not start the import" }));
        } finally {
          submit.disabled = false;
        }
      },
    },
    h("h2", {}, "Import from a source URI"),
    fields.source_uri,
    submit,
    messages,
  );
}

async function chooser(ctx, model) {
  const page = await api(`/models/${model.id}/versions${query({ limit: 500 })}`, { signal: ctx.signal });
  const drafts = page.items.filter((v) => v.status === "draft");
  const messages = h("div");
  const start = h("button", { type: "button" }, "Start a new draft version");
  start.addEventListener("click", () =>
    busy(start, async () => {
      try {
        const version = await api(`/models/${model.id}/versions`, { method: "POST", body: {} });
        ctx.navigate(`/models/${model.id}/publish/${version.version}`);
      } catch (err) {
        replace(messages, problemBox(err, { title: "Could not create a version" }));
      }
    }),
  );
  ctx.root.append(
    crumbs(["Models", "#/models"], [model.name, `#/models/${model.id}`], "publish"),
    h("h1", {}, `Publish a version of ${model.name}`),
    h(
      "section",
      { class: "card", "aria-labelledby": "upload-heading" },
      h("h2", { id: "upload-heading" }, "Upload files"),
      h(
        "p",
        {},
        "A draft version takes files until you finalize it. Interrupted uploads can be resumed: files already in the draft are skipped.",
      ),
      start,
      drafts.length
        ? h(
            "ul",
            {},
            drafts.map((v) =>
              h(
                "li",
                {},
                h(
                  "a",
                  { href: `#/models/${model.id}/publish/${v.version}` },
                  `Continue draft version ${v.version}`,
                ),
                ` (${v.files.length} files)`,
              ),
            ),
          )
        : null,
      messages,
    ),
    importForm(ctx, model),
  );
}

export async function publishView(ctx) {
  const [id, number] = ctx.params;
  const model = await api(`/models/${id}`, { signal: ctx.signal });
  ctx.setTitle(`Publish ${model.name}`);
  if (!number) return chooser(ctx, model);
  const version = await api(`/models/${id}/versions/${number}`, { signal: ctx.signal });
  ctx.root.append(
    crumbs(["Models", "#/models"], [model.name, `#/models/${id}`], `version ${number}`),
    h("h1", {}, `Publish version ${number} of ${model.name}`),
  );
  if (version.status !== "draft") {
    ctx.root.append(
      h("p", {}, "This version is ", badge(version.status), "; only draft versions take files. "),
      h("p", {}, h("a", { href: `#/models/${id}` }, "Back to the model")),
    );
    return;
  }
  const done = h("div");
  ctx.onFinalized = (ready) => {
    area.hidden = true;
    const box = h(
      "div",
      { class: "success", role: "status", tabindex: "-1" },
      h("p", { class: "problem-title" }, `Version ${ready.version} is ready`),
      h("p", {}, `${ready.files.length} files, ${formatBytes(ready.size)}.`),
      h(
        "div",
        { class: "actions" },
        h(
          "a",
          { class: "button-link", href: `#/models/${id}/tensorize${query({ version: ready.version })}` },
          "Tensorize it",
        ),
        h("a", { class: "button-link secondary", href: `#/models/${id}` }, "Open the model"),
      ),
    );
    replace(done, box);
    box.focus();
  };
  const area = uploadArea(ctx, model, version);
  ctx.root.append(area, done);
  await area.start();
}
