// Tensorize: a form that offers only what live workers can run, and the live job view
// (stage, bytes, throughput, ETA from the SSE stream; cancel; the error when it fails).

import { api, query, request, streamEvents } from "../api.js";
import {
  announce,
  badge,
  busy,
  crumbs,
  field,
  formatBytes,
  formatDuration,
  h,
  problemBox,
  replace,
  time,
} from "../dom.js";
import { jobRate } from "./activity.js";
import { DTYPES as VOCABULARY_DTYPES, FORMATS } from "../vocabulary.js";
import { jobMakes } from "./jobs.js";

// The vocabulary's dtypes, the UI's default (bfloat16) first.
export const DTYPES = ["bfloat16", ...VOCABULARY_DTYPES.filter((d) => d !== "bfloat16")];
const FORMAT_LABELS = {
  hf: "hf: Hugging Face names (plain tensorizer, vLLM's generic path)",
  vllm: "vllm: vLLM's own layout (vLLM's fast path)",
};
const FINAL = new Set(["succeeded", "failed", "cancelled"]);
// Storage backends are server settings, not worker capabilities: the form offers those the
// server says are configured (GET /storage); any other is refused (storage_not_configured).

// What one live worker can run, read from its heartbeat the way the server routes jobs
// (tensor_registry_server/jobs/pool/service.py): format vllm needs vLLM on a gpu-queue worker, tensor-parallel
// shards need that many GPUs, encryption needs tensorizer's crypto (libsodium).
export function workerOffer(worker) {
  const c = worker.capabilities ?? {};
  const queues = worker.queues ?? [];
  const gpus = Number(c.cuda?.device_count ?? 0);
  const hasVllm = Boolean(c.versions?.vllm);
  const formats = (Array.isArray(c.formats) ? c.formats : ["hf"]).filter(
    (f) => f !== "vllm" || (hasVllm && queues.includes("gpu")),
  );
  return {
    name: worker.hostname ?? worker.id,
    usable: worker.live !== false && (queues.includes("cpu") || queues.includes("gpu")),
    dtypes: DTYPES,
    formats,
    maxTp: formats.includes("vllm") ? Math.max(gpus, 1) : 1,
    encryption: Boolean(c.encryption),
  };
}

// The live workers, or null when this token cannot see them (or the server lists none): then
// only what every worker makes (hf) is offered, never vllm, which needs a worker reporting it.
export async function liveWorkers(signal) {
  try {
    const page = await api("/workers", { signal });
    return (Array.isArray(page) ? page : (page.items ?? [])).filter((w) => w.live !== false);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    return null;
  }
}

// The formats some live worker can make ("vllm" only with vLLM on a gpu-queue worker).
export function makeableFormats(workers) {
  if (workers === null) return new Set(["hf"]);
  return new Set(workers.map(workerOffer).filter((o) => o.usable).flatMap((o) => o.formats));
}

function tpChoices(offers, format) {
  const max = Math.max(
    1,
    ...offers.filter((o) => o.formats.includes(format) && format === "vllm").map((o) => o.maxTp),
  );
  const out = [];
  for (let n = 1; n <= max; n *= 2) out.push(n);
  return out;
}

function idempotencyKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join(
    "",
  );
}

export async function tensorizeView(ctx) {
  const [id] = ctx.params;
  const [model, versionsPage] = await Promise.all([
    api(`/models/${id}`, { signal: ctx.signal }),
    api(`/models/${id}/versions${query({ limit: 500 })}`, { signal: ctx.signal }),
  ]);
  ctx.setTitle(`Tensorize ${model.name}`);
  ctx.root.append(
    crumbs(["Models", "#/models"], [model.name, `#/models/${id}`], "tensorize"),
    h("h1", {}, `Tensorize ${model.name}`),
  );
  const ready = versionsPage.items.filter((v) => v.status === "ready").sort((a, b) => b.version - a.version);
  if (!ready.length) {
    ctx.root.append(
      h(
        "p",
        { class: "notice" },
        "No version is ready yet. ",
        h("a", { href: `#/models/${id}/publish` }, "Publish and finalize one first."),
      ),
    );
    return;
  }
  const storageAsked = api("/storage", { signal: ctx.signal });
  const workers = await liveWorkers(ctx.signal);
  if (workers !== null && !workers.length) {
    ctx.root.append(
      h(
        "p",
        { class: "notice", role: "alert" },
        "No live worker is connected, so there is nothing to offer. Start one with ",
        h("code", {}, "tensor-registry worker"),
        " (or ",
        h("code", {}, "tensor-registry serve"),
        " without --no-worker) and reload.",
      ),
    );
    return;
  }

  const storage = await storageAsked;
  const wanted = Number(ctx.query.get("version")) || ready[0].version;
  const versionSelect = h(
    "select",
    { name: "version" },
    ready.map((v) =>
      h(
        "option",
        { value: String(v.version), selected: v.version === wanted },
        `version ${v.version} (${formatBytes(v.size)})`,
      ),
    ),
  );
  const dtypeSelect = h("select", { name: "dtype" });
  const formatSelect = h("select", { name: "format" });
  const tpSelect = h("select", { name: "tensor_parallel_size" });
  const encrypt = h("input", { type: "checkbox", name: "encrypt" });
  const storageSelect = h("select", { name: "storage" });
  const fields = {
    version: field("Version", versionSelect),
    dtype: field("Dtype", dtypeSelect),
    format: field("Format", formatSelect),
    tensor_parallel_size: field(
      "Tensor-parallel size",
      tpSelect,
      "One weights file per rank when above 1 (vllm format only).",
    ),
    storage: field(
      "Storage",
      storageSelect,
      "Where the artifact is stored; the backend must be configured on the server.",
    ),
  };
  const encryptField = h(
    "div",
    { class: "field checkbox" },
    encrypt,
    h(
      "label",
      { for: (encrypt.id = "encrypt") },
      "Encrypt the weights (a key per artifact; serving nodes need the keys:read scope)",
    ),
  );
  const note = h("p", { class: "hint" });
  const messages = h("div");
  const submit = h("button", { type: "submit" }, "Start tensorize job");
  const key = idempotencyKey();

  function fill(select, values, labels = {}) {
    const previous = select.value;
    replace(
      select,
      values.map((v) => h("option", { value: String(v) }, labels[v] ?? String(v))),
    );
    if (values.map(String).includes(previous)) select.value = previous;
  }

  function refresh() {
    const offers =
      workers === null
        ? [{ usable: true, dtypes: DTYPES, formats: [...makeableFormats(null)], maxTp: 1, encryption: true }]
        : workers.map(workerOffer).filter((o) => o.usable);
    note.textContent =
      workers === null
        ? "This token cannot see the workers: offering what every worker makes (format hf)."
        : `Offering what the ${offers.length} live worker(s) can run.`;
    const union = (prop) => [...new Set(offers.flatMap((o) => o[prop]))];
    fill(
      formatSelect,
      FORMATS.filter((f) => union("formats").includes(f)),
      FORMAT_LABELS,
    );
    fill(
      dtypeSelect,
      DTYPES.filter((d) => union("dtypes").includes(d)),
    );
    fill(tpSelect, tpChoices(offers, formatSelect.value));
    fill(storageSelect, ["", ...storage.configured], {
      "": `Server default (${storage.default})`,
    });
    const canEncrypt = offers.some((o) => o.encryption);
    encrypt.disabled = !canEncrypt;
    if (!canEncrypt) encrypt.checked = false;
    submit.disabled = !offers.length;
    if (!offers.length) note.textContent = "No live worker consumes the cpu or gpu queue.";
  }
  formatSelect.addEventListener("change", refresh);

  // A "Make it" link of the model page names the variant: preselect it, and say so when a
  // part of it cannot be made now (vllm without a worker that has vLLM, say).
  function preselect() {
    const asked = {
      dtype: ctx.query.get("dtype"),
      format: ctx.query.get("format"),
      tensor_parallel_size: ctx.query.get("tensor_parallel_size"),
    };
    const missing = [];
    const choose = (select, value) => {
      if (!value) return;
      if ([...select.options].some((o) => o.value === value)) select.value = value;
      else missing.push(value);
    };
    choose(dtypeSelect, asked.dtype);
    choose(formatSelect, asked.format);
    refresh(); // tensor-parallel choices depend on the format
    choose(tpSelect, asked.tensor_parallel_size);
    if (ctx.query.get("encrypt") === "true" && !encrypt.disabled) encrypt.checked = true;
    else if (ctx.query.get("encrypt") === "true") missing.push("encryption");
    if (missing.length)
      replace(
        messages,
        h(
          "p",
          { class: "notice", role: "alert" },
          `Not offered by the live workers: ${missing.join(", ")}. `,
          h("a", { href: "#/workers" }, "See the workers"),
        ),
      );
  }

  const form = h(
    "form",
    {
      class: "card",
      onsubmit: async (event) => {
        event.preventDefault();
        replace(messages);
        const body = {
          version: Number(versionSelect.value),
          dtype: dtypeSelect.value,
          format: formatSelect.value,
          tensor_parallel_size: Number(tpSelect.value),
          encrypt: encrypt.checked,
        };
        if (storageSelect.value) body.storage = storageSelect.value;
        await busy(submit, async () => {
          try {
            const { data } = await request(`/models/${id}/tensorize`, {
              method: "POST",
              body,
              headers: { "Idempotency-Key": [key, ...Object.values(body)].join(":") },
            });
            // 202: a job (queued or running); 200: a job that already finished, or the ready
            // artifact itself.
            if (data.kind) ctx.navigate(`/jobs/${data.id}`);
            else {
              replace(
                messages,
                h(
                  "div",
                  { class: "success", role: "status" },
                  h("p", {}, "This artifact is already ready. "),
                  h("a", { href: `#/models/${id}` }, "See how to serve it on the model page"),
                ),
              );
            }
          } catch (err) {
            replace(
              messages,
              err.missingRoute
                ? h(
                    "p",
                    { class: "notice", role: "alert" },
                    "This server cannot tensorize yet (no tensorize route).",
                  )
                : problemBox(err, { title: "Could not start the job" }),
            );
          }
        });
      },
    },
    note,
    fields.version,
    fields.dtype,
    fields.format,
    fields.tensor_parallel_size,
    encryptField,
    fields.storage,
    submit,
    messages,
  );
  refresh();
  preselect();
  ctx.root.append(form);
  if (workers?.length) {
    ctx.root.append(
      h(
        "p",
        { class: "hint" },
        "Live workers: ",
        workers.map((w) => w.hostname ?? w.id).join(", "),
        ". ",
        h("a", { href: "#/workers" }, "Details"),
      ),
    );
  }
}

// Merges one SSE event into the job: a whole job, a job-shaped patch, or bare progress.
export function mergeEvent(job, data) {
  if (!data || typeof data !== "object") return job;
  if (data.job && typeof data.job === "object") return { ...job, ...data.job };
  if ("status" in data || "progress" in data) {
    return { ...job, ...data, progress: { ...(job.progress ?? {}), ...(data.progress ?? {}) } };
  }
  if ("bytes_done" in data || "stage" in data)
    return { ...job, progress: { ...(job.progress ?? {}), ...data } };
  return job;
}

export async function jobView(ctx) {
  const [id] = ctx.params;
  let job = await api(`/jobs/${id}`, { signal: ctx.signal });
  ctx.setTitle(`Job ${job.kind}`);
  const live = new AbortController();
  ctx.signal.addEventListener("abort", () => live.abort(), { once: true });

  const statusLine = h("p", {
    class: "job-status",
    role: "status",
    "aria-live": "polite",
    "aria-atomic": "true",
  });
  const bar = h("progress", { id: "job-progress", max: "1", value: "0", "aria-label": "Job progress" });
  const barText = h("span");
  const props = h("dl", { class: "props" });
  const cancel = h("button", { type: "button", class: "danger" }, "Cancel job");
  const outcome = h("div");
  const streamNote = h("p", { class: "hint" });
  const samples = [];
  let spoken = "";

  cancel.addEventListener("click", () =>
    busy(cancel, async () => {
      try {
        const { data } = await request(`/jobs/${id}/cancel`, { method: "POST" });
        if (data && data.id) update(mergeEvent(job, data));
        announce("Cancellation requested");
      } catch (err) {
        replace(outcome, problemBox(err, { title: "Could not cancel" }));
      }
    }),
  );

  function throughput() {
    const now = performance.now();
    while (samples.length > 2 && now - samples[0].t > 10000) samples.shift();
    if (samples.length < 2) return null;
    const first = samples[0];
    const last = samples[samples.length - 1];
    const seconds = (last.t - first.t) / 1000;
    return seconds > 0 ? (last.bytes - first.bytes) / seconds : null;
  }

  async function showOutcome() {
    if (job.status === "failed") {
      const error = job.error ?? {};
      replace(
        outcome,
        h(
          "div",
          { class: "problem", role: "alert" },
          h("p", { class: "problem-title" }, error.title ?? "The job failed"),
          h("p", {}, error.detail ?? "No detail was recorded."),
          error.code ? h("p", { class: "problem-meta" }, "code ", h("code", {}, error.code)) : null,
        ),
      );
    } else if (job.status === "succeeded") {
      const links = [];
      const modelId =
        job.model_id ??
        (job.artifact_id ? (await api(`/artifacts/${job.artifact_id}`).catch(() => ({}))).model_id : null);
      if (modelId)
        links.push(
          h(
            "a",
            { class: "button-link", href: `#/models/${modelId}` },
            job.kind === "tensorize" ? "Serve it: open the model" : "Open the model",
          ),
        );
      replace(
        outcome,
        h(
          "div",
          { class: "success", role: "status" },
          h("p", { class: "problem-title" }, "The job succeeded"),
          links,
        ),
      );
    } else if (job.status === "cancelled") {
      replace(outcome, h("p", { class: "notice" }, "The job was cancelled."));
    }
  }

  function update(next) {
    const wasFinal = FINAL.has(job.status);
    job = next;
    const p = job.progress ?? {};
    const done = Number(p.bytes_done ?? 0);
    const total = p.bytes_total ? Number(p.bytes_total) : null;
    if (!samples.length || samples[samples.length - 1].bytes !== done)
      samples.push({ t: performance.now(), bytes: done });
    // Live: measured from the stream's samples. Finished: what the worker recorded (result
    // bytes_per_second), else bytes over the job's run time.
    const rate = FINAL.has(job.status)
      ? jobRate(job)
      : (p.bytes_per_second ?? p.throughput ?? throughput() ?? jobRate(job));
    const eta = total && rate ? (total - done) / rate : null;
    bar.max = Math.max(total ?? 1, 1);
    bar.value = job.status === "succeeded" ? bar.max : total ? done : 0;
    barText.textContent = total
      ? `${formatBytes(done)} of ${formatBytes(total)} (${Math.floor((100 * done) / total)}%)`
      : `${formatBytes(done)}`;
    // The live region speaks status and stage changes, not every byte count.
    const sentence = `Status: ${job.status}. Stage: ${p.stage ?? "–"}.`;
    if (sentence !== spoken) {
      spoken = sentence;
      replace(statusLine, badge(job.status), ` stage: ${p.stage ?? "–"}`);
    }
    const rows = [
      ["Kind", job.kind],
      ["Makes", jobMakes(job)],
      ["Storage", job.variant?.storage ?? "–"],
      ["Stage", p.stage ?? "–"],
      ["Transferred", total ? `${formatBytes(done)} of ${formatBytes(total)}` : formatBytes(done)],
      ["Throughput", rate ? `${formatBytes(rate)}/s` : "–"],
      ["Time left", eta !== null && !FINAL.has(job.status) ? formatDuration(eta) : "–"],
      ["Attempts", String(job.attempts ?? 0)],
      ["Created", time(job.created_at)],
      ["Started", time(job.started_at)],
      ["Finished", time(job.finished_at)],
    ];
    replace(
      props,
      rows.map(([k, v]) => [h("dt", {}, k), h("dd", { "data-prop": k }, v)]),
    );
    cancel.hidden = FINAL.has(job.status);
    if (FINAL.has(job.status) && !wasFinal) {
      live.abort();
      showOutcome();
    }
  }

  const model = job.model_id
    ? await api(`/models/${job.model_id}`, { signal: ctx.signal }).catch(() => null)
    : null;
  ctx.root.append(
    crumbs(["Models", "#/models"], model ? [model.name, `#/models/${model.id}`] : null, "job"),
    h("h1", {}, `${job.kind[0].toUpperCase()}${job.kind.slice(1)} job`),
    h("p", { class: "hint" }, "Job ", h("code", {}, job.id)),
    statusLine,
    h("div", { class: "total" }, bar, barText),
    props,
    h("div", { class: "actions" }, cancel),
    outcome,
    streamNote,
  );
  const initial = job;
  job = { status: null };
  update(initial);
  if (FINAL.has(job.status)) return;

  follow();

  async function follow() {
    let streaming = false;
    streamEvents(
      `/jobs/${id}/events`,
      (event) => {
        streaming = true;
        try {
          update(mergeEvent(job, JSON.parse(event.data)));
        } catch {
          // a keep-alive or a non-JSON event: nothing to show
        }
      },
      { signal: live.signal },
    )
      .catch((err) => {
        if (err.name === "AbortError") return;
        streamNote.textContent = err.missingRoute
          ? "Live events are not available on this server; polling instead."
          : `Live events stopped (${err.message}); polling instead.`;
      })
      .finally(() => {
        streaming = false;
      });

    // Polling backs the stream up: it catches a final state the stream missed, and it is the
    // only source when the stream is unavailable.
    while (!live.signal.aborted && !FINAL.has(job.status)) {
      await new Promise((resolve) => setTimeout(resolve, streaming ? 5000 : 1500));
      if (live.signal.aborted) break;
      try {
        update(mergeEvent(job, await api(`/jobs/${id}`, { signal: live.signal })));
      } catch (err) {
        if (err.name === "AbortError") break;
      }
    }
  }
}
