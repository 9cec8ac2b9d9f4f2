// The model page's warm bundles (docs/warm-state.md): vLLM's compile caches made by a warm job
// for a ready vLLM-format artifact and a set of serve arguments; the list, and a Warm form.
import { api, auth, query, request } from "../api.js";
import { badge, busy, field, formatBytes, h, problemBox, replace, table, time } from "../dom.js";

async function bundles(modelId, signal) {
  try {
    const page = await api(`/models/${modelId}/warm-bundles${query({ limit: 200 })}`, { signal });
    return page.items ?? [];
  } catch (err) {
    if (err.name === "AbortError") throw err;
    return [];
  }
}

function variantOf(artifact) {
  return `v${artifact.version} ${artifact.dtype}/${artifact.format}/tp${artifact.tensor_parallel_size}`;
}

function warmForm(model, ready, messages) {
  const select = h(
    "select",
    { name: "artifact" },
    ready.map((a) => h("option", { value: a.id }, variantOf(a))),
  );
  const args = h("input", {
    name: "serve-args",
    type: "text",
    placeholder: "--max-model-len=8192 --max-num-seqs=64",
    autocomplete: "off",
  });
  const button = h("button", { type: "submit" }, "Warm");
  const onsubmit = async (event) => {
    event.preventDefault();
    const artifact = ready.find((a) => a.id === select.value);
    if (!artifact) return;
    await busy(button, async () => {
      try {
        const { data: body } = await request(`/models/${model.id}/warm`, {
          method: "POST",
          body: {
            version: artifact.version,
            dtype: artifact.dtype,
            format: artifact.format,
            tensor_parallel_size: artifact.tensor_parallel_size,
            encrypted: artifact.encryption?.enabled ?? false,
            serve_args: args.value.split(/\s+/).filter(Boolean),
          },
        });
        replace(
          messages,
          body.kind
            ? h("p", {}, "Warm job queued: ", h("a", { href: `#/jobs/${body.id}` }, body.id))
            : h("p", {}, `Already warm: bundle ${body.id}.`),
        );
      } catch (err) {
        replace(messages, problemBox(err, { title: "Could not start the warm job" }));
      }
    });
  };
  return h(
    "form",
    { class: "inline-form", "aria-label": "Warm an artifact", onsubmit },
    field("Artifact", select),
    field("Serve arguments", args, "The `vllm serve` arguments that enter vLLM's cache key"),
    button,
  );
}

export async function warmSection(model, artifacts, signal) {
  const messages = h("div", { class: "messages", "aria-live": "polite" });
  const items = await bundles(model.id, signal);
  const byId = new Map(artifacts.map((a) => [a.id, a]));
  const rows = items.map((b) => {
    const artifact = byId.get(b.artifact_id);
    return h(
      "tr",
      {},
      h("td", {}, artifact ? variantOf(artifact) : b.artifact_id),
      h("td", {}, h("code", {}, (b.serve_args ?? []).join(" ") || "(defaults)")),
      h("td", {}, badge(b.status)),
      h("td", {}, b.key?.vllm_version ? `vLLM ${b.key.vllm_version}, GPU ${b.key.gpu}` : "—"),
      h("td", {}, h("code", {}, (b.cache?.dirs ?? []).join(", ") || "—")),
      h("td", {}, b.size != null ? formatBytes(b.size) : "—"),
      h("td", {}, time(b.created_at)),
    );
  });
  const ready = artifacts.filter((a) => a.status === "ready" && a.format === "vllm");
  return h(
    "section",
    { "aria-labelledby": "warm-heading" },
    h("h2", { id: "warm-heading" }, "Warm bundles"),
    h("p", { class: "hint" }, "vLLM compile caches a node restores before `vllm serve` (tensor-registry warm-restore)."),
    table("Warm bundles", ["Artifact", "Serve arguments", "Status", "Made with", "vLLM cache", "Size", "Made"], rows, {
      empty: "No warm bundle yet.",
    }),
    auth.has("tensorize") && ready.length ? warmForm(model, ready, messages) : null,
    messages,
  );
}
