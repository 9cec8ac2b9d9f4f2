// Sign-in with the organisation's identity provider (OpenID Connect, docs/sso.md). The page
// keeps a PKCE verifier in this tab's session storage, goes to /api/v1/sso/login with its
// challenge, and comes back to #/sso?code=… (a one-time code, useless without the verifier),
// which it redeems for a session token. The provider's own tokens never reach the page.

import { ApiError, api } from "./api.js";
import { Sha256 } from "./sha256.js";

const VERIFIER_KEY = "tensor-registry.sso-verifier";

function base64url(bytes) {
  let text = "";
  for (const byte of bytes) text += String.fromCharCode(byte);
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function challengeOf(verifier) {
  const hash = new Sha256();
  hash.update(new TextEncoder().encode(verifier));
  const hex = hash.hex();
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  return base64url(bytes);
}

// {enabled, issuer}; a server without the route answers as "off".
export async function ssoConfig() {
  try {
    return await api("/sso/config", { token: null });
  } catch {
    return { enabled: false };
  }
}

export function startSso() {
  const verifier = base64url(crypto.getRandomValues(new Uint8Array(48)));
  sessionStorage.setItem(VERIFIER_KEY, verifier);
  const query = new URLSearchParams({ client: "web", code_challenge: challengeOf(verifier) });
  location.assign(`/api/v1/sso/login?${query}`);
}

const MESSAGES = {
  person_without_roles: "You signed in, but none of your groups gives you a role on this registry.",
  sso_denied: "The identity provider did not sign you in.",
  sso_id_token_invalid: "The identity provider's answer did not check out; sign-in refused.",
};

// On #/sso?code=… or ?error=…: the session token ({token}) or an error message ({error}).
export async function finishSso(query) {
  const verifier = sessionStorage.getItem(VERIFIER_KEY);
  sessionStorage.removeItem(VERIFIER_KEY);
  history.replaceState(null, "", "#/models");
  const error = query.get("error");
  if (error) return { error: MESSAGES[error] ?? `Sign-in failed (${error}).` };
  if (!verifier) return { error: "This sign-in was started in another tab; start again." };
  try {
    const session = await api("/sso/token", {
      method: "POST",
      body: { code: query.get("code"), code_verifier: verifier },
      token: null,
    });
    return { token: session.token };
  } catch (err) {
    return { error: err instanceof ApiError ? err.message : "Sign-in failed." };
  }
}
