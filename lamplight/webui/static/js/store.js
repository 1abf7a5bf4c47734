// Conversations live in the browser's localStorage: one JSON array, saved whole on each change
// (a chat history is small next to localStorage's few megabytes, and one key keeps saves atomic).
// Attached images are not in it: a message names them by id, images.js keeps them in IndexedDB.

const KEY = "lamplight.conversations";

export function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

export function loadConversations() {
  try {
    const parsed = JSON.parse(localStorage.getItem(KEY) || "[]");
    return Array.isArray(parsed) ? parsed.filter(isConversation) : [];
  } catch {
    return [];  // a corrupt entry must not stop the page from opening
  }
}

export function saveConversations(conversations) {
  localStorage.setItem(KEY, JSON.stringify(conversations));
}

export function createConversation() {
  const now = Date.now();
  return { id: newId(), title: "New chat", created: now, updated: now, messages: [] };
}

export function titleFrom(text) {
  const line = text.trim().split("\n")[0];
  return line.length > 48 ? line.slice(0, 47) + "\u2026" : line || "New chat";
}

export function matches(conversation, query) {
  const needle = query.trim().toLowerCase();
  if (!needle) return true;
  return conversation.title.toLowerCase().includes(needle)
    || conversation.messages.some((m) => (m.content || "").toLowerCase().includes(needle));
}

export function exportJson(conversations) {
  return JSON.stringify({ format: "lamplight-conversations", version: 1, conversations }, null, 2);
}

// Accepts our export, or a bare array of conversations. Imported conversations whose id is
// already here get a new id, so an import never overwrites what the user has.
export function importJson(text, existing) {
  const parsed = JSON.parse(text);
  const list = Array.isArray(parsed) ? parsed : parsed && parsed.conversations;
  if (!Array.isArray(list)) throw new Error("not a conversations export: no \"conversations\" list");
  const valid = list.filter(isConversation);
  if (!valid.length) throw new Error("the file holds no conversations");
  const taken = new Set(existing.map((c) => c.id));
  return valid.map((c) => ({ ...c, id: taken.has(c.id) ? newId() : c.id }));
}

function isConversation(c) {
  return c && typeof c.id === "string" && typeof c.title === "string" && Array.isArray(c.messages);
}
