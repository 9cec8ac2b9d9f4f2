// A small Markdown subset for model cards (README.md), rendered to DOM nodes. Text goes in only
// as text nodes: raw HTML in a card shows as the characters it is, never as markup, so a card
// cannot run script or load anything. Covered: YAML front matter (returned, not shown as text),
// ATX headings, paragraphs, fenced and indented code, block quotes, flat lists, horizontal rules,
// pipe tables; inline code, **bold**, *italic*, [links](…) to http(s)/mailto only. Images are
// not loaded (the page makes no request off this server): their alt text is shown instead.

import { h } from "./dom.js";

const SAFE_LINK = /^(https?:\/\/|mailto:)/i;

// Block patterns are matched line by line, and every line ending (including a lone \r, U+2028,
// U+2029, which `.` does not match) splits lines, so no pattern below can backtrack across a
// line's length more than once.
const splitLines = (text) => String(text).split(/\r\n|[\n\r\u2028\u2029]/);

// Front matter: the `---` block Hugging Face cards start with (license, tags, …). Only simple
// `key: value` and `key:` + `- item` lines are read; anything else is skipped.
export function splitFrontMatter(card) {
  const text = splitLines(card).join("\n");
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

// Inline spans in one left-to-right pass, in time linear in the text's length whatever it holds:
// `code`, ![image](…), [links](…), <https://autolinks>, and **strong** / *em* (or __ / _ at
// word edges) paired through a delimiter stack as CommonMark does. Every look-ahead either
// consumes what it scanned or is remembered (the questions come in text order), so no stretch
// is scanned again for each position. Strings only ever become text nodes.
const MAX_DEPTH = 8;
// Inline elements one card may make (a 1 MiB card of `**a** ` would be 175 000 of them, and the
// browser's layout, not this parser, would take seconds): past it the rest shows as text. A long
// card with a link per table row has a few thousand.
const MAX_SPANS = 10000;
// `*`/`_` runs one paragraph may pair: past it they are text (each pairing needs two of them, so
// this leaves room for every span; a paragraph of hundreds of thousands of stars is not prose).
const MAX_DELIMITER_RUNS = 4 * MAX_SPANS;
let spansLeft = Infinity;
const takeSpan = () => (spansLeft > 0 ? ((spansLeft -= 1), true) : false);
const SPACE = /\s/;
// What `\s` matches, without a regex call for the common characters.
const isSpace = (c) => c === " " || (c >= "\t" && c <= "\r") || (c >= "\u00a0" && SPACE.test(c));
const MAY_START = new Set(["`", "[", "!", "<", "*", "_"]);
const PLAIN_RUN = /[^`[!<*_]+/y;
const WORD = /[A-Za-z0-9_]/;

// The first index >= start whose character satisfies `stop` (text.length when none). Asked with
// starts that never go backwards, it scans each character at most once.
function finder(text, stop) {
  let from = 0;
  let found = -1;
  return (start) => {
    if (start < from || start > found) {
      from = start;
      found = start;
      while (found < text.length && !stop(text[found])) found += 1;
    }
    return found;
  };
}

export function inline(text, depth = 0) {
  if (depth > MAX_DEPTH) return [text];
  const n = text.length;
  const items = new Items(text);
  let plainFrom = 0;
  const flush = (upTo) => {
    if (upTo > plainFrom) items.add(plainFrom, upTo, null, 0);
  };
  const nextBacktick = finder(text, (c) => c === "`");
  const nextCloseBracket = finder(text, (c) => c === "]");
  const urlEnd = finder(text, (c) => c === ")" || isSpace(c));
  const nextNonSpace = finder(text, (c) => !isSpace(c));
  const nextQuote = finder(text, (c) => c === '"');
  const autolinkEnd = finder(text, (c) => c === "<" || c === ">" || isSpace(c));
  let tailAt = -1;
  let tail = null;
  let delimitersLeft = MAX_DELIMITER_RUNS;

  // The `(url "title")` right after the `]` at k: { href, end } or null (remembered for k).
  const linkTail = (k) => {
    if (k === tailAt) return tail;
    tailAt = k;
    tail = null;
    if (text[k + 1] !== "(") return tail;
    const stop = urlEnd(k + 2);
    let j = stop;
    if (j < n && text[j] !== ")") {
      const quote = nextNonSpace(j);
      j = quote < n && text[quote] === '"' ? nextQuote(quote + 1) + 1 : n;
    }
    if (j < n && text[j] === ")") tail = { href: text.slice(k + 2, stop), end: j + 1 };
    return tail;
  };

  let i = 0;
  while (i < n) {
    const c = text[i];
    if (!MAY_START.has(c)) {
      PLAIN_RUN.lastIndex = i;
      i = PLAIN_RUN.test(text) ? PLAIN_RUN.lastIndex : i + 1;
      continue;
    }
    let span = null; // { node, end } when a span starts at i
    if (spansLeft <= 0) {
      i += 1;
      continue;
    } else if (c === "`") {
      const close = nextBacktick(i + 1);
      if (close < n && close > i + 1 && takeSpan()) span = { node: h("code", {}, text.slice(i + 1, close)), end: close + 1 };
    } else if (c === "[" || (c === "!" && text[i + 1] === "[")) {
      const image = c === "!";
      const open = image ? i + 1 : i;
      const close = nextCloseBracket(open + 1);
      const found = close < n && (image || close > open + 1) ? linkTail(close) : null;
      if (found && takeSpan()) {
        const inner = text.slice(open + 1, close);
        let node;
        if (image) node = h("span", { class: "md-image" }, `[image: ${inner || "no description"}]`);
        else if (SAFE_LINK.test(found.href)) {
          const attrs = { href: found.href, rel: "noopener noreferrer nofollow", referrerpolicy: "no-referrer" };
          node = h("a", attrs, inline(inner, depth + 1));
        } else node = h("span", {}, inline(inner, depth + 1));
        span = { node, end: found.end };
      }
    } else if (c === "<" && (text.startsWith("http://", i + 1) || text.startsWith("https://", i + 1))) {
      const close = autolinkEnd(i + 1);
      if (text[close] === ">" && takeSpan()) {
        const href = text.slice(i + 1, close);
        span = { node: h("a", { href, rel: "noopener noreferrer nofollow" }, href), end: close + 1 };
      }
    } else if ((c === "*" || c === "_") && delimitersLeft > 0) {
      delimitersLeft -= 1;
      let j = i;
      while (text[j] === c) j += 1;
      const before = i > 0 ? text[i - 1] : " ";
      const after = j < n ? text[j] : " ";
      let open = !isSpace(after);
      let close = !isSpace(before);
      if (c === "_") {
        // Underscores only at word edges: snake_case and __dunder__ names stay as typed.
        open &&= !WORD.test(before);
        close &&= !WORD.test(after);
      }
      flush(i);
      items.add(i, j, null, (open ? OPENS : 0) | (close ? CLOSES : 0));
      i = j;
      plainFrom = j;
      continue;
    }
    if (span) {
      flush(i);
      items.add(i, span.end, span.node, 0);
      i = span.end;
      plainFrom = i;
    } else i += 1;
  }
  flush(n);
  return pairEmphasis(items);
}

const END = -1;
const OPENS = 1;
const CLOSES = 2;

// The items of one inline run, as parallel arrays (few allocations for a long card): each is a
// range [lo, hi) of the text shown as it is, or a node (node[k] set); a delimiter run has
// flags; `next` links them in text order as matched runs fold the items between into a node.
class Items {
  constructor(text) {
    Object.assign(this, { text, lo: [], hi: [], node: [], flags: [], depth: [], next: [] });
  }

  add(lo, hi, node, flags) {
    this.lo.push(lo);
    this.hi.push(hi);
    this.node.push(node);
    this.flags.push(flags);
    this.depth.push(0);
    this.next.push(END);
    return this.lo.length - 1;
  }

  // Items from `first` up to (not including) `stop`, as nodes and strings; neighbouring ranges
  // of the text become one string.
  render(first, stop) {
    const out = [];
    let from = -1;
    let to = -1;
    for (let k = first; k !== stop; k = this.next[k]) {
      if (this.node[k] === null && this.lo[k] === to) to = this.hi[k];
      else {
        if (to > from) out.push(this.text.slice(from, to));
        from = -1;
        to = -1;
        if (this.node[k] === null) [from, to] = [this.lo[k], this.hi[k]];
        else out.push(this.node[k]);
      }
    }
    if (to > from) out.push(this.text.slice(from, to));
    return out;
  }
}

// CommonMark's "process emphasis", simplified. Each closer looks back for the nearest opener of
// its character, never below where an earlier search for that character failed; a match turns
// everything between into one element and drops the openers between from the stack. So each
// item is passed over a bounded number of times. Nesting stops at MAX_DEPTH (the rest stays text).
// A closer uses the left end of its run, an opener the right end: [lo, hi) is what is left.
function pairEmphasis(items) {
  const { text, lo, hi, flags, depth, next } = items;
  const count = lo.length;
  for (let k = 0; k + 1 < count; k += 1) next[k] = k + 1;
  const bottom = { "*": -1, _: -1 };
  const stack = []; // delimiter runs that may still open
  for (let idx = 0; idx < count; idx += 1) {
    if (!flags[idx]) continue;
    const ch = text[lo[idx]];
    while (flags[idx] & CLOSES && hi[idx] > lo[idx]) {
      let pos = stack.length - 1;
      while (pos > bottom[ch] && text[lo[stack[pos]]] !== ch) pos -= 1;
      let inner = 0;
      if (pos > bottom[ch]) {
        for (let k = next[stack[pos]]; k !== idx; k = next[k]) inner = Math.max(inner, depth[k]);
      }
      if (pos <= bottom[ch] || inner >= MAX_DEPTH || !takeSpan()) {
        bottom[ch] = stack.length - 1;
        break;
      }
      const opener = stack[pos];
      const use = hi[opener] - lo[opener] >= 2 && hi[idx] - lo[idx] >= 2 ? 2 : 1;
      hi[opener] -= use;
      lo[idx] += use;
      const el = h(use === 2 ? "strong" : "em", {}, items.render(next[opener], idx));
      const wrapped = items.add(-1, -1, el, 0);
      depth[wrapped] = inner + 1;
      next[wrapped] = idx;
      next[opener] = wrapped;
      stack.length = hi[opener] > lo[opener] ? pos + 1 : pos;
      bottom["*"] = Math.min(bottom["*"], stack.length - 1);
      bottom._ = Math.min(bottom._, stack.length - 1);
    }
    if (flags[idx] & OPENS && hi[idx] > lo[idx]) stack.push(idx);
  }
  return count ? items.render(0, END) : [];
}

function splitRow(line) {
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|") && !row.endsWith("\\|")) row = row.slice(0, -1);
  return row.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, "|"));
}

// `| --- | :-: |`: checked cell by cell (a single pattern backtracks on long runs of spaces).
function isTableRule(line) {
  if (line === undefined || !line.includes("-")) return false;
  let row = line.trim();
  if (row.startsWith("|")) row = row.slice(1);
  if (row.endsWith("|")) row = row.slice(0, -1);
  return row.split("|").every((cell) => /^:?-+:?$/.test(cell.trim()));
}

// `## Title ##` -> [2, "Title"], or null. The closing #s go only after a space (or alone).
function heading(line) {
  const m = /^ {0,3}(#{1,6})(?:[ \t]([\s\S]*))?$/.exec(line);
  if (!m) return null;
  let body = (m[2] ?? "").trim();
  let end = body.length;
  while (end > 0 && body[end - 1] === "#") end -= 1;
  if (end === 0 || /\s/.test(body[end - 1])) body = body.slice(0, end).trimEnd();
  return [m[1].length, body];
}

const MAX_QUOTE_DEPTH = 8;
const LIST_ITEM = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+(.*)$/;
const FENCE = /^\s{0,3}(`{3,}|~{3,})\s*([\w+-]*)/;

// `headingOffset`: a card's `#` becomes h(1 + offset), so it sits below the page's own headings.
export function renderMarkdown(text, { headingOffset = 2, quoteDepth = 0 } = {}) {
  if (quoteDepth > 0) return renderBlocks(text, headingOffset, quoteDepth);
  spansLeft = MAX_SPANS;
  try {
    return renderBlocks(text, headingOffset, quoteDepth);
  } finally {
    spansLeft = Infinity;
  }
}

function renderBlocks(text, headingOffset, quoteDepth) {
  const lines = splitLines(String(text).replace(/\t/g, "    "));
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
    const title = heading(line);
    if (title) {
      const level = Math.min(6, title[0] + headingOffset);
      blocks.push(h(`h${level}`, { class: "md-heading" }, inline(title[1])));
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
      const inner = body.join("\n");
      const quoted =
        quoteDepth < MAX_QUOTE_DEPTH
          ? renderMarkdown(inner, { headingOffset, quoteDepth: quoteDepth + 1 })
          : h("p", {}, inner);
      blocks.push(h("blockquote", {}, quoted));
      continue;
    }
    if (line.includes("|") && isTableRule(lines[i + 1])) {
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
