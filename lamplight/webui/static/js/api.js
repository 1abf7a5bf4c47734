// Talking to the server: JSON requests with the API key, and the SSE stream of a chat completion.

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

function headers(apiKey) {
  const result = { "Content-Type": "application/json" };
  if (apiKey) result.Authorization = `Bearer ${apiKey}`;
  return result;
}

// Relative URLs, so the page also works behind a reverse proxy under a sub-path.
export async function getJson(path, apiKey) {
  const response = await request(path, { headers: headers(apiKey) });
  return response.json();
}

async function request(path, init) {
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(`Cannot reach the server (${error.message}). Is lamplight still running?`, 0);
  }
  if (!response.ok) throw new ApiError(await errorText(response), response.status);
  return response;
}

async function errorText(response) {
  const text = await response.text().catch(() => "");
  let message = text;
  try {
    const body = JSON.parse(text);
    message = (body.error && (body.error.message || body.error)) || body.message || text;
  } catch { /* not JSON: the text itself */ }
  if (response.status === 401) return `${message || "Unauthorized"}: set the server's API key in Settings.`;
  return `${response.status} ${response.statusText}: ${message || "no details"}`.trim();
}

// Yields each parsed chunk of /v1/chat/completions with stream: true. An error event in the
// stream (llama-server sends `data: {"error": ...}`) becomes an ApiError.
export async function* streamChat(body, { apiKey, signal }) {
  const response = await request("v1/chat/completions", {
    method: "POST", headers: headers(apiKey), body: JSON.stringify(body), signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = event.split("\n").filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart()).join("\n");
      if (!data) continue;  // keep-alive comments
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) {
        throw new ApiError(chunk.error.message || JSON.stringify(chunk.error), chunk.error.code || 500);
      }
      yield chunk;
    }
  }
}
