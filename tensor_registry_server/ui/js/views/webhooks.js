// Webhooks (#/webhooks): list, create (the secret shown once), delete; one webhook's deliveries
// (#/webhooks/{id}) with a Redeliver button on each, so nobody copies a delivery id by hand.
// Everything here reads /api/v1/webhooks as it is (docs/events.md). URLs and errors are
// tenant-controlled text: they go in through h(), as text.

import { api, auth, query } from "../api.js";
import { EVENT_TYPES } from "../vocabulary.js";
import {
  announce,
  badge,
  confirmButton,
  crumbs,
  field,
  h,
  nextId,
  problemBox,
  replace,
  showFieldErrors,
  snippet,
  table,
  time,
} from "../dom.js";


function stateOf(hook) {
  return hook.enabled ? "enabled" : "disabled";
}

function createForm(onCreated) {
  const namespace = h("input", { type: "text", name: "namespace", required: true, autocapitalize: "off", placeholder: "acme" });
  const url = h("input", { type: "url", name: "url", required: true, placeholder: "https://your-receiver/registry" });
  const description = h("input", { type: "text", name: "description", maxlength: "1000" });
  const boxes = EVENT_TYPES.map((type) => {
    const box = h("input", { type: "checkbox", name: "events", value: type, id: nextId("event") });
    return h("div", { class: "checkbox" }, box, h("label", { for: box.id }, h("code", {}, type)));
  });
  const fields = {
    namespace: field("Namespace", namespace, "The webhook receives this namespace's events."),
    url: field("URL", url, "Internal addresses (localhost, private ranges) need TENSOR_REGISTRY_FETCH__ALLOW on the server."),
    description: field("Description", description),
  };
  const messages = h("div");
  const submit = h("button", { type: "submit" }, "Create webhook");
  return h(
    "form",
    {
      class: "card",
      "aria-labelledby": "create-webhook",
      onsubmit: async (event) => {
        event.preventDefault();
        replace(messages);
        const events = boxes.map((b) => b.querySelector("input")).filter((b) => b.checked).map((b) => b.value);
        const body = { namespace: namespace.value.trim(), url: url.value.trim(), events, description: description.value };
        submit.disabled = true;
        try {
          const created = await api("/webhooks", { method: "POST", body });
          url.value = "";
          description.value = "";
          onCreated(created);
        } catch (err) {
          const rest = showFieldErrors(fields, err);
          if (err.code !== "validation_error" || rest.length) messages.append(problemBox(err, { title: "Could not create the webhook" }));
        } finally {
          submit.disabled = false;
        }
      },
    },
    h("h2", { id: "create-webhook" }, "Create a webhook"),
    fields.namespace,
    fields.url,
    h("fieldset", {}, h("legend", {}, "Events (none ticked: every type)"), boxes),
    fields.description,
    submit,
    messages,
  );
}

function secretOnce(created) {
  const done = h("button", { type: "button", class: "secondary" }, "I have stored it");
  const box = h(
    "section",
    { class: "success secret", "aria-labelledby": "webhook-secret", tabindex: "-1" },
    h("h2", { id: "webhook-secret" }, "Webhook created"),
    h("p", {}, h("strong", {}, "Copy the secret now: it is shown only this once."), " The receiver verifies each delivery with it."),
    snippet("secret", created.secret, { id: "new-webhook-secret" }),
    done,
  );
  done.addEventListener("click", () => box.remove());
  return box;
}

export async function webhooksView(ctx) {
  ctx.setTitle("Webhooks");
  const list = h("section", { "aria-labelledby": "webhooks-heading" });
  const secretSlot = h("div");
  ctx.root.append(
    h("h1", {}, "Webhooks"),
    h("p", { class: "hint" }, "Each webhook receives its namespace's events, signed per Standard Webhooks; failed deliveries are retried with backoff."),
    secretSlot,
    list,
  );
  const canWrite = auth.has("models:write");

  async function load() {
    const page = await api(`/webhooks${query({ limit: 500 })}`, { signal: ctx.signal });
    const rows = page.items.map((hook) =>
      h(
        "tr",
        { "data-webhook": hook.id },
        h("th", { scope: "row" }, h("a", { href: `#/webhooks/${hook.id}` }, h("span", { class: "truncate", title: hook.url }, hook.url))),
        h("td", {}, hook.namespace),
        h("td", {}, hook.events.length ? hook.events.join(", ") : "all"),
        h("td", {}, badge(stateOf(hook)), hook.disabled_reason ? h("span", { class: "reason truncate", title: hook.disabled_reason }, ` ${hook.disabled_reason}`) : ""),
        h("td", {}, String(hook.consecutive_failures)),
        h("td", {}, time(hook.created_at)),
        h(
          "td",
          {},
          canWrite
            ? confirmButton("Delete", `webhook ${hook.url}`, async () => {
                try {
                  await api(`/webhooks/${hook.id}`, { method: "DELETE" });
                  announce("Webhook deleted");
                  await load();
                } catch (err) {
                  list.append(problemBox(err, { title: "Could not delete the webhook" }));
                }
              })
            : "–",
        ),
      ),
    );
    replace(
      list,
      h("h2", { id: "webhooks-heading" }, "Webhooks"),
      table("Webhooks", ["URL", "Namespace", "Events", "State", "Failures", "Created", "Actions"], rows, {
        empty: "No webhook yet.",
      }),
    );
  }

  await load();
  if (canWrite) {
    ctx.root.append(
      createForm((created) => {
        const box = secretOnce(created);
        replace(secretSlot, box);
        box.focus();
        load();
      }),
    );
  }
}

function outcome(d) {
  if (d.last_status_code) return `HTTP ${d.last_status_code}`;
  return d.last_error ?? "–";
}

export async function webhookView(ctx) {
  const [id] = ctx.params;
  const hook = await api(`/webhooks/${id}`, { signal: ctx.signal });
  ctx.setTitle(`Webhook ${hook.url}`);
  const deliveries = h("section", { "aria-labelledby": "deliveries-heading" });
  const messages = h("div");
  ctx.root.append(
    crumbs(["Webhooks", "#/webhooks"], hook.url),
    h("h1", {}, "Webhook ", h("span", { class: "truncate", title: hook.url }, hook.url)),
    h(
      "dl",
      { class: "facts" },
      h("div", {}, h("dt", {}, "Namespace"), h("dd", {}, hook.namespace)),
      h("div", {}, h("dt", {}, "Events"), h("dd", {}, hook.events.length ? hook.events.join(", ") : "all")),
      h("div", {}, h("dt", {}, "State"), h("dd", {}, badge(stateOf(hook)), hook.disabled_reason ? ` ${hook.disabled_reason}` : "")),
      h("div", {}, h("dt", {}, "Failures in a row"), h("dd", {}, String(hook.consecutive_failures))),
    ),
    messages,
    deliveries,
  );
  const canWrite = auth.has("models:write");

  async function load() {
    const page = await api(`/webhooks/${id}/deliveries${query({ limit: 100 })}`, { signal: ctx.signal });
    const rows = page.items.map((d) => {
      const again = h("button", { type: "button", class: "secondary small", "aria-label": `Redeliver event ${d.event_id}` }, "Redeliver");
      again.addEventListener("click", async () => {
        again.disabled = true;
        try {
          await api(`/webhooks/${id}/deliveries/${d.id}/redeliver`, { method: "POST" });
          announce(`Event ${d.event_id} queued for redelivery`);
          await load();
        } catch (err) {
          replace(messages, problemBox(err, { title: "Could not redeliver" }));
          again.disabled = false;
        }
      });
      return h(
        "tr",
        { "data-delivery": d.id },
        h("th", { scope: "row" }, String(d.event_id)),
        h("td", {}, d.event_type),
        h("td", {}, badge(d.status)),
        h("td", {}, String(d.attempts)),
        h("td", {}, h("span", { class: "reason truncate", title: outcome(d) }, outcome(d))),
        h("td", {}, time(d.delivered_at ?? d.created_at)),
        h("td", {}, canWrite ? again : "–"),
      );
    });
    replace(
      deliveries,
      h("h2", { id: "deliveries-heading" }, "Deliveries"),
      table("Deliveries", ["Event", "Type", "Status", "Attempts", "Last answer", "At", "Actions"], rows, {
        empty: "No delivery yet: one is made for each matching event.",
      }),
    );
  }
  await load();
}
