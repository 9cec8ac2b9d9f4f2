// The upload area of a draft version: drag-and-drop of a Hugging Face folder or files, per-file
// and total progress, sha256, resume (files already in the draft are skipped), and finalize with
// the validation problems shown in the rows of the files they concern.

import { api, filePath, uploadFile } from "../api.js";
import { announce, badge, busy, formatBytes, h, problemBox, replace } from "../dom.js";
import { sha256File } from "../sha256.js";

const FILE_COLUMNS = ["Path", "Size", "Progress", "Status", "SHA-256", "Problems", "Actions"];

// Weight formats the registry does not take (it reads *.safetensors); a HF folder often has them
// beside the safetensors files, and uploading them would only cost time and space.
const NOT_UPLOADED = /\.(bin|pt|pth|ckpt|h5|msgpack|onnx|gguf|ot)$/i;
// Files up to this size are hashed before the upload so the server can check X-Content-SHA256;
// bigger ones are hashed by the server while they stream (and locally only to resume).
const PREHASH_LIMIT = 256 * 1024 * 1024;

// Drop a leading folder shared by every path ("tiny-gpt2/config.json" → "config.json").
export function normalizePaths(items) {
  const cleaned = items.map((it) => ({ ...it, path: it.path.replace(/^\/+/, "") }));
  const first = cleaned.map((it) => (it.path.includes("/") ? it.path.split("/")[0] : null));
  if (first.length && first[0] !== null && first.every((f) => f === first[0])) {
    for (const it of cleaned) it.path = it.path.slice(first[0].length + 1);
  }
  const kept = [];
  const skipped = [];
  for (const it of cleaned) {
    const hidden = it.path.split("/").some((part) => part.startsWith("."));
    if (hidden || NOT_UPLOADED.test(it.path)) skipped.push(it.path);
    else kept.push(it);
  }
  return { kept, skipped };
}

async function walkEntry(entry, out) {
  if (entry.isFile) {
    const file = await new Promise((resolve, reject) => entry.file(resolve, reject));
    out.push({ file, path: entry.fullPath || file.name });
  } else if (entry.isDirectory) {
    const reader = entry.createReader();
    for (;;) {
      const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
      if (!batch.length) break;
      for (const child of batch) await walkEntry(child, out);
    }
  }
}

// Files of a drop, folders included (DataTransferItem.webkitGetAsEntry). The entries must be
// taken synchronously, before the first await, while the DataTransfer is still readable.
async function droppedFiles(dataTransfer) {
  const items = [...(dataTransfer.items ?? [])].filter((item) => item.kind === "file");
  const entries = items.map((item) => item.webkitGetAsEntry?.() ?? null);
  const files = [...(dataTransfer.files ?? [])];
  if (entries.length && entries.every(Boolean)) {
    const out = [];
    for (const entry of entries) await walkEntry(entry, out);
    return out;
  }
  return files.map((file) => ({ file, path: file.webkitRelativePath || file.name }));
}

const STATUS_TEXT = {
  selected: "Ready to upload",
  stored: "In the draft",
  hashing: "Computing sha256…",
  uploading: "Uploading…",
  done: "Uploaded",
  skipped: "Already in the draft (same size and sha256)",
  failed: "Failed",
};

export function uploadArea(ctx, model, version) {
  const base = `/models/${model.id}/versions/${version.version}`;
  const entries = new Map();
  let running = false;

  const tbody = h("tbody");
  const tableEl = h(
    "div",
    { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Files of this version" },
    h(
      "table",
      { class: "files reflow" },
      h("caption", { class: "visually-hidden" }, "Files of this version"),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          FILE_COLUMNS.map((t) => h("th", { scope: "col" }, t)),
        ),
      ),
      tbody,
    ),
  );
  const totalBar = h("progress", {
    id: "total-progress",
    max: "1",
    value: "0",
    "aria-label": "Total upload progress",
  });
  const totalText = h("span", { id: "total-text" });
  const summary = h("p", { class: "summary", role: "status", "aria-live": "polite" });
  const general = h("div", { class: "messages" });
  const skippedNote = h("p", { class: "hint", hidden: true });
  const uploadButton = h("button", { type: "button" }, "Upload");
  const finalizeButton = h(
    "button",
    { type: "button", class: "secondary" },
    `Finalize version ${version.version}`,
  );

  function rowFor(entry) {
    if (entry.row) return entry.row;
    const cells = {
      size: h("td", { class: "num" }),
      progress: h("progress", { max: "1", value: "0", "aria-label": `Upload progress of ${entry.path}` }),
      status: h("td", { class: "status" }),
      sha: h("td", {}),
      problems: h("td", { class: "problems" }),
      remove: h("td"),
    };
    entry.cells = cells;
    entry.row = h(
      "tr",
      { "data-path": entry.path },
      h("th", { scope: "row" }, h("code", {}, entry.path)),
      cells.size,
      h("td", {}, cells.progress),
      cells.status,
      cells.sha,
      cells.problems,
      cells.remove,
    );
    // Labels for the phone-width reflow (views.css), as dom.table() gives its cells.
    Array.from(entry.row.children).forEach((cell, i) => (cell.dataset.label = FILE_COLUMNS[i]));
    tbody.append(entry.row);
    return entry.row;
  }

  function paint(entry) {
    rowFor(entry);
    const { cells } = entry;
    const size = entry.file ? entry.file.size : (entry.server?.size ?? 0);
    cells.size.textContent = formatBytes(size);
    cells.progress.max = Math.max(size, 1);
    cells.progress.value =
      entry.status === "stored" || entry.status === "skipped" || entry.status === "done"
        ? Math.max(size, 1)
        : entry.loaded;
    let text = STATUS_TEXT[entry.status];
    if (entry.status === "uploading" && size) text = `Uploading ${Math.floor((100 * entry.loaded) / size)}%`;
    if (entry.status === "hashing" && size)
      text = `Computing sha256 ${Math.floor((100 * entry.loaded) / size)}%`;
    replace(
      cells.status,
      entry.status === "failed"
        ? [
            badge("failed"),
            " ",
            entry.error?.message ?? "",
            entry.error?.code ? [" (", h("code", {}, entry.error.code), ")"] : null,
          ]
        : text,
    );
    const sha = entry.sha256 ?? entry.server?.sha256;
    replace(cells.sha, sha ? h("code", { class: "hash", title: sha }, sha) : "–");
    replace(
      cells.problems,
      entry.problems.length
        ? h(
            "ul",
            {},
            entry.problems.map((p) => h("li", {}, h("code", {}, p.code), " ", p.message)),
          )
        : "",
    );
    entry.row.classList.toggle("invalid", entry.problems.length > 0);
    const label =
      entry.file && entry.status !== "done" && entry.status !== "skipped"
        ? "Remove from list"
        : "Delete from draft";
    replace(
      cells.remove,
      entry.status === "hashing" || entry.status === "uploading"
        ? ""
        : h(
            "button",
            {
              type: "button",
              class: "secondary small",
              "aria-label": `${label}: ${entry.path}`,
              onclick: () => remove(entry),
            },
            label,
          ),
    );
  }

  function paintTotal() {
    const local = [...entries.values()].filter((e) => e.file);
    const total = local.reduce((s, e) => s + e.file.size, 0);
    const done = local.reduce(
      (s, e) =>
        s + (["done", "skipped"].includes(e.status) ? e.file.size : e.status === "uploading" ? e.loaded : 0),
      0,
    );
    totalBar.max = Math.max(total, 1);
    totalBar.value = done;
    totalText.textContent = total
      ? `${formatBytes(done)} of ${formatBytes(total)} (${Math.floor((100 * done) / total)}%)`
      : "No files selected.";
    const pending = local.filter((e) => e.status === "selected" || e.status === "failed").length;
    uploadButton.textContent = pending ? `Upload ${pending} file${pending > 1 ? "s" : ""}` : "Upload";
    uploadButton.disabled = running || !pending;
    finalizeButton.disabled = running;
  }

  async function remove(entry) {
    if (entry.file && ["selected", "failed"].includes(entry.status) && entry.server) {
      Object.assign(entry, { file: null, status: "stored", error: null, loaded: 0 });
      paint(entry);
      paintTotal();
      return;
    }
    if (entry.server) {
      try {
        await api(`${base}/files/${filePath(entry.path)}`, { method: "DELETE" });
      } catch (err) {
        if (err.code !== "file_not_found") {
          replace(general, problemBox(err, { title: `Could not delete ${entry.path}` }));
          return;
        }
      }
    }
    entry.row?.remove();
    entries.delete(entry.path);
    announce(`${entry.path} removed`);
    paintTotal();
  }

  function addFiles(items) {
    const { kept, skipped } = normalizePaths(items);
    for (const { file, path } of kept) {
      const entry = entries.get(path) ?? { path, server: null, problems: [] };
      Object.assign(entry, { file, status: "selected", loaded: 0, sha256: null, error: null });
      entries.set(path, entry);
      paint(entry);
    }
    skippedNote.hidden = !skipped.length;
    skippedNote.textContent = skipped.length
      ? `Not uploaded (hidden files or weights in formats other than safetensors): ${skipped.join(", ")}`
      : "";
    summary.textContent = `${kept.length} file${kept.length === 1 ? "" : "s"} added.`;
    paintTotal();
  }

  async function refreshServer() {
    const fresh = await api(base);
    const onServer = new Map(fresh.files.map((f) => [f.path, f]));
    for (const [path, f] of onServer) {
      const entry = entries.get(path) ?? { path, file: null, status: "stored", loaded: 0, problems: [] };
      entry.server = f;
      entries.set(path, entry);
      paint(entry);
    }
    for (const entry of entries.values()) {
      if (!onServer.has(entry.path)) entry.server = null;
    }
    return fresh;
  }

  async function uploadOne(entry) {
    const { file } = entry;
    entry.error = null;
    entry.problems = [];
    let sha = null;
    const needHash = (entry.server && entry.server.size === file.size) || file.size <= PREHASH_LIMIT;
    if (needHash) {
      entry.status = "hashing";
      entry.loaded = 0;
      paint(entry);
      sha = await sha256File(file, {
        onProgress: (n) => {
          entry.loaded = n;
          paint(entry);
        },
        signal: ctx.signal,
      });
      entry.sha256 = sha;
      if (entry.server && entry.server.size === file.size && entry.server.sha256 === sha) {
        entry.status = "skipped";
        paint(entry);
        return;
      }
    }
    entry.status = "uploading";
    entry.loaded = 0;
    paint(entry);
    const stored = await uploadFile(`${base}/files/${filePath(entry.path)}`, file, {
      sha256: sha,
      signal: ctx.signal,
      onProgress: (n) => {
        entry.loaded = n;
        paint(entry);
        paintTotal();
      },
    });
    entry.server = stored;
    entry.sha256 = stored.sha256;
    entry.status = "done";
    paint(entry);
  }

  async function uploadAll() {
    running = true;
    replace(general);
    paintTotal();
    let failed = 0;
    let sent = 0;
    try {
      await refreshServer();
      for (const entry of entries.values()) {
        if (!entry.file || !["selected", "failed"].includes(entry.status)) continue;
        try {
          await uploadOne(entry);
          sent += 1;
        } catch (err) {
          if (err.name === "AbortError") throw err;
          entry.status = "failed";
          entry.error = err;
          failed += 1;
          paint(entry);
        }
        paintTotal();
      }
    } catch (err) {
      if (err.name === "AbortError") return;
      replace(general, problemBox(err, { title: "The upload stopped" }));
    } finally {
      running = false;
      paintTotal();
    }
    summary.textContent = failed
      ? `${sent} file(s) done, ${failed} failed. Press Upload again to retry only the failed files.`
      : `${sent} file(s) done. Finalize when every file is in the draft.`;
  }

  async function finalize() {
    replace(general);
    for (const entry of entries.values()) {
      entry.problems = [];
      paint(entry);
    }
    try {
      const ready = await api(`${base}/finalize`, { method: "POST" });
      ctx.onFinalized(ready);
    } catch (err) {
      if (err.code !== "invalid_version") {
        replace(general, problemBox(err, { title: "Could not finalize" }));
        return;
      }
      await refreshServer().catch(() => null);
      const loose = [];
      for (const problem of err.problem.problems ?? []) {
        const entry = problem.path ? entries.get(problem.path) : null;
        if (entry) {
          entry.problems.push(problem);
          paint(entry);
        } else loose.push(problem);
      }
      const box = h(
        "div",
        { class: "problem", role: "alert", tabindex: "-1" },
        h("p", { class: "problem-title" }, err.message),
        h("p", {}, "Problems with a file are shown in its row below."),
        loose.length
          ? h(
              "ul",
              {},
              loose.map((p) =>
                h(
                  "li",
                  {},
                  h("code", {}, p.code),
                  " ",
                  p.path ? [h("code", {}, p.path), ": "] : "",
                  p.message,
                ),
              ),
            )
          : null,
      );
      replace(general, box);
      box.focus();
    }
  }

  const filesInput = h("input", {
    type: "file",
    multiple: true,
    class: "visually-hidden",
    tabindex: "-1",
    "aria-label": "Model files",
    id: "files-input",
  });
  const folderInput = h("input", {
    type: "file",
    multiple: true,
    webkitdirectory: true,
    class: "visually-hidden",
    tabindex: "-1",
    "aria-label": "Model folder",
    id: "folder-input",
  });
  for (const input of [filesInput, folderInput]) {
    input.addEventListener("change", () => {
      addFiles([...input.files].map((file) => ({ file, path: file.webkitRelativePath || file.name })));
      input.value = "";
    });
  }
  const zone = h(
    "div",
    { class: "dropzone", id: "dropzone" },
    h(
      "p",
      {},
      "Drop a Hugging Face model folder or its files here (config.json, tokenizer files, *.safetensors), or",
    ),
    h(
      "div",
      { class: "actions" },
      h("button", { type: "button", class: "secondary", onclick: () => filesInput.click() }, "Choose files…"),
      h(
        "button",
        { type: "button", class: "secondary", onclick: () => folderInput.click() },
        "Choose a folder…",
      ),
    ),
    filesInput,
    folderInput,
  );
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", async (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    addFiles(await droppedFiles(event.dataTransfer));
  });

  uploadButton.addEventListener("click", uploadAll);
  finalizeButton.addEventListener("click", () => busy(finalizeButton, finalize));

  const area = h(
    "div",
    { class: "upload" },
    zone,
    skippedNote,
    general,
    tableEl,
    h("div", { class: "total" }, h("span", { "aria-hidden": "true" }, "Total"), totalBar, totalText),
    h("div", { class: "actions" }, uploadButton, finalizeButton),
    summary,
  );
  area.start = async () => {
    for (const f of version.files) {
      entries.set(f.path, { path: f.path, file: null, server: f, status: "stored", loaded: 0, problems: [] });
      paint(entries.get(f.path));
    }
    paintTotal();
  };
  return area;
}
