// Small DOM helpers. Text always goes in through textContent, never innerHTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2), value);
    } else if (key === "value" || key === "checked" || key === "selected") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

/** The trail above a page: each step a [text, href] link or plain text, " / " between. */
export function crumbs(...trail) {
  const steps = trail.filter((step) => step !== null);
  return h(
    "p",
    { class: "crumbs" },
    steps.map((step, i) => [i ? " / " : null, Array.isArray(step) ? h("a", { href: step[1] }, step[0]) : step]),
  );
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

let uid = 0;
export function nextId(prefix = "f") {
  uid += 1;
  return `${prefix}-${uid}`;
}

// A labelled form control: <div class=field><label/>control<p hint/><p error/></div>.
// The hint and the error are tied to the control with aria-describedby.
export function field(label, control, hint) {
  control.id ||= nextId("in");
  const hintEl = hint ? h("p", { class: "hint", id: nextId("hint") }, hint) : null;
  const errorEl = h("p", { class: "field-error", id: nextId("err"), hidden: true });
  control.setAttribute("aria-describedby", [hintEl?.id, errorEl.id].filter(Boolean).join(" "));
  const wrap = h("div", { class: "field" }, h("label", { for: control.id }, label), control, hintEl, errorEl);
  wrap.control = control;
  wrap.setError = (message) => {
    errorEl.textContent = message || "";
    errorEl.hidden = !message;
    if (message) control.setAttribute("aria-invalid", "true");
    else control.removeAttribute("aria-invalid");
  };
  return wrap;
}

// Decimal units, as the CLI prints them (tensor_registry/cli/output.py format_size, `du --si`,
// Hugging Face and vLLM): 565312 -> "565.3 kB". One convention, so the UI and the CLI agree.
export function formatBytes(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return "–";
  const units = ["B", "kB", "MB", "GB", "TB", "PB"];
  let value = Number(n);
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return unit === 0 ? `${Math.trunc(value)} B` : `${value.toFixed(1)} ${units[unit]}`;
}

// Parameter counts as people say them: 124.4M, 6.74B.
export function formatCount(n) {
  if (n === null || n === undefined || Number.isNaN(Number(n))) return "–";
  const value = Number(n);
  for (const [size, unit] of [[1e12, "T"], [1e9, "B"], [1e6, "M"], [1e3, "K"]]) {
    if (value >= size) {
      const scaled = value / size;
      return `${scaled.toFixed(scaled < 10 ? 2 : 1)}${unit}`;
    }
  }
  return String(value);
}

export function formatDuration(seconds) {
  if (!Number.isFinite(seconds) || seconds < 0) return "–";
  if (seconds < 60) return `${Math.round(seconds)} s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
  return `${Math.floor(seconds / 3600)} h ${Math.round((seconds % 3600) / 60)} min`;
}

export function formatTime(iso) {
  if (!iso) return "–";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

export function time(iso) {
  return iso ? h("time", { datetime: iso }, formatTime(iso)) : "–";
}

// The problem+json of a failed call, for people: detail, code and request id.
export function problemBox(error, { title } = {}) {
  const problem = error?.problem ?? {};
  const box = h(
    "div",
    { class: "problem", role: "alert" },
    h("p", { class: "problem-title" }, title ?? problem.title ?? "Something went wrong"),
    h("p", {}, error?.message ?? String(error)),
    h(
      "p",
      { class: "problem-meta" },
      error?.code ? ["code ", h("code", {}, error.code)] : null,
      error?.requestId ? [" · request ", h("code", {}, error.requestId)] : null,
    ),
  );
  return box;
}

// Puts validation_error messages next to the fields they concern; returns the rest.
export function showFieldErrors(fields, error) {
  for (const f of Object.values(fields)) f.setError?.("");
  const unplaced = [];
  for (const item of error?.problem?.errors ?? []) {
    const name = item.loc?.[1];
    if (name && fields[name]) fields[name].setError(item.msg);
    else unplaced.push(item);
  }
  return unplaced;
}

// The page-wide polite live region (index.html) for short confirmations.
export function announce(message) {
  const region = document.getElementById("announcer");
  if (!region) return;
  region.textContent = "";
  setTimeout(() => {
    region.textContent = message;
  }, 50);
}

async function writeClipboard(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  // Plain-http deployments have no async clipboard: copy from a temporary selection.
  const area = h("textarea", { class: "visually-hidden", readonly: true }, text);
  document.body.append(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  if (!ok) throw new Error("the browser refused to copy");
}

// A block of shell text with a Copy button.
export function snippet(label, text, { id } = {}) {
  const codeId = id ?? nextId("snip");
  const status = h("span", { class: "copy-status", "aria-live": "polite" });
  const code = h(
    "pre",
    { class: "snippet", id: codeId, tabindex: "0", "aria-label": label },
    h("code", {}, text),
  );
  const button = h(
    "button",
    {
      type: "button",
      class: "secondary small",
      "aria-describedby": codeId,
      onclick: async () => {
        try {
          await writeClipboard(code.textContent);
          status.textContent = "Copied";
          announce(`${label} copied to the clipboard`);
        } catch (err) {
          status.textContent = `Could not copy: ${err.message}. Select the text instead.`;
        }
        setTimeout(() => (status.textContent = ""), 4000);
      },
    },
    `Copy ${label}`,
  );
  return h(
    "div",
    { class: "snippet-block" },
    h("div", { class: "snippet-head" }, h("span", { class: "snippet-label" }, label), button, status),
    code,
  );
}

// Single-quote a word for POSIX shells.
export function shellQuote(word) {
  const text = String(word);
  return /^[A-Za-z0-9_./:=@%+,-]+$/.test(text) ? text : `'${text.replace(/'/g, `'\\''`)}'`;
}

// Disables a button while an async action runs; returns the action's result.
export async function busy(button, action) {
  const previous = button.textContent;
  button.disabled = true;
  button.setAttribute("aria-busy", "true");
  try {
    return await action();
  } finally {
    button.disabled = false;
    button.removeAttribute("aria-busy");
    button.textContent = previous;
  }
}

// On phone widths (views.css) these tables reflow into one card per row, each cell labelled
// with its column's header; wider screens scroll the table inside its own box.
export function table(caption, headers, rows, { empty = "Nothing here yet." } = {}) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  for (const row of rows) {
    Array.from(row.children).forEach((cell, i) => {
      if (headers[i] && !cell.dataset.label) cell.dataset.label = headers[i];
      // One box per cell, so the reflowed grid keeps the label left and the content right.
      if (cell.childNodes.length > 1) cell.replaceChildren(h("span", { class: "cell" }, [...cell.childNodes]));
    });
  }
  return h(
    "div",
    { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
    h(
      "table",
      { class: "reflow" },
      h("caption", { class: "visually-hidden" }, caption),
      h(
        "thead",
        {},
        h(
          "tr",
          {},
          headers.map((text) => h("th", { scope: "col" }, text)),
        ),
      ),
      h("tbody", {}, rows),
    ),
  );
}

// A destructive action in two steps: the first press arms it (the label says what will go),
// the second runs it; Cancel or leaving the button disarms it.
export function confirmButton(label, what, action, { className = "danger small" } = {}) {
  const button = h("button", { type: "button", class: className, "aria-label": `${label} ${what}` }, label);
  const cancel = h("button", { type: "button", class: "secondary small", hidden: true }, "Cancel");
  let armed = false;
  const disarm = () => {
    armed = false;
    button.textContent = label;
    button.setAttribute("aria-label", `${label} ${what}`);
    cancel.hidden = true;
  };
  cancel.addEventListener("click", () => {
    disarm();
    button.focus();
  });
  button.addEventListener("click", async () => {
    if (!armed) {
      armed = true;
      button.textContent = `Confirm ${label.toLowerCase()}`;
      button.setAttribute("aria-label", `Confirm: ${label.toLowerCase()} ${what}`);
      cancel.hidden = false;
      return;
    }
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
      disarm();
    }
  });
  return h("span", { class: "confirm" }, button, cancel);
}

export function badge(status) {
  return h("span", { class: `badge badge-${String(status).replace(/[^a-z_-]/gi, "")}` }, status);
}

export function splitList(text) {
  return text
    .split(/[\s,]+/)
    .map((s) => s.trim())
    .filter(Boolean);
}

// A class name that may wrap only between its words (GPT2 · LMHead · Model), never mid-word.
export function className(text) {
  const words = String(text).split(/(?<=[a-z0-9])(?=[A-Z])/);
  return h("span", { class: "class-name", title: text }, words.flatMap((w, i) => (i ? [h("wbr"), w] : [w])));
}
