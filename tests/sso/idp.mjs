// A real OpenID Provider (panva's oidc-provider, OpenID Certified) on 127.0.0.1 for the SSO
// tests: one public client (PKCE), users with groups, and a plain login page.
//
//   node tests/sso/idp.mjs '<json config>'
//   config: {port, client_id, redirect_uris: [...], users: {name: {password, email, groups}},
//            id_token_ttl?}
// Prints "READY <issuer>" when listening. POST /test/users/<name> {"groups": [...]} changes a
// user's groups (what an admin removing someone from a group does); DELETE removes the user.
import { generateKeyPairSync } from "node:crypto";
import http from "node:http";
import Provider from "oidc-provider";

const config = JSON.parse(process.argv[2]);
const issuer = `http://127.0.0.1:${config.port}`;
const users = config.users;

const { privateKey } = generateKeyPairSync("rsa", { modulusLength: 2048 });
const jwk = { ...privateKey.export({ format: "jwk" }), kid: "test-key-1", use: "sig", alg: "RS256" };

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: config.client_id,
      token_endpoint_auth_method: "none",
      redirect_uris: config.redirect_uris,
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
    },
  ],
  jwks: { keys: [jwk] },
  cookies: { keys: ["idp-test-cookie-key"] },
  claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name", "groups"] },
  conformIdTokenClaims: false,
  features: { devInteractions: { enabled: false } },
  rotateRefreshToken: false,
  ttl: { IdToken: config.id_token_ttl ?? 3600, Session: 3600 },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  async findAccount(ctx, id) {
    if (!users[id]) return undefined;
    return {
      accountId: id,
      async claims() {
        const user = users[id];
        if (!user) return { sub: id };
        return { sub: id, email: user.email, email_verified: true, name: id, groups: user.groups };
      },
    };
  },
});

// Refresh grants re-read the account: a deleted user's grant stops (invalid_grant).
provider.on("grant.error", () => {});

function readBody(req) {
  return new Promise((resolve) => {
    let data = "";
    req.on("data", (chunk) => (data += chunk));
    req.on("end", () => resolve(data));
  });
}

const page = (uid, message = "") => `<!doctype html><html><head><title>Example IdP</title></head>
<body><h1>Example IdP sign-in</h1><p>${message}</p>
<form method="post" action="/interaction/${uid}/login">
<label>Username <input name="username" autocomplete="username"></label>
<label>Password <input name="password" type="password"></label>
<button type="submit">Continue</button></form></body></html>`;

async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.prompt.name === "consent") {
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: details.session.accountId, clientId: details.params.client_id });
    const missing = details.prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(" "));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    const grantId = await grant.save();
    return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true });
  }
  if (action === "login" && req.method === "POST") {
    const form = new URLSearchParams(await readBody(req));
    const name = form.get("username");
    if (!users[name] || users[name].password !== form.get("password")) {
      res.writeHead(200, { "content-type": "text/html" });
      return res.end(page(uid, "Wrong username or password."));
    }
    return provider.interactionFinished(req, res, { login: { accountId: name } }, { mergeWithLastSubmission: false });
  }
  res.writeHead(200, { "content-type": "text/html" });
  res.end(page(uid));
}

const callback = provider.callback();
const server = http.createServer(async (req, res) => {
  try {
    const url = new URL(req.url, issuer);
    const match = url.pathname.match(/^\/interaction\/([^/]+)(?:\/(login))?$/);
    if (match) return await interaction(req, res, match[1], match[2]);
    const admin = url.pathname.match(/^\/test\/users\/([^/]+)$/);
    if (admin) {
      if (req.method === "DELETE") delete users[admin[1]];
      else users[admin[1]] = { ...users[admin[1]], ...JSON.parse(await readBody(req)) };
      res.writeHead(204);
      return res.end();
    }
    return callback(req, res);
  } catch (err) {
    console.error(err);
    res.writeHead(500);
    res.end(String(err));
  }
});
server.listen(config.port, "127.0.0.1", () => console.log(`READY ${issuer}`));
