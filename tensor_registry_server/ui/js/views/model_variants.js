// The variants matrix of a model's page (views/model.js): the shown version's artifacts as
// dtype × (format, tensor-parallel size, encryption), each cell's status, and what could be made.

import { auth, query, request } from "../api.js";
import { announce, append, badge, confirmButton, formatBytes, h, problemBox, table } from "../dom.js";
import { variantLabel } from "./serve.js";
import { FORMATS } from "../vocabulary.js";
import { DTYPES } from "./tensorize.js";

// dtype × (format, tensor-parallel size, encryption): what exists for the shown version, with
// its status, and what could be made.
export function variantsMatrix(state) {
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
