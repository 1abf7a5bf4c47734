// Images attached to user messages. A stored message names its images by id (`images: [id]`);
// the images themselves (data: URLs, exactly the bytes the user gave: nothing is re-encoded or
// downscaled) live in IndexedDB, whose quota is far beyond the few megabytes of localStorage
// that hold the conversations' text. An export carries the data URLs instead of the ids, so a
// file moves a conversation with its images to another browser.

import { newId } from "./store.js";

// One image's limit. Sent base64-encoded (4/3 of the bytes), it stays under the server's default
// --max-body-size of 16 MiB; tests/test_webui_static.py checks that.
export const MAX_IMAGE_MIB = 10;
const MAX_IMAGE_BYTES = MAX_IMAGE_MIB * 2 ** 20;

const DB_NAME = "lamplight";
const STORE = "images";
const loaded = new Map();  // id -> data URL: every image this page has read or written

// ---- reading files -----------------------------------------------------------------------------

// Why `file` cannot be attached, or null when it can.
export function imageProblem(file) {
  const name = file.name || "The pasted file";
  if (!file.type.startsWith("image/")) return `${name} is not an image (${file.type || "unknown type"}).`;
  if (file.size > MAX_IMAGE_BYTES) {
    return `${name} is ${(file.size / 2 ** 20).toFixed(1)} MiB: images over ${MAX_IMAGE_MIB} MiB are refused.`;
  }
  return null;
}

// A checked image file -> { id, url, name }, kept in memory until saveImages stores it.
export async function readImage(file) {
  const url = await new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
  const image = { id: `img-${newId()}`, url, name: file.name || "pasted image" };
  loaded.set(image.id, url);
  return image;
}

// The image files among `files` (a FileList or array), e.g. of a paste or a drop.
export function imageFiles(files) {
  return [...(files || [])].filter((file) => file.type.startsWith("image/"));
}

// ---- messages ----------------------------------------------------------------------------------

// The image ids of a stored message (tolerating hand-edited or older entries).
export function imagesOf(message) {
  return Array.isArray(message.images) ? message.images.filter((id) => typeof id === "string") : [];
}

// A user message's `content` as OpenAI's chat API takes images: a text part (left out when there
// is no text), then one image_url part per image.
export function contentParts(text, urls) {
  const parts = text.trim() ? [{ type: "text", text }] : [];
  return parts.concat(urls.map((url) => ({ type: "image_url", image_url: { url } })));
}

// The data URLs of `ids`, in order; an error naming the problem when one is no longer stored.
export async function imageUrls(ids) {
  const urls = await Promise.all(ids.map(imageUrl));
  if (urls.includes(null)) throw new Error("an image of this conversation is no longer in this browser's storage");
  return urls;
}

// ---- storage (IndexedDB) -----------------------------------------------------------------------

let database = null;
function openDatabase() {
  database ??= new Promise((resolve, reject) => {
    const request = indexedDB.open(DB_NAME, 1);
    request.onupgradeneeded = () => request.result.createObjectStore(STORE);
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
  return database;
}

function result(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

function committed(transaction) {
  return new Promise((resolve, reject) => {
    transaction.oncomplete = () => resolve();
    transaction.onerror = transaction.onabort = () => reject(transaction.error || new Error("aborted"));
  });
}

async function transaction(mode) {
  return (await openDatabase()).transaction(STORE, mode);
}

export async function saveImages(images) {
  if (!images.length) return;
  const writing = await transaction("readwrite");
  for (const { id, url } of images) writing.objectStore(STORE).put(url, id);
  await committed(writing);  // on disk before the conversation that names them is saved
}

// The data URL of `id` (from memory, else from storage), or null when it is not stored.
export async function imageUrl(id) {
  if (loaded.has(id)) return loaded.get(id);
  try {
    const url = await result((await transaction("readonly")).objectStore(STORE).get(id));
    if (typeof url !== "string") return null;
    loaded.set(id, url);
    return url;
  } catch {
    return null;
  }
}

// Deletes every stored image that no conversation names (a deleted conversation's, an image
// removed while editing a message).
export async function pruneImages(conversations) {
  const named = new Set(conversations.flatMap((c) => c.messages.flatMap(imagesOf)));
  const writing = await transaction("readwrite");
  const objects = writing.objectStore(STORE);
  for (const id of await result(objects.getAllKeys())) {
    if (!named.has(id)) {
      objects.delete(id);
      loaded.delete(id);
    }
  }
  await committed(writing);
}

// ---- export and import -------------------------------------------------------------------------

// Copies of `conversations` whose messages carry their images' data URLs instead of ids
// (an image no longer stored is left out).
export async function withImageData(conversations) {
  return Promise.all(conversations.map(async (conversation) => ({
    ...conversation,
    messages: await Promise.all(conversation.messages.map(async (message) => {
      const ids = imagesOf(message);
      if (!ids.length) return message;
      const urls = (await Promise.all(ids.map(imageUrl))).filter(Boolean);
      return { ...message, images: urls };
    })),
  })));
}

// The reverse, for an import: each data URL is stored under a new id that replaces it.
export async function storeImportedImages(conversations) {
  const found = [];
  const stored = conversations.map((conversation) => ({
    ...conversation,
    messages: conversation.messages.map((message) => {
      if (!Array.isArray(message.images)) return message;
      const ids = message.images.filter((url) => typeof url === "string" && url.startsWith("data:image/"))
        .map((url) => {
          const image = { id: `img-${newId()}`, url };
          found.push(image);
          loaded.set(image.id, url);
          return image.id;
        });
      return { ...message, images: ids };
    }),
  }));
  await saveImages(found);
  return stored;
}
