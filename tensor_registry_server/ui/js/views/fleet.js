// The fleet: the nodes' last check-ins (#/nodes) and one alias's rollout across them
// (#/models/{id}/aliases/{alias}/rollout): who is warm on the alias's target, who is still on
// the previous version, who is pulling, who failed and why, who stopped checking in.
//
// How the rollout page stays live: a check-in writes no event, so the page re-reads the
// rollout every POLL_MS (doubling up to MAX_POLL_MS while the server fails, back to POLL_MS
// when it answers), and it follows the event stream to re-read at once when this alias moves.
// Everything a node reports (hostname, failure reasons, ids) is attacker-controlled text: it
// goes in through dom.js's h(), as text, never as markup.

import { api, query, streamEvents } from "../api.js";
import { announce, badge, crumbs, formatDuration, h, problemBox, replace, table, time } from "../dom.js";

const POLL_MS = 2000;
const MAX_POLL_MS = 30_000;
// Stale watchers are read from GET /nodes: at most this many pages of 500 per refresh.
const NODE_PAGES = 4;
// The states of a watch in a rollout, in the order the bar and the table show them.
// A pending watch with a reason (the agent found nothing to pull: no artifact matches its
// variant flags) is waiting, not pulling.
export const ROLLOUT_STATES = {
  failed: "failed",
  pending: "pulling",
  waiting: "waiting: no matching artifact",
  previous: "still on a previous version",
  stale: "stopped checking in",
  warm: "warm on the target",
};
const ORDER = ["warm", "previous", "pending", "waiting", "failed", "stale"];

function ageOf(iso, now = Date.now()) {
  const seconds = (now - Date.parse(iso)) / 1000;
  return Number.isFinite(seconds) ? `${formatDuration(Math.max(0, seconds))} ago` : "–";
}

function shortId(id) {
  return id ? `${String(id).slice(0, 8)}…` : null;
}

function holding(entry) {
  const parts = [];
  if (entry.version !== null && entry.version !== undefined) parts.push(`version ${entry.version}`);
  if (entry.artifact_id) parts.push(`artifact ${shortId(entry.artifact_id)}`);
  return parts.length ? parts.join(" · ") : "–";
}

// Every node of the fleet, stale ones included when asked, up to NODE_PAGES pages.
async function fleet({ includeStale, signal }) {
  const items = [];
  let cursor = null;
  for (let pageNo = 0; pageNo < NODE_PAGES; pageNo += 1) {
    const page = await api(`/nodes${query({ include_stale: includeStale || undefined, cursor, limit: 500 })}`, {
      signal,
    });
    items.push(...page.items);
    cursor = page.next_cursor;
    if (!cursor) return { items, truncated: false };
  }
  return { items, truncated: true };
}

// Nodes that watch this alias but stopped checking in: the rollout leaves them out.
function staleWatchers(nodes, model, alias) {
  const out = [];
  for (const node of nodes) {
    if (node.status !== "stale") continue;
    const watch = (node.watches ?? []).find((w) => w.model === model && w.ref === alias);
    if (!watch) continue;
    out.push({
      id: node.id,
      hostname: node.hostname,
      version: watch.version ?? null,
      artifact_id: watch.artifact_id ?? null,
      error: watch.error ?? null,
      last_seen_at: node.last_seen_at,
    });
  }
  return out;
}

function rolloutBar(counts, total, target) {
  const described = ORDER.map((s) => `${counts[s]} ${ROLLOUT_STATES[s]}`).join(", ");
  const bar = h("div", {
    class: "rollout-bar",
    role: "img",
    "aria-label": `Rollout of version ${target}: ${described}`,
  });
  for (const state of ORDER) {
    if (!counts[state]) continue;
    const segment = h("span", { class: `rollout-segment rollout-${state}`, "data-state": state });
    // CSSOM, not a style attribute: the UI's CSP (style-src 'self') allows only this.
    segment.style.width = `${(100 * counts[state]) / total}%`;
    bar.append(segment);
  }
  return bar;
}

function rolloutRows(groups) {
  const now = Date.now();
  const rows = [];
  for (const state of ["failed", "waiting", "pending", "previous", "stale", "warm"]) {
    for (const node of groups[state]) {
      rows.push(
        h(
          "tr",
          { "data-node": node.id, "data-state": state },
          h("th", { scope: "row" }, h("code", {}, node.id)),
          h("td", { class: "hostname" }, node.hostname),
          h("td", {}, badge(state === "pending" ? "pulling" : state)),
          h("td", {}, holding(node)),
          h("td", {}, h("time", { datetime: node.last_seen_at, title: node.last_seen_at }, ageOf(node.last_seen_at, now))),
          h("td", { class: "reason" }, node.error ?? "–"),
        ),
      );
    }
  }
  return rows;
}

function rolloutSummary(rollout, stale, modelName) {
  const groups = {
    ...rollout,
    pending: rollout.pending.filter((n) => !n.error),
    waiting: rollout.pending.filter((n) => n.error),
    stale,
  };
  const counts = Object.fromEntries(ORDER.map((s) => [s, groups[s].length]));
  const total = ORDER.reduce((sum, s) => sum + counts[s], 0);
  const artifacts = new Map();
  for (const node of rollout.warm) {
    if (node.artifact_id) artifacts.set(node.artifact_id, (artifacts.get(node.artifact_id) ?? 0) + 1);
  }
  const count = `${counts.warm} / ${rollout.watching}`;
  return {
    count,
    groups,
    total,
    el: h(
      "section",
      { class: "rollout-summary", "aria-labelledby": "rollout-progress" },
      h("h2", { id: "rollout-progress" }, `Target: version ${rollout.version}`),
      h(
        "p",
        { class: "rollout-count" },
        h("strong", { "data-count": "warm" }, count),
        ` live nodes warm on version ${rollout.version} of ${modelName}:${rollout.alias}`,
      ),
      total ? rolloutBar(counts, total, rollout.version) : null,
      h(
        "ul",
        { class: "rollout-legend" },
        ORDER.map((s) =>
          h(
            "li",
            { "data-state": s },
            h("span", { class: `rollout-swatch rollout-${s}`, "aria-hidden": "true" }),
            `${ROLLOUT_STATES[s]}: `,
            h("strong", { "data-count": s }, String(counts[s])),
          ),
        ),
      ),
      artifacts.size
        ? h(
            "p",
            { class: "hint" },
            "Warm artifacts: ",
            [...artifacts].map(([id, n], i) => [i ? "; " : "", h("code", { title: id }, shortId(id)), ` on ${n} node${n === 1 ? "" : "s"}`]),
          )
        : null,
    ),
  };
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener(
      "abort",
      () => {
        clearTimeout(timer);
        resolve();
      },
      { once: true },
    );
  });
}

// Re-reads on a bounded interval and when the event stream says this alias moved or went;
// overlapping asks collapse into one read after the running one.
function keepLive({ refresh, signal, model, alias, note }) {
  let running = null;
  let again = false;
  const once = async () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      let ok;
      do {
        again = false;
        ok = await refresh();
      } while (again && !signal.aborted);
      return ok;
    })();
    try {
      return await running;
    } finally {
      running = null;
    }
  };
  (async () => {
    let delay = POLL_MS;
    while (!signal.aborted) {
      await pause(delay, signal);
      if (signal.aborted) return;
      delay = (await once()) ? POLL_MS : Math.min(delay * 2, MAX_POLL_MS);
    }
  })();
  streamEvents(
    `/events${query({ types: "alias.moved,alias.deleted" })}`,
    (event) => {
      let data;
      try {
        data = JSON.parse(event.data)?.data;
      } catch {
        return;
      }
      if (data?.model === model && data?.alias === alias) once();
    },
    { signal },
  ).then(
    () => {
      if (!signal.aborted) note(`The event stream ended; the rollout is still re-read every ${POLL_MS / 1000} s.`);
    },
    (err) => {
      if (err.name === "AbortError") return;
      note(`Alias moves are not followed live (${err.message}); the rollout is re-read every ${POLL_MS / 1000} s.`);
    },
  );
}

export async function rolloutView(ctx) {
  const [id, rawAlias] = ctx.params;
  const alias = decodeURIComponent(rawAlias);
  const model = await api(`/models/${id}`, { signal: ctx.signal });
  ctx.setTitle(`${alias} rollout · ${model.name}`);
  const summary = h("div");
  const nodesSlot = h("div");
  const problems = h("div");
  const status = h("p", { class: "hint rollout-status" });
  const streamNote = h("p", { class: "hint" });
  ctx.root.append(
    crumbs(["Models", "#/models"], [model.name, `#/models/${id}`], `${alias} rollout`),
    h("h1", {}, `Rollout of ${alias}`),
    h(
      "p",
      { class: "lead" },
      `Where the nodes that watch ${model.name}:${alias} stand, from their agents' check-ins (`,
      h("a", { href: "#/nodes" }, "all nodes"),
      ").",
    ),
    summary,
    problems,
    h("section", { "aria-labelledby": "rollout-nodes" }, h("h2", { id: "rollout-nodes" }, "Nodes"), nodesSlot),
    status,
    streamNote,
  );
  let shownCount = null;
  let failures = 0;
  async function refresh() {
    try {
      const [rollout, nodes] = await Promise.all([
        api(`/models/${id}/aliases/${encodeURIComponent(alias)}/rollout`, { signal: ctx.signal }),
        fleet({ includeStale: true, signal: ctx.signal }),
      ]);
      const drawn = rolloutSummary(rollout, staleWatchers(nodes.items, model.name, alias), model.name);
      replace(summary, drawn.el);
      replace(
        nodesSlot,
        table("Nodes watching this alias", ["Node", "Hostname", "State", "Has warm", "Last check-in", "Reason"], rolloutRows(drawn.groups), {
          empty: `No node watches ${model.name}:${alias} yet. Start an agent with --watch ${model.name}:${alias}.`,
        }),
        nodes.truncated ? h("p", { class: "hint" }, "Only the first 2000 nodes were checked for stale ones.") : null,
      );
      replace(problems);
      replace(status, `Updated ${new Date().toLocaleTimeString()}; re-read every ${POLL_MS / 1000} s and whenever ${alias} moves.`);
      if (shownCount !== null && shownCount !== drawn.count) announce(`${alias}: ${drawn.count} warm`);
      shownCount = drawn.count;
      failures = 0;
      return true;
    } catch (err) {
      if (err.name === "AbortError") return true;
      failures += 1;
      replace(problems, problemBox(err, { title: "Could not read the rollout" }));
      replace(status, `Reading again in up to ${Math.min(POLL_MS * 2 ** failures, MAX_POLL_MS) / 1000} s.`);
      return false;
    }
  }
  await refresh();
  keepLive({
    refresh,
    signal: ctx.signal,
    model: model.name,
    alias,
    note: (text) => replace(streamNote, text),
  });
}

function watchList(watches) {
  if (!watches?.length) return "–";
  return h(
    "ul",
    { class: "plain-list" },
    watches.map((w) =>
      h(
        "li",
        {},
        h("code", {}, `${w.model}:${w.ref}`),
        " ",
        badge(w.state),
        w.version !== null && w.version !== undefined ? ` version ${w.version}` : "",
        w.error ? [" ", h("span", { class: "reason truncate", title: w.error }, w.error)] : "",
      ),
    ),
  );
}

// What a node runs: an agent (it watches aliases), else what checked in for it (pull, load).
function runs(node) {
  const version = node.agent_version ? ` ${node.agent_version}` : "";
  if (node.watches?.length) return `agent${version}`;
  const kinds = [...new Set((node.loaded ?? []).map((l) => l.by ?? l.path))].filter(Boolean);
  return kinds.length ? `${kinds.join(", ")}${version}` : version.trim() || "–";
}

// The newest loads and pulls a node checked in: what, path, seconds, GB/s, or why it failed.
function loadList(loaded) {
  if (!loaded?.length) return "–";
  return h(
    "ul",
    { class: "plain-list" },
    loaded.slice(-3).reverse().map((l) => {
      const what = `${l.model ?? "?"}:${l.ref ?? l.version ?? "?"}`;
      const how = l.error
        ? h("span", { class: "reason truncate", title: l.error }, l.error)
        : `${l.path} ${Number(l.seconds).toFixed(1)} s${l.gbps ? `, ${Number(l.gbps).toFixed(2)} GB/s` : ""}${l.verified ? ", verified" : ""}`;
      return h("li", { "data-load": l.by ?? l.path }, h("code", {}, what), ` ${l.by ?? ""} `, how);
    }),
  );
}

function gpuList(gpus) {
  if (!gpus?.length) return "none";
  return gpus.map((g) => String(g.name ?? "GPU")).join(", ");
}

export async function nodesView(ctx) {
  ctx.setTitle("Nodes");
  const includeStale = ctx.query.get("stale") === "1";
  const cursor = ctx.query.get("cursor") ?? "";
  const toggle = h("input", {
    type: "checkbox",
    id: "include-stale",
    checked: includeStale,
    onchange: (event) => ctx.navigate(`/nodes${query({ stale: event.target.checked ? "1" : undefined })}`),
  });
  ctx.root.append(
    h("h1", {}, "Nodes"),
    h(
      "p",
      { class: "hint" },
      "Serving nodes as they last reported: agents (tensor-registry agent checks in every minute and on every change) and nodes that ran load or pull. A node that stops checking in is stale.",
    ),
    h(
      "div",
      { class: "checkbox" },
      toggle,
      h("label", { for: "include-stale" }, "Include stale nodes"),
    ),
  );
  const page = await api(`/nodes${query({ include_stale: includeStale || undefined, cursor, limit: 100 })}`, {
    signal: ctx.signal,
  });
  const now = Date.now();
  const rows = page.items.map((n) =>
    h(
      "tr",
      { "data-node": n.id },
      h("th", { scope: "row" }, h("code", {}, n.id)),
      h("td", { class: "hostname" }, n.hostname),
      h("td", {}, badge(n.status)),
      h("td", {}, watchList(n.watches)),
      h("td", { class: "loads" }, loadList(n.loaded)),
      h("td", {}, String(n.cached?.length ?? 0)),
      h("td", {}, gpuList(n.gpus)),
      h("td", { class: "runs" }, runs(n)),
      h("td", {}, h("time", { datetime: n.last_seen_at, title: n.last_seen_at }, ageOf(n.last_seen_at, now))),
      h("td", {}, time(n.first_seen_at)),
    ),
  );
  const here = { stale: includeStale ? "1" : undefined };
  ctx.root.append(
    table(
      "Nodes",
      ["Node", "Hostname", "Status", "Watches", "Recent loads", "Cached artifacts", "GPUs", "Runs", "Last check-in", "First seen"],
      rows,
      { empty: includeStale ? "No node has checked in yet." : "No live node. Tick 'Include stale nodes' to see the others." },
    ),
    h(
      "nav",
      { class: "pager", "aria-label": "Pages" },
      cursor ? h("a", { href: `#/nodes${query(here)}` }, "First page") : null,
      page.next_cursor ? h("a", { href: `#/nodes${query({ ...here, cursor: page.next_cursor })}`, rel: "next" }, "More nodes") : null,
    ),
  );
}
