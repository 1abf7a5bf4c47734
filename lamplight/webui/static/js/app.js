// The chat page: conversations in the sidebar, the selected one in the middle, a streaming
// reply at the bottom. State lives here; store.js persists it (images.js the attached images),
// api.js talks to the server.

import { ApiError, getJson, streamChat } from "./api.js";
import {
  contentParts, imageFiles, imageProblem, imageUrl, imageUrls, imagesOf, pruneImages, readImage, saveImages,
  storeImportedImages, withImageData,
} from "./images.js";
import { copyText, renderMarkdown } from "./markdown.js";
import {
  SAMPLER_FIELDS, displayValue, loadSettings, parseCustom, parseValue, requestFields, saveSettings,
} from "./settings.js";
import {
  createConversation, exportJson, importJson, loadConversations, matches, saveConversations, titleFrom,
} from "./store.js";

const $ = (id) => document.getElementById(id);
const state = {
  conversations: loadConversations(),
  currentId: null,
  settings: loadSettings(),
  serverDefaults: {},  // default_generation_settings.params from /props
  needsApiKey: false,
  vision: false,  // /props modalities.vision: the model takes images
  pending: [],  // images attached in the composer, not sent yet: { id, url, name }
  generation: null,  // { controller, conversationId } while a reply streams
};

// ---- server status -------------------------------------------------------------------------

async function connect() {
  try {
    const props = await getJson("props", state.settings.apiKey);
    state.serverDefaults = props.default_generation_settings?.params || {};
    $("model-name").textContent = props.model_alias || "";
    state.vision = props.modalities?.vision === true;
    $("attach").hidden = !state.vision;
    showBanner(null);
  } catch (error) {
    if (error.status === 503) {
      showBanner("Loading the model\u2026", "info");
      setTimeout(connect, 1000);
    } else if (error.status === 401) {
      state.needsApiKey = true;
      showBanner("This server requires an API key: enter it in Settings.");
    } else {
      showBanner(error.message);
      setTimeout(connect, 3000);
    }
  }
}

function showBanner(text, kind = "error") {
  const banner = $("banner");
  banner.hidden = !text;
  banner.textContent = text || "";
  banner.className = kind;
}

// ---- conversations ---------------------------------------------------------------------------

const current = () => state.conversations.find((c) => c.id === state.currentId) || null;

function persist() {
  try {
    saveConversations(state.conversations);
  } catch (error) {
    showBanner(`Could not save conversations in this browser: ${error.message}`);
  }
}

function selectConversation(id) {
  state.currentId = id;
  localStorage.setItem("lamplight.current", id || "");
  renderSidebar();
  renderMessages();
  closeSidebarOnPhone();
}

function newConversation() {
  selectConversation(null);
  $("input").focus();
}

function ensureConversation() {
  let conversation = current();
  if (!conversation) {
    conversation = createConversation();
    state.conversations.unshift(conversation);
    state.currentId = conversation.id;
    localStorage.setItem("lamplight.current", conversation.id);
  }
  return conversation;
}

function deleteConversation(id) {
  const conversation = state.conversations.find((c) => c.id === id);
  if (!conversation || !confirm(`Delete "${conversation.title}"?`)) return;
  if (state.generation?.conversationId === id) stopGeneration();
  state.conversations = state.conversations.filter((c) => c.id !== id);
  persist();
  pruneStoredImages();
  selectConversation(state.currentId === id ? null : state.currentId);
}

function startRename(item, conversation) {
  const input = Object.assign(document.createElement("input"), { value: conversation.title, className: "rename" });
  const title = item.querySelector(".conversation-title");
  title.replaceWith(input);
  input.focus();
  input.select();
  const finish = (keep) => {
    if (keep && input.value.trim()) {
      conversation.title = input.value.trim();
      persist();
    }
    renderSidebar();
    renderTitle();
  };
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter") finish(true);
    if (event.key === "Escape") finish(false);
  });
  input.addEventListener("blur", () => finish(true));
  input.addEventListener("click", (event) => event.stopPropagation());
}

function renderSidebar() {
  const list = $("conversation-list");
  list.replaceChildren();
  const query = $("search").value;
  const shown = state.conversations.filter((c) => matches(c, query))
    .sort((a, b) => b.updated - a.updated);
  for (const conversation of shown) {
    const item = document.createElement("li");
    item.dataset.id = conversation.id;
    item.classList.toggle("active", conversation.id === state.currentId);
    const title = Object.assign(document.createElement("span"), { className: "conversation-title", textContent: conversation.title });
    const rename = button("Rename", () => startRename(item, conversation), "rename-conversation");
    const remove = button("Delete", () => deleteConversation(conversation.id), "delete-conversation");
    item.append(title, rename, remove);
    item.addEventListener("click", () => selectConversation(conversation.id));
    list.append(item);
  }
  if (!shown.length && query) {
    list.append(Object.assign(document.createElement("li"), { className: "muted", textContent: "No match" }));
  }
}

function button(label, onClick, className = "") {
  const element = Object.assign(document.createElement("button"), { type: "button", textContent: label, className });
  element.addEventListener("click", (event) => {
    event.stopPropagation();
    onClick(event);
  });
  return element;
}

function renderTitle() {
  const conversation = current();
  $("title").textContent = conversation ? conversation.title : "New chat";
  document.title = conversation ? `${conversation.title} \u2014 lamplight` : "lamplight";
}

// ---- messages ------------------------------------------------------------------------------

function renderMessages() {
  renderTitle();
  const box = $("messages");
  const conversation = current();
  box.replaceChildren();
  if (!conversation || !conversation.messages.length) {
    box.append(Object.assign(document.createElement("p"), { id: "empty", className: "muted", textContent: "Send a message to start a conversation." }));
    return;
  }
  conversation.messages.forEach((message, index) => box.append(messageElement(message, index)));
  box.scrollTop = box.scrollHeight;
}

function messageElement(message, index) {
  const element = document.createElement("article");
  element.className = `message ${message.role}`;
  element.dataset.index = index;
  fillMessage(element, message, index);
  return element;
}

function fillMessage(element, message, index) {
  const streaming = state.generation && state.generation.message === message;
  element.replaceChildren();
  element.append(Object.assign(document.createElement("div"), { className: "role", textContent: message.role }));
  if (message.reasoning) {
    const details = document.createElement("details");
    details.className = "reasoning";
    details.open = Boolean(streaming && !message.content);  // open while thinking, folded after
    details.append(Object.assign(document.createElement("summary"), { textContent: streaming && !message.content ? "Thinking\u2026" : "Reasoning" }),
      Object.assign(document.createElement("div"), { className: "reasoning-text", textContent: message.reasoning }));
    element.append(details);
  }
  const images = imagesOf(message);
  if (images.length) element.append(imageStrip(images));
  const content = document.createElement("div");
  content.className = "content";
  if (message.role === "user") content.textContent = message.content;
  else renderMarkdown(content, message.content);
  if (streaming) content.classList.add("typing");
  element.append(content);
  if (message.progress) {
    element.append(Object.assign(document.createElement("div"), { className: "progress", textContent: message.progress }));
  }
  if (message.stopped) {
    element.append(Object.assign(document.createElement("div"), { className: "stopped", textContent: "Stopped." }));
  }
  if (message.error) {
    const error = Object.assign(document.createElement("div"), { className: "error", textContent: message.error });
    error.setAttribute("role", "alert");
    element.append(error);
  }
  if (!streaming) element.append(messageActions(message, index));
}

function messageActions(message, index) {
  const actions = document.createElement("div");
  actions.className = "actions";
  actions.append(Object.assign(document.createElement("span"), { className: "stats", textContent: statsText(message.timings) }));
  const copy = button("Copy", () => copyText(message.content, copy), "copy-message");
  actions.append(copy);
  if (message.role === "user") actions.append(button("Edit", () => startEdit(index), "edit-message"));
  if (message.role === "assistant") actions.append(button("Regenerate", () => regenerate(index), "regenerate"));
  return actions;
}

function statsText(timings) {
  if (!timings) return "";
  const rate = (n) => (Number.isFinite(n) ? n.toFixed(1) : "?");
  return `${timings.predicted_n} tokens, ${rate(timings.predicted_per_second)} tokens/s \u00b7 `
    + `prompt ${timings.prompt_n} tokens, ${rate(timings.prompt_per_second)} tokens/s`;
}

function startEdit(index) {
  if (state.generation) return;
  const conversation = current();
  const element = $("messages").querySelector(`[data-index="${index}"]`);
  const editor = document.createElement("div");
  editor.className = "editor";
  let images = imagesOf(conversation.messages[index]);  // re-sent unless removed here
  const strip = document.createElement("div");
  const removeImage = (id) => {
    images = images.filter((kept) => kept !== id);
    strip.replaceChildren(imageStrip(images, removeImage));
  };
  strip.replaceChildren(imageStrip(images, removeImage));
  const area = Object.assign(document.createElement("textarea"), { value: conversation.messages[index].content });
  const actions = document.createElement("div");
  actions.className = "actions";
  actions.append(button("Cancel", () => renderMessages()), button("Send", () => {
    if (!area.value.trim() && !images.length) return;
    conversation.messages.splice(index);  // this message and everything after it
    send(area.value, images);
  }, "primary resend"));
  editor.append(strip, area, actions);
  element.replaceChildren(editor);
  area.focus();
}

// ---- images ------------------------------------------------------------------------------------

// Thumbnails of stored images (by id); a click shows one full size. With `onRemove`, each has a
// remove button instead (the composer's pending images, a message being edited).
function imageStrip(ids, onRemove = null) {
  const strip = document.createElement("div");
  strip.className = "images";
  for (const id of ids) {
    const image = Object.assign(document.createElement("img"), { alt: "attached image" });
    image.dataset.imageId = id;
    imageUrl(id).then((url) => {
      if (url) image.src = url;
      else image.alt = "(image no longer stored in this browser)";
    });
    const thumb = document.createElement("span");
    thumb.className = "thumb";
    if (onRemove) {
      const remove = button("\u00d7", () => onRemove(id), "remove-image");
      remove.setAttribute("aria-label", "Remove image");
      thumb.append(image, remove);
    } else {
      const view = button("", () => viewImage(image.src), "view-image");
      view.setAttribute("aria-label", "View full size");
      view.append(image);
      thumb.append(view);
    }
    strip.append(thumb);
  }
  return strip;
}

function viewImage(url) {
  if (!url) return;
  $("viewer-image").src = url;
  $("image-viewer").showModal();
}

function renderAttachments() {
  const box = $("attachments");
  box.hidden = !state.pending.length;
  box.replaceChildren(imageStrip(state.pending.map((image) => image.id), removePending));
}

function removePending(id) {
  state.pending = state.pending.filter((image) => image.id !== id);
  showNotice(null);
  renderAttachments();
}

const NO_VISION = "This model cannot take images (the server has no vision projector: start it with --mmproj).";

// Attaches the image files among a pick, a paste or a drop; says why any other file is refused.
async function attachFiles(files) {
  if (!files.length) return;
  if (!state.vision) return showNotice(NO_VISION);
  const problems = [];
  for (const file of files) {
    const problem = imageProblem(file);
    if (problem) problems.push(problem);
    else state.pending.push(await readImage(file));
  }
  showNotice(problems.join(" ") || null);
  renderAttachments();
}

function showNotice(text) {
  $("composer-notice").hidden = !text;
  $("composer-notice").textContent = text || "";
}

// A paste of image files attaches them. Where the clipboard also holds plain text (a spreadsheet
// copies its cells as text and as a picture of them, a file manager a file's name) the text pastes
// too, and a model without vision quietly gets the text alone: the user removes what was not meant.
function onPaste(event) {
  const data = event.clipboardData;
  const images = imageFiles(data?.files);
  if (!images.length) return;
  const withText = Boolean(data.getData("text/plain"));
  if (!withText) event.preventDefault();
  if (state.vision || !withText) attachFiles(images);
}

const draggingFiles = (event) => [...(event.dataTransfer?.types || [])].includes("Files");

function onDragOver(event) {
  if (!draggingFiles(event)) return;  // dragged text goes into the textarea as usual
  event.preventDefault();
  $("composer").classList.add("dropping");
}

function onDragLeave(event) {
  if (!$("composer").contains(event.relatedTarget)) $("composer").classList.remove("dropping");
}

function onDrop(event) {
  if (!draggingFiles(event)) return;
  event.preventDefault();
  $("composer").classList.remove("dropping");
  attachFiles([...event.dataTransfer.files]);
}

// Files dropped beside the composer would make the browser open them in place of the chat.
function ignoreStrayDrop(event) {
  if (draggingFiles(event)) event.preventDefault();
}

function pruneStoredImages() {
  pruneImages(state.conversations).catch(() => {});  // storage unavailable: nothing was stored either
}

function regenerate(index) {
  if (state.generation) return;
  current().messages.splice(index);  // drop this reply (and anything after), ask again
  persist();
  renderMessages();
  generate();
}

// ---- generation ----------------------------------------------------------------------------

function sendFromComposer() {
  if (state.generation) return;
  const pending = state.pending;
  if (!send($("input").value, pending.map((image) => image.id))) return;
  state.pending = [];
  showNotice(null);
  renderAttachments();
  saveImages(pending).catch((error) => {
    showBanner(`Could not keep the images in this browser (they are sent, but lost on reload): ${error.message}`);
  });
}

// Adds a user message (`images`: ids of images already in memory or storage) and asks for a reply.
function send(text, images = []) {
  if (state.generation || (!text.trim() && !images.length)) return false;
  const conversation = ensureConversation();
  if (!conversation.messages.length) conversation.title = titleFrom(text.trim() ? text : "Image");
  const message = { role: "user", content: text };
  if (images.length) message.images = images;
  conversation.messages.push(message);
  $("input").value = "";
  persist();
  renderSidebar();
  renderMessages();
  generate();
  return true;
}

// The request body, images as data URLs (read from storage: hence async).
async function requestBody(history, fields) {
  const messages = await Promise.all(history.filter((m) => !m.error || m.content).map(async (m) => {
    const images = imagesOf(m);
    // Text-only messages stay plain strings: the request of a text chat is as it always was.
    return { role: m.role, content: images.length ? contentParts(m.content, await imageUrls(images)) : m.content };
  }));
  if (state.settings.system.trim()) messages.unshift({ role: "system", content: state.settings.system });
  return { ...fields, messages, stream: true, return_progress: true,
    timings_per_token: false, stream_options: { include_usage: true } };
}

async function generate() {
  const conversation = current();
  const history = conversation.messages.slice();
  let fields;
  const reply = { role: "assistant", content: "", reasoning: "" };
  try {
    fields = requestFields(state.settings);
  } catch (error) {
    reply.error = error.message;  // bad custom JSON: say so where the reply would have been
  }
  conversation.messages.push(reply);
  const element = messageElement(reply, conversation.messages.length - 1);
  $("messages").querySelector("#empty")?.remove();
  $("messages").append(element);
  if (!fields) return finishReply(conversation, reply, element);
  const controller = new AbortController();
  state.generation = { controller, conversationId: conversation.id, message: reply };
  setBusy(true);
  fillMessage(element, reply, conversation.messages.length - 1);
  try {
    const body = await requestBody(history, fields);
    for await (const chunk of streamChat(body, { apiKey: state.settings.apiKey, signal: controller.signal })) {
      applyChunk(reply, chunk);
      scheduleRender(element, reply, conversation);
    }
  } catch (error) {
    if (error.name === "AbortError") reply.stopped = true;
    else reply.error = error instanceof ApiError ? error.message : `Error: ${error.message}`;
    if (error.status === 401) state.needsApiKey = true;
  }
  finishReply(conversation, reply, element);
}

function applyChunk(reply, chunk) {
  const delta = chunk.choices?.[0]?.delta || {};
  if (delta.content) reply.content += delta.content;
  if (delta.reasoning_content) reply.reasoning += delta.reasoning_content;
  if (chunk.timings) reply.timings = chunk.timings;
  const progress = chunk.prompt_progress;
  if (progress && progress.total) {
    const done = progress.processed;  // cached tokens included, as llama-server counts them
    reply.progress = `Reading the prompt: ${Math.round((100 * done) / progress.total)}% (${done}/${progress.total} tokens)`;
  }
  if (delta.content || delta.reasoning_content) reply.progress = "";
}

let renderQueued = false;
function scheduleRender(element, reply, conversation) {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    if (state.generation?.message !== reply) return;
    fillMessage(element, reply, conversation.messages.indexOf(reply));
    if (state.currentId === conversation.id) followBottom();
  });
}

function followBottom() {
  const box = $("messages");
  if (box.scrollHeight - box.scrollTop - box.clientHeight < 120) box.scrollTop = box.scrollHeight;
}

function finishReply(conversation, reply, element) {
  state.generation = null;
  reply.progress = "";
  if (!reply.reasoning) delete reply.reasoning;
  conversation.updated = Date.now();
  persist();
  setBusy(false);
  if (state.currentId === conversation.id) {
    fillMessage(element, reply, conversation.messages.indexOf(reply));
    followBottom();
  }
  renderSidebar();
}

function stopGeneration() {
  state.generation?.controller.abort();  // closing the connection frees the slot on the server
}

function setBusy(busy) {
  $("send").hidden = busy;
  $("stop").hidden = !busy;
}

// ---- settings dialog -----------------------------------------------------------------------

function openSettings() {
  const { settings, serverDefaults } = state;
  $("api-key-row").hidden = !(state.needsApiKey || settings.apiKey);
  $("api-key").value = settings.apiKey;
  $("system-message").value = settings.system;
  $("custom-json").value = settings.custom;
  $("settings-error").hidden = true;
  const grid = $("sampler-fields");
  grid.replaceChildren();
  for (const [name, label, kind] of SAMPLER_FIELDS) {
    const value = name in settings.overrides ? settings.overrides[name] : serverDefaults[name];
    const input = Object.assign(document.createElement("input"), {
      name, value: displayValue(value, kind), inputMode: kind === "list" ? "text" : "decimal",
    });
    input.dataset.kind = kind;
    input.dataset.default = displayValue(serverDefaults[name], kind);
    const row = document.createElement("label");
    row.append(label, input);
    grid.append(row);
  }
  $("settings").showModal();
}

function saveSettingsFromDialog(event) {
  event.preventDefault();
  const overrides = {};
  try {
    for (const input of $("sampler-fields").querySelectorAll("input")) {
      // A field left at the server's default is not sent: the server applies its own.
      if (input.value.trim() === input.dataset.default || (!input.value.trim() && !input.dataset.default)) continue;
      overrides[input.name] = parseValue(input.value, input.dataset.kind);
    }
    parseCustom($("custom-json").value);
  } catch (error) {
    $("settings-error").textContent = error.message;
    $("settings-error").hidden = false;
    return;
  }
  const keyChanged = $("api-key").value !== state.settings.apiKey;
  state.settings = { apiKey: $("api-key").value.trim(), system: $("system-message").value, overrides, custom: $("custom-json").value };
  saveSettings(state.settings);
  $("settings").close();
  if (keyChanged) connect();
}

function resetSettings() {
  for (const input of $("sampler-fields").querySelectorAll("input")) input.value = input.dataset.default;
  $("custom-json").value = "";
}

// ---- theme, sidebar on phones, import/export ---------------------------------------------

const THEMES = ["auto", "light", "dark"];

function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  $("theme").textContent = theme;
  const dark = theme === "dark" || (theme === "auto" && matchMedia("(prefers-color-scheme: dark)").matches);
  $("hljs-light").disabled = dark;
  $("hljs-dark").disabled = !dark;
}

function cycleTheme() {
  const next = THEMES[(THEMES.indexOf(document.documentElement.dataset.theme) + 1) % THEMES.length];
  localStorage.setItem("lamplight.theme", next);
  applyTheme(next);
}

function toggleSidebar(open) {
  $("app").classList.toggle("sidebar-open", open);
  $("backdrop").hidden = !open;
}

function closeSidebarOnPhone() {
  toggleSidebar(false);
}

async function exportConversations() {
  const blob = new Blob([exportJson(await withImageData(state.conversations))], { type: "application/json" });
  const link = Object.assign(document.createElement("a"), {
    href: URL.createObjectURL(blob), download: `lamplight-conversations-${new Date().toISOString().slice(0, 10)}.json`,
  });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

async function importConversations(event) {
  const file = event.target.files[0];
  event.target.value = "";
  if (!file) return;
  try {
    const imported = await storeImportedImages(importJson(await file.text(), state.conversations));
    state.conversations.push(...imported);
    persist();
    showBanner(`Imported ${imported.length} conversation${imported.length === 1 ? "" : "s"}.`, "info");
    selectConversation(imported[0].id);
  } catch (error) {
    showBanner(`Import failed: ${error.message}`);
  }
}

// ---- wiring --------------------------------------------------------------------------------

function onComposerKey(event) {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    sendFromComposer();
  }
}

function onGlobalKey(event) {
  if (event.key === "Escape" && state.generation && !$("settings").open && !$("image-viewer").open) {
    event.preventDefault();
    stopGeneration();
  }
}

function start() {
  applyTheme(localStorage.getItem("lamplight.theme") || "auto");
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => applyTheme(document.documentElement.dataset.theme));
  const remembered = localStorage.getItem("lamplight.current");
  state.currentId = state.conversations.some((c) => c.id === remembered) ? remembered : null;
  $("composer").addEventListener("submit", (event) => { event.preventDefault(); sendFromComposer(); });
  $("attach-input").addEventListener("change", (event) => {
    attachFiles([...event.target.files]);
    event.target.value = "";  // the same file can be picked again
  });
  $("composer").addEventListener("paste", onPaste);
  $("composer").addEventListener("dragover", onDragOver);
  $("composer").addEventListener("dragleave", onDragLeave);
  $("composer").addEventListener("drop", onDrop);
  document.addEventListener("dragover", ignoreStrayDrop);
  document.addEventListener("drop", ignoreStrayDrop);
  $("image-viewer").addEventListener("click", () => $("image-viewer").close());
  $("input").addEventListener("keydown", onComposerKey);
  document.addEventListener("keydown", onGlobalKey);
  $("stop").addEventListener("click", stopGeneration);
  $("new-chat").addEventListener("click", newConversation);
  $("search").addEventListener("input", renderSidebar);
  $("export").addEventListener("click", exportConversations);
  $("import").addEventListener("change", importConversations);
  $("theme").addEventListener("click", cycleTheme);
  $("open-settings").addEventListener("click", openSettings);
  $("settings-form").addEventListener("submit", saveSettingsFromDialog);
  $("cancel-settings").addEventListener("click", () => $("settings").close());
  $("reset-settings").addEventListener("click", resetSettings);
  $("toggle-sidebar").addEventListener("click", () => toggleSidebar(!$("app").classList.contains("sidebar-open")));
  $("backdrop").addEventListener("click", () => toggleSidebar(false));
  renderSidebar();
  renderMessages();
  connect();
  pruneStoredImages();
  $("input").focus();
}

start();
