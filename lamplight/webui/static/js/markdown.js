// Model output -> sanitised HTML. marked turns markdown into HTML (which may hold whatever HTML
// the model wrote); DOMPurify then removes every script, event handler and javascript: URL
// before anything reaches the page. highlight.js only ever sees text and escapes it.

import { Marked } from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.mjs";
import hljs from "../vendor/highlight.min.js";

const marked = new Marked({ gfm: true, breaks: true });
hljs.configure({ ignoreUnescapedHTML: true });

DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

export function renderMarkdown(element, text) {
  const html = marked.parse(text || "");
  element.innerHTML = DOMPurify.sanitize(html, { USE_PROFILES: { html: true }, FORBID_TAGS: ["style", "form"] });
  for (const code of element.querySelectorAll("pre > code")) decorateCode(code);
}

function decorateCode(code) {
  const language = /language-([\w+#-]+)/.exec(code.className)?.[1];
  if (language && hljs.getLanguage(language)) {
    code.innerHTML = hljs.highlight(code.textContent, { language }).value;
    code.classList.add("hljs");
  } else {
    hljs.highlightElement(code);
  }
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy-code";
  button.textContent = "Copy";
  button.addEventListener("click", () => copyText(code.textContent, button));
  code.parentElement.append(button);
}

export async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    // No clipboard API (a page served over plain http to another host): the old way.
    const area = Object.assign(document.createElement("textarea"), { value: text });
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }
  const label = button.textContent;
  button.textContent = "Copied";
  setTimeout(() => { button.textContent = label; }, 1200);
}
