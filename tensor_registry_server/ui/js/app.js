// The shell: sign-in, navigation, and a hash router (#/models/…), so that no route ever puts
// the token in a URL. Each view renders into a fresh element and gets an AbortSignal that
// fires when the user leaves it (streams and polls stop there).

import { ApiError, api, auth, onUnauthorized } from "./api.js";
import { field, h, problemBox, replace } from "./dom.js";
import { activityView } from "./views/activity.js";
import { auditView, tokensView, workersView } from "./views/admin.js";
import { nodesView, rolloutView } from "./views/fleet.js";
import { jobsView } from "./views/jobs.js";
import { limitsView } from "./views/limits.js";
import { modelView } from "./views/model.js";
import { modelsView } from "./views/models.js";
import { publishView } from "./views/publish.js";
import { finishSso, ssoConfig, startSso } from "./sso.js";
import { jobView, tensorizeView } from "./views/tensorize.js";
import { webhookView, webhooksView } from "./views/webhooks.js";

const routes = [
  [/^\/models$/, modelsView],
  [/^\/models\/([^/]+)$/, modelView],
  [/^\/models\/([^/]+)\/publish(?:\/(\d+))?$/, publishView],
  [/^\/models\/([^/]+)\/tensorize$/, tensorizeView],
  [/^\/models\/([^/]+)\/aliases\/([^/]+)\/rollout$/, rolloutView],
  [/^\/jobs$/, jobsView],
  [/^\/jobs\/([^/]+)$/, jobView],
  [/^\/activity$/, activityView],
  [/^\/tokens$/, tokensView],
  [/^\/workers$/, workersView],
  [/^\/nodes$/, nodesView],
  [/^\/webhooks$/, webhooksView],
  [/^\/webhooks\/([^/]+)$/, webhookView],
  [/^\/audit$/, auditView],
  [/^\/limits$/, limitsView],
];

const main = document.getElementById("main");
let leave = new AbortController();
// On the first page load the browser's own focus start (the skip link) is kept.
let routed = false;

export function navigate(path) {
  if (location.hash === `#${path}`) render();
  else location.hash = path;
}

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/models";
  const [path, search = ""] = raw.split("?");
  return { path: path || "/models", query: new URLSearchParams(search) };
}

function updateChrome(path) {
  const signedIn = Boolean(auth.self);
  document.getElementById("nav").hidden = !signedIn;
  document.getElementById("session").hidden = !signedIn;
  document.getElementById("whoami").textContent = signedIn
    ? `Signed in as ${auth.self.name} (${auth.self.scopes.join(", ")})`
    : "";
  for (const link of document.querySelectorAll("#nav a")) {
    const scope = link.dataset.scope;
    link.parentElement.hidden = Boolean(scope) && !auth.has(scope);
    if (path.startsWith(`/${link.dataset.section}`)) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
}

function mount(title) {
  const root = h("div", { class: "view" });
  replace(main, root);
  document.title = title ? `${title} · tensor-registry` : "tensor-registry";
  return root;
}

// After a route change, focus the new page's heading so screen readers announce it, unless
// the user already moved focus into the page while it was still loading.
function focusHeading(root) {
  if (root.contains(document.activeElement)) return;
  const heading = root.querySelector("h1");
  if (heading) {
    heading.setAttribute("tabindex", "-1");
    heading.focus({ preventScroll: false });
  }
}

async function render() {
  leave.abort();
  leave = new AbortController();
  const { path, query } = parseHash();
  if (path === "/sso") {
    const result = await finishSso(query);
    if (result.token) {
      try {
        auth.signIn(result.token, await api("/tokens/self", { token: result.token }));
      } catch {
        auth.signOut();
      }
    }
    ssoError = result.error ?? null;
    return render();
  }
  if (!auth.token || !auth.self) {
    if (auth.token && !auth.self && (await restoreSession())) return render();
    updateChrome(path);
    signInView(mount("Sign in"));
    routed = true;
    return;
  }
  updateChrome(path);
  for (const [pattern, view] of routes) {
    const match = path.match(pattern);
    if (!match) continue;
    const root = mount(null);
    const ctx = { root, params: match.slice(1), query, signal: leave.signal, navigate, setTitle };
    // Busy until the view has drawn all it loads (assistive tech and tests wait for this).
    root.setAttribute("aria-busy", "true");
    try {
      await view(ctx);
    } catch (err) {
      if (err?.name === "AbortError") return;
      root.append(problemBox(err));
    } finally {
      root.removeAttribute("aria-busy");
    }
    if (!leave.signal.aborted && routed) focusHeading(root);
    routed = true;
    return;
  }
  const root = mount("Not found");
  root.append(
    h("h1", {}, "Page not found"),
    h("p", {}, "There is no page at this address. ", h("a", { href: "#/models" }, "Go to the models")),
  );
  if (routed) focusHeading(root);
  routed = true;
}

function setTitle(title) {
  document.title = `${title} · tensor-registry`;
}

async function restoreSession() {
  try {
    auth.self = await api("/tokens/self");
    return true;
  } catch {
    auth.signOut();
    return false;
  }
}

// The message of a sign-in with the identity provider that did not work, shown once.
let ssoError = null;

async function ssoOption(root) {
  const config = await ssoConfig();
  const message = ssoError;
  ssoError = null;
  if (!config.enabled && !message) return;
  const box = h("div", { class: "card narrow" });
  if (message) box.append(h("p", { role: "alert", class: "error" }, message));
  if (config.enabled) {
    box.append(
      h("p", {}, "Or sign in with your organisation's account; the registry gives you the roles your groups hold."),
      h("button", { type: "button", onclick: () => startSso() }, "Sign in with SSO"),
    );
  }
  root.append(box);
}

function signInView(root) {
  const input = h("input", {
    type: "password",
    name: "token",
    autocomplete: "current-password",
    required: true,
    spellcheck: "false",
  });
  const tokenField = field(
    "API token",
    input,
    "Kept in this tab's session storage until you sign out or close the tab.",
  );
  const errors = h("div");
  const submit = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form",
    {
      class: "card narrow",
      onsubmit: async (event) => {
        event.preventDefault();
        replace(errors);
        const token = input.value.trim();
        if (!token) {
          tokenField.setError("Paste an API token, e.g. the admin token printed by `tensor-registry serve`.");
          input.focus();
          return;
        }
        submit.disabled = true;
        try {
          const self = await api("/tokens/self", { token });
          auth.signIn(token, self);
          input.value = "";
          render();
        } catch (err) {
          const message =
            err instanceof ApiError && err.status === 401
              ? "This token is unknown, revoked or expired."
              : null;
          tokenField.setError(message ?? "");
          if (!message) errors.append(problemBox(err, { title: "Could not sign in" }));
          input.focus();
        } finally {
          submit.disabled = false;
        }
      },
    },
    tokenField,
    submit,
    errors,
  );
  root.append(
    h("h1", {}, "Sign in"),
    h("p", {}, "Sign in with an API token. The token is sent only in the Authorization header of API calls."),
    form,
  );
  input.focus();
  ssoOption(root);
}

onUnauthorized.add(() => {
  auth.signOut();
  render();
});

document.getElementById("sign-out").addEventListener("click", () => {
  auth.signOut();
  location.hash = "#/models";
  render();
});

// The skip link targets #main, which the router would read as a route.
document.getElementById("skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  main.focus();
});

// A file dropped outside the drop zone must not make the browser navigate away.
for (const type of ["dragover", "drop"]) {
  window.addEventListener(type, (event) => {
    if (!event.target.closest?.(".dropzone")) event.preventDefault();
  });
}

window.addEventListener("hashchange", render);
render();
