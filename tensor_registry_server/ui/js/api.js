// The only module that talks to the server: the public /api/v1 routes, with the bearer token
// kept in sessionStorage (never in a URL). Errors become ApiError carrying the problem+json body.

const BASE = "/api/v1";
const TOKEN_KEY = "tensor-registry.token";

export const auth = {
  get token() {
    return sessionStorage.getItem(TOKEN_KEY);
  },
  // GET /tokens/self of the current token: {name, scopes, namespaces, ...}.
  self: null,
  signIn(token, self) {
    sessionStorage.setItem(TOKEN_KEY, token);
    this.self = self;
  },
  signOut() {
    sessionStorage.removeItem(TOKEN_KEY);
    this.self = null;
  },
  has(scope) {
    const scopes = this.self?.scopes ?? [];
    return scopes.includes("admin") || scopes.includes(scope);
  },
};

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
    this.code = problem.code || `http_${status}`;
    this.requestId = problem.request_id || null;
  }

  // A route that this server does not have (yet): FastAPI's own 404, not a domain 404 such
  // as model_not_found. Views use it to say "not available on this server".
  get missingRoute() {
    return this.status === 404 && this.code === "not_found";
  }
}

async function problemOf(response) {
  const text = await response.text().catch(() => "");
  try {
    const body = JSON.parse(text);
    if (body && typeof body === "object") {
      return { ...body, request_id: body.request_id ?? response.headers.get("x-request-id") };
    }
  } catch {
    // not JSON: a proxy error page, for instance
  }
  return {
    title: response.statusText || `HTTP ${response.status}`,
    detail: text.slice(0, 300) || `The server answered ${response.status}.`,
    request_id: response.headers.get("x-request-id"),
  };
}

function networkError(err) {
  return new ApiError(0, {
    code: "network_error",
    title: "Network error",
    detail: `Could not reach the server (${err.message}).`,
  });
}

function authHeaders(token = auth.token) {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// Listeners for 401 answers (the app signs out and shows the sign-in form).
export const onUnauthorized = new Set();

export async function request(path, { method = "GET", body, headers = {}, signal, token } = {}) {
  const init = {
    method,
    headers: { Accept: "application/json", ...authHeaders(token), ...headers },
    signal,
    cache: "no-store",
  };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let response;
  try {
    response = await fetch(BASE + path, init);
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw networkError(err);
  }
  if (!response.ok) {
    const error = new ApiError(response.status, await problemOf(response));
    if (response.status === 401 && token === undefined) onUnauthorized.forEach((fn) => fn(error));
    throw error;
  }
  const data = response.status === 204 ? null : await response.json();
  return { status: response.status, data, headers: response.headers };
}

export async function api(path, options) {
  return (await request(path, options)).data;
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// The bytes of one stored file as text (the model card); the caller bounds the size.
export async function readText(path, { signal } = {}) {
  let response;
  try {
    response = await fetch(BASE + path, { headers: authHeaders(), signal, cache: "no-store" });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw networkError(err);
  }
  if (!response.ok) throw new ApiError(response.status, await problemOf(response));
  return new TextDecoder().decode(await response.arrayBuffer());
}

// Path segments of a file inside a version, each escaped, '/' kept between them.
export function filePath(path) {
  return path.split("/").map(encodeURIComponent).join("/");
}

// PUT one file's bytes with upload progress (fetch has no upload progress events).
export function uploadFile(path, file, { sha256, onProgress, signal } = {}) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", BASE + path);
    for (const [name, value] of Object.entries(authHeaders())) xhr.setRequestHeader(name, value);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.setRequestHeader("Accept", "application/json");
    if (sha256) xhr.setRequestHeader("X-Content-SHA256", sha256);
    xhr.upload.onprogress = (event) => onProgress?.(event.loaded);
    xhr.onload = () => {
      let body;
      try {
        body = JSON.parse(xhr.responseText);
      } catch {
        body = { detail: xhr.responseText.slice(0, 300) };
      }
      if (xhr.status >= 200 && xhr.status < 300) resolve(body);
      else {
        body.request_id ??= xhr.getResponseHeader("x-request-id");
        const error = new ApiError(xhr.status, body);
        if (xhr.status === 401) onUnauthorized.forEach((fn) => fn(error));
        reject(error);
      }
    };
    xhr.onerror = () => reject(networkError(new Error("the upload was interrupted")));
    xhr.onabort = () => reject(new DOMException("The upload was cancelled.", "AbortError"));
    signal?.addEventListener("abort", () => xhr.abort(), { once: true });
    xhr.send(file);
  });
}

// Server-sent events over fetch (EventSource cannot send an Authorization header).
// Calls onEvent({event, data, id}) per event; resolves when the server closes the stream.
export async function streamEvents(path, onEvent, { signal } = {}) {
  let response;
  try {
    response = await fetch(BASE + path, {
      headers: { Accept: "text/event-stream", ...authHeaders() },
      signal,
      cache: "no-store",
    });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw networkError(err);
  }
  if (!response.ok) throw new ApiError(response.status, await problemOf(response));
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { event: "message", data: [], id: null };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const lines = buffer.split(/\r\n|\r|\n/);
    buffer = lines.pop();
    for (const line of lines) {
      if (line === "") {
        if (event.data.length) onEvent({ ...event, data: event.data.join("\n") });
        event = { event: "message", data: [], id: null };
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let text = colon < 0 ? "" : line.slice(colon + 1);
        if (text.startsWith(" ")) text = text.slice(1);
        if (field === "data") event.data.push(text);
        else if (field === "event") event.event = text;
        else if (field === "id") event.id = text;
      }
    }
  }
}
