// A small Markdown subset for model cards (README.md), rendered to DOM nodes. Text goes in only
// as text nodes: raw HTML in a card shows as the characters it is, never as markup, so a card
// cannot run script or load anything. Covered: YAML front matter (returned, not shown as text),
// ATX headings, paragraphs, fenced and indented code, block quotes, flat lists, horizontal rules,
// pipe tables; inline code, **bold**, *italic*, [links](…) to http(s)/mailto only. Images are
// not loaded (the page makes no request off this server): their alt text is shown instead.

import { h } from "./dom.js";

const SAFE_LINK = /^(https?:\/\/|mailto:)/i;

// Front matter: the `---` block Hugging Face cards start with (license, tags, …). Only simple
// `key: value` and `key:` + `- item` lines are read; anything else is skipped.
export function splitFrontMatter(text) {
  const match = /^---\r?\n([\s\S]*?)\r?\n---[ \t]*(?:\r?\n|$)/.exec(text);
  if (!match) return { meta: {}, body: text };
  const meta = {};
  let listKey = null;
  for (const line of match[1].split(/\r?\n/)) {
    const item = /^\s+-\s+(.*)$/.exec(line) ?? /^-\s+(.*)$/.exec(line);
    if (item && listKey) {
      meta[listKey].push(unquote(item[1]));
      continue;
    }
    const pair = /^([A-Za-z0-9_.-]+):\s*(.*)$/.exec(line);
    if (!pair) continue;
    if (pair[2] === "") {
      listKey = pair[1];
      meta[listKey] = [];
    } else {
      listKey = null;
      meta[pair[1]] = unquote(pair[2]);
    }
  }
  return { meta, body: text.slice(match[0].length) };
}

function unquote(value) {
  const v = value.trim();
  return /^(["']).*\1$/.test(v) ? v.slice(1, -1) : v;
}

// Inline spans, earliest match first. Returns an array of nodes and strings.
const INLINE = [
  ["code", /`([^`]+)`/],
  ["image", /!\[([^\]]*)\]\(([^)\s]*)(?:\s+"[^"]*")?\)/],
  ["link", /\[([^\]]+)\]\(([^)\s]*)(?:\s+"[^"]*")?\)/],
  // Underscores only at word edges (snake_case and __dunder__ names stay as typed).
  ["strong", /\*\*(?=\S)([\s\S]*?\S)\*\*|(?<![A-Za-z0-9_])__(?=\S)([\s\S]*?\S)__(?![A-Za-z0-9_])/],
  ["em", /\*(?=\S)([^*]*?\S)\*|(?<![A-Za-z0-9_])_(?=\S)([^_]*?\S)_(?![A-Za-z0-9_])/],
  ["autolink", /<(https?:\/\/[^\s<>]+)>/],
];

export function inline(text, depth = 0) {
  const out = [];
  let rest = text;
  while (rest) {
    let best = null;
    for (const [kind, re] of INLINE) {
      const m = re.exec(rest);
      if (m && (best === null || m.index < best.m.index)) best = { kind, m };
    }
    if (!best || depth > 8) {
      out.push(rest);
      break;
    }
    const { kind, m } = best;
    if (m.index) out.push(rest.slice(0, m.index));
    const inner = m[1] ?? m[2] ?? "";
    if (kind === "code") out.push(h("code", {}, inner));
    else if (kind === "image") out.push(h("span", { class: "md-image" }, `[image: ${inner || "no description"}]`));
    else if (kind === "link") {
      const href = m[2];
      out.push(
        SAFE_LINK.test(href)
          ? h("a", { href, rel: "noopener noreferrer nofollow", referrerpolicy: "no-referrer" }, inline(inner, depth + 1))
          : h("span", {}, inline(inner, depth + 1)),
      );
    } else if (kind === "autolink") {
      out.push(h("a", { href: inner, rel: "noopener noreferrer nofollow" }, inner));
    } else out.push(h(kind, {}, inline(inner, depth + 1)));
    rest = rest.slice(m.index + m[0].length);
  }
  return out;
}

function splitRow(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

const TABLE_RULE = /^\s*\|?\s*:?-{1,}:?\s*(\|\s*:?-{1,}:?\s*)*\|?\s*$/;
const LIST_ITEM = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;
const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)/;

// `headingOffset`: a card's `#` becomes h(1 + offset), so it sits below the page's own headings.
export function renderMarkdown(text, { headingOffset = 2 } = {}) {
  const lines = String(text).replace(/\t/g, "    ").split(/\r?\n/);
  const blocks = [];
  let i = 0;
  const isBlank = (line) => line === undefined || !line.trim();
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) {
      i += 1;
      continue;
    }
    const fence = FENCE.exec(line);
    if (fence) {
      const body = [];
      i += 1;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) body.push(lines[i++]);
      i += 1;
      blocks.push(
        h("pre", { class: "md-code", tabindex: "0" }, h("code", fence[2] ? { "data-lang": fence[2] } : {}, body.join("\n"))),
      );
      continue;
    }
    const heading = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
    if (heading) {
      const level = Math.min(6, heading[1].length + headingOffset);
      blocks.push(h(`h${level}`, { class: "md-heading" }, inline(heading[2])));
      i += 1;
      continue;
    }
    if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) {
      blocks.push(h("hr"));
      i += 1;
      continue;
    }
    if (/^ {4}/.test(line)) {
      const body = [];
      while (i < lines.length && (/^ {4}/.test(lines[i]) || (isBlank(lines[i]) && /^ {4}/.test(lines[i + 1] ?? "")))) {
        body.push(lines[i].slice(4));
        i += 1;
      }
      blocks.push(h("pre", { class: "md-code", tabindex: "0" }, h("code", {}, body.join("\n"))));
      continue;
    }
    if (/^\s{0,3}>/.test(line)) {
      const body = [];
      while (i < lines.length && /^\s{0,3}>/.test(lines[i])) body.push(lines[i++].replace(/^\s{0,3}>\s?/, ""));
      blocks.push(h("blockquote", {}, renderMarkdown(body.join("\n"), { headingOffset })));
      continue;
    }
    if (line.includes("|") && TABLE_RULE.test(lines[i + 1] ?? "") && lines[i + 1].includes("-")) {
      const head = splitRow(line);
      const rows = [];
      i += 2;
      while (i < lines.length && !isBlank(lines[i]) && lines[i].includes("|")) rows.push(splitRow(lines[i++]));
      blocks.push(
        h(
          "div",
          { class: "table-wrap", tabindex: "0", role: "region", "aria-label": "Table from the model card" },
          h(
            "table",
            {},
            h("thead", {}, h("tr", {}, head.map((cell) => h("th", { scope: "col" }, inline(cell))))),
            h(
              "tbody",
              {},
              rows.map((row) => h("tr", {}, head.map((_, c) => h("td", {}, inline(row[c] ?? ""))))),
            ),
          ),
        ),
      );
      continue;
    }
    const item = LIST_ITEM.exec(line);
    if (item) {
      const ordered = /\d/.test(item[1]);
      const items = [];
      while (i < lines.length) {
        const m = LIST_ITEM.exec(lines[i]);
        if (m && /\d/.test(m[1]) === ordered) {
          items.push([m[2]]);
          i += 1;
        } else if (!isBlank(lines[i]) && /^\s+\S/.test(lines[i]) && items.length) {
          // A continuation line (or a nested item, shown flat).
          const nested = LIST_ITEM.exec(lines[i].trim());
          if (nested) items.push([nested[2]]);
          else items[items.length - 1].push(lines[i].trim());
          i += 1;
        } else if (isBlank(lines[i]) && LIST_ITEM.exec(lines[i + 1] ?? "")) {
          i += 1;
        } else break;
      }
      blocks.push(h(ordered ? "ol" : "ul", {}, items.map((parts) => h("li", {}, inline(parts.join(" "))))));
      continue;
    }
    const para = [];
    while (
      i < lines.length &&
      !isBlank(lines[i]) &&
      !FENCE.test(lines[i]) &&
      !/^\s{0,3}(#{1,6}\s|>)/.test(lines[i]) &&
      !(para.length && LIST_ITEM.test(lines[i]))
    ) {
      para.push(lines[i].trim());
      i += 1;
    }
    blocks.push(h("p", {}, inline(para.join(" "))));
  }
  return blocks;
}
