// What the shown version of a model holds, for its page (views/model.js): the facts
// (architecture, parameters, size, remote code), the model card (README.md, rendered as safe
// Markdown), the tensor dtype breakdown and a file browser.

import { filePath, readText } from "../api.js";
import {
  append,
  badge,
  className,
  field,
  formatBytes,
  formatCount,
  h,
  problemBox,
  replace,
  table,
  time,
} from "../dom.js";
import { renderMarkdown, splitFrontMatter } from "../markdown.js";

// A card bigger than this is not fetched into the page.
const CARD_LIMIT = 1024 * 1024;

export function factsList(state) {
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

export async function modelCardSection(state, signal) {
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

export function dtypeSection(state) {
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

export function filesSection(state) {
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
