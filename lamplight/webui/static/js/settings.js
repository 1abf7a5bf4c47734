// User settings, kept in localStorage: the API key, the system message, sampler values the user
// changed from the server's defaults (only those are sent: the server applies its own otherwise),
// and custom JSON merged into every request body (e.g. a grammar).

const KEY = "lamplight.settings";

// [request field, label, kind]; kind "int" | "float" | "list" (comma-separated strings).
export const SAMPLER_FIELDS = [
  ["n_predict", "Max tokens (-1: no limit)", "int"],
  ["temperature", "Temperature", "float"],
  ["dynatemp_range", "Dynamic temp. range", "float"],
  ["dynatemp_exponent", "Dynamic temp. exponent", "float"],
  ["top_k", "Top-k", "int"],
  ["top_p", "Top-p", "float"],
  ["min_p", "Min-p", "float"],
  ["typical_p", "Typical-p", "float"],
  ["top_n_sigma", "Top-n\u03c3", "float"],
  ["xtc_probability", "XTC probability", "float"],
  ["xtc_threshold", "XTC threshold", "float"],
  ["repeat_last_n", "Repeat last n", "int"],
  ["repeat_penalty", "Repeat penalty", "float"],
  ["presence_penalty", "Presence penalty", "float"],
  ["frequency_penalty", "Frequency penalty", "float"],
  ["dry_multiplier", "DRY multiplier", "float"],
  ["dry_base", "DRY base", "float"],
  ["dry_allowed_length", "DRY allowed length", "int"],
  ["dry_penalty_last_n", "DRY penalty last n", "int"],
  ["mirostat", "Mirostat (0, 1, 2)", "int"],
  ["mirostat_tau", "Mirostat tau", "float"],
  ["mirostat_eta", "Mirostat eta", "float"],
  ["seed", "Seed (-1: random)", "int"],
  ["samplers", "Sampler order", "list"],
];

export function loadSettings() {
  try {
    const stored = JSON.parse(localStorage.getItem(KEY) || "{}");
    return { apiKey: "", system: "", overrides: {}, custom: "", ...stored };
  } catch {
    return { apiKey: "", system: "", overrides: {}, custom: "" };
  }
}

export function saveSettings(settings) {
  localStorage.setItem(KEY, JSON.stringify(settings));
}

// /props reports float32 values (0.800000011920929); show them as the user typed them.
export function displayValue(value, kind) {
  if (value === undefined || value === null) return "";
  if (kind === "list") return Array.isArray(value) ? value.join(", ") : String(value);
  if (kind === "int" && value === 4294967295) return "-1";  // the seed's "random"
  return kind === "float" ? String(Number(Number(value).toPrecision(6))) : String(value);
}

export function parseValue(text, kind) {
  const trimmed = text.trim();
  if (kind === "list") return trimmed.split(",").map((s) => s.trim()).filter(Boolean);
  const number = Number(trimmed);
  if (trimmed === "" || !Number.isFinite(number) || (kind === "int" && !Number.isInteger(number))) {
    throw new Error(`not ${kind === "int" ? "an integer" : "a number"}: "${text}"`);
  }
  return number;
}

export function parseCustom(text) {
  if (!text.trim()) return {};
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch (error) {
    throw new Error(`Custom request fields: invalid JSON (${error.message})`);
  }
  if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) {
    throw new Error("Custom request fields: must be a JSON object");
  }
  return parsed;
}

// The request body's extra fields: changed sampler values, then the custom JSON on top.
export function requestFields(settings) {
  return { ...settings.overrides, ...parseCustom(settings.custom) };
}
