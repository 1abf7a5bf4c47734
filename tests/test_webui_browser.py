"""The chat page in a real browser: headless Chromium (Debian's `chromium`) driven by Playwright,
against a real `lamplight serve` subprocess on a tiny random-weight model. Where the tiny model's
random text is not enough, the page's own custom request fields force the output with a grammar,
as a user could. Screenshots of the main states go to test-artifacts/webui/ (git-ignored).

Skipped, with the reason, where Playwright or Chromium is missing; `.ci/run` installs both."""

from __future__ import annotations

import json
import os
import base64
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import httpx
import pytest
from tiny_gguf import write_tiny_llama

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (pip install playwright)")
CHROMIUM = os.environ.get("LAMPLIGHT_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
if not os.path.exists(CHROMIUM):
    pytest.skip("Chromium is not installed (apt-get install chromium); .ci/run installs it",
                allow_module_level=True)

# Chromium as the issue asks: no sandbox (root in CI), no GPU, and no traffic of its own.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "webui"
TIMEOUT_MS = 30_000

# Model output forced by a grammar: markdown, a code block, and three ways to try to run script.
MARKDOWN_REPLY = (
    "# Report\n\nSome **bold** text.\n\n```python\ndef answer():\n    return 42\n```\n\n"
    '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
    "[click](javascript:window.__xss=3)\n"
)


def gbnf_literal(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`lamplight serve` on one slot, long enough context for a reply to be stopped mid-way."""
    yield from _serve(tmp_path_factory, write_tiny_llama(tmp_path_factory.mktemp("webui") / "tiny.gguf", n_ctx=2048))


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory):
    """A larger random model read in 256-token steps: a long prompt takes a few frames per step
    (the tiny one reads 1,200 tokens in about 30 ms, faster than the page draws two frames)."""
    model = write_tiny_llama(tmp_path_factory.mktemp("webui-slow") / "slow.gguf", n_ctx=2048, n_embd=512, n_layers=8)
    yield from _serve(tmp_path_factory, model, "-ub", "256")


def _serve(tmp_path_factory, model, *flags: str):
    port = free_port()
    log = open(tmp_path_factory.mktemp("log") / "serve.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "lamplight.cli", "serve", "-m", str(model), "--host", "127.0.0.1",
                                "--port", str(port), "-np", "1", "-c", "2048", *flags],
                               stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_healthy(url, process, log)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def _wait_until_healthy(url: str, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + 180  # the native kernels may be built on a fresh machine
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"lamplight serve exited: {log.read()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("lamplight serve did not become healthy")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser, server):
    """A fresh browser profile (empty localStorage) on the chat page, connected to the server."""
    yield from _page(browser, server)


@pytest.fixture
def slow_page(browser, slow_server):
    yield from _page(browser, slow_server)


def _page(browser, server, before_open=None):
    context = browser.new_context(viewport={"width": 1100, "height": 760}, accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    if before_open:
        before_open(page)
    open_chat(page, server)
    yield page
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def open_chat(page, url: str) -> None:
    page.goto(url + "/")
    page.wait_for_function("document.getElementById('model-name').textContent !== ''")


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"))


def change_settings(page, custom: dict | None = None, fields: dict | None = None, system: str | None = None) -> None:
    page.click("#open-settings")
    for name, value in (fields or {}).items():
        page.fill(f"#sampler-fields input[name={name}]", str(value))
    if system is not None:
        page.fill("#system-message", system)
    if custom is not None:
        page.fill("#custom-json", json.dumps(custom))
    page.click("#save-settings")
    page.wait_for_selector("#settings", state="hidden")


def send(page, text: str) -> None:
    page.fill("#input", text)
    page.press("#input", "Enter")


def wait_for_reply(page, index: int = 1):
    """The finished reply at message `index`: its actions row appears once streaming ends."""
    return page.wait_for_selector(f'.message.assistant[data-index="{index}"] .actions')


def test_send_stream_reload_regenerate_and_edit(page, server):
    assert page.locator("#messages .message").count() == 0  # a new page: an empty conversation
    screenshot(page, "00-empty")
    change_settings(page, custom={"n_predict": 300, "ignore_eos": True})  # long enough to watch it grow
    page.evaluate("""() => {
        window.__lengths = new Set();
        new MutationObserver(() => {
            const reply = document.querySelector('.message.assistant .content');
            if (reply) window.__lengths.add(reply.textContent.length);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
    }""")
    send(page, "Hello there")
    wait_for_reply(page)
    assert page.evaluate("window.__lengths.size") > 3  # streamed: the reply grew in place, step by step
    reply = page.inner_text('.message.assistant[data-index="1"] .content')
    stats = page.inner_text('.message.assistant[data-index="1"] .stats')
    assert reply.strip() and "tokens/s" in stats and "prompt" in stats
    assert page.inner_text("#conversation-list li .conversation-title") == "Hello there"
    screenshot(page, "01-reply-streamed")

    page.reload()
    page.wait_for_selector('.message.assistant[data-index="1"]')
    assert page.inner_text('.message.assistant[data-index="1"] .content') == reply  # kept in the browser

    page.click('.message.assistant[data-index="1"] .regenerate')
    wait_for_reply(page)
    assert page.locator(".message").count() == 2

    page.click('.message.user[data-index="0"] .edit-message')
    page.fill('.message.user[data-index="0"] textarea', "Edited question")
    page.click('.message.user[data-index="0"] .resend')
    wait_for_reply(page)
    assert page.inner_text('.message.user[data-index="0"] .content') == "Edited question"
    assert page.locator(".message").count() == 2


def test_stop_mid_stream_frees_the_slot(page, server):
    change_settings(page, custom={"n_predict": 1800, "ignore_eos": True})
    send(page, "Write a long story")
    page.wait_for_function("document.querySelector('.message.assistant .content')?.textContent.length > 20")
    assert page.is_visible("#stop")
    page.keyboard.press("Escape")
    page.wait_for_selector(".message.assistant .stopped")
    assert page.is_visible("#send") and not page.is_visible("#stop")
    assert page.inner_text(".message.assistant .stats") == ""  # no timings: it never finished
    screenshot(page, "02-stopped")
    deadline = time.monotonic() + 10
    while any(slot["is_processing"] for slot in httpx.get(server + "/slots").json()):
        assert time.monotonic() < deadline, "the slot is still busy after Stop"
        time.sleep(0.05)
    decoded = httpx.get(server + "/slots").json()[0]["next_token"][0]["n_decoded"]
    assert decoded < 1800


def test_markdown_code_and_model_html_stays_inert(page):
    grammar = "root ::= " + gbnf_literal(MARKDOWN_REPLY)
    change_settings(page, custom={"grammar": grammar, "n_predict": 400})
    send(page, "Render something")
    wait_for_reply(page)
    content = page.locator(".message.assistant .content")
    assert content.locator("h1").inner_text() == "Report"
    assert content.locator("strong").inner_text() == "bold"
    assert content.locator("pre code.hljs .hljs-keyword").first.inner_text() == "def"
    assert content.locator("pre .copy-code").count() == 1
    # The script, the event handler and the javascript: link are gone; nothing ran.
    assert content.locator("script").count() == 0
    assert content.locator("[onerror]").count() == 0
    assert content.locator('a[href^="javascript"]').count() == 0
    page.wait_for_timeout(200)
    assert page.evaluate("window.__xss") is None
    screenshot(page, "03-markdown-code-xss")


def test_copy_buttons_copy_the_code_and_the_reply(page, server):
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server)
    grammar = "root ::= " + gbnf_literal(MARKDOWN_REPLY)
    change_settings(page, custom={"grammar": grammar, "n_predict": 400})
    send(page, "Render something")
    wait_for_reply(page)
    code = page.locator(".message.assistant .content pre code")
    copy = page.locator(".message.assistant .content pre .copy-code")
    assert copy.inner_text() == "Copy"
    copy.click()
    page.wait_for_function("document.querySelector('.copy-code').textContent === 'Copied'")  # the feedback
    clipboard = page.evaluate("navigator.clipboard.readText()")
    assert clipboard == code.evaluate("element => element.textContent")
    assert clipboard.rstrip("\n") == "def answer():\n    return 42"  # the code only, not the button's label
    page.wait_for_function("document.querySelector('.copy-code').textContent === 'Copy'")  # and back

    page.click(".message.assistant .copy-message")  # the reply's own Copy: its markdown source
    page.wait_for_function("document.querySelector('.message.assistant .copy-message').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == MARKDOWN_REPLY


PROGRESS_TEXT = re.compile(r"Reading the prompt: (\d+)% \((\d+)/(\d+) tokens\)")


def test_prompt_progress_is_shown_while_a_long_prompt_is_read(slow_page):
    page = slow_page
    # ~1200 prompt tokens (this tokenizer has few merges: about one a character) are read in
    # 256-token steps (slow_server), each sending a progress chunk; a MutationObserver records
    # every text the page shows for them. A follow-up then starts from the cached conversation.
    page.evaluate("""() => {
        window.__progress = [];
        new MutationObserver(() => {
            for (const element of document.querySelectorAll('#messages .progress')) {
                if (window.__progress.at(-1) !== element.textContent) window.__progress.push(element.textContent);
            }
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
    }""")
    change_settings(page, custom={"n_predict": 4})
    send(page, "Summarise: " + "lorem ipsum " * 100)
    wait_for_reply(page)
    first = _progress_shown(page)
    (total,) = {total for _, total in first}
    read = int(re.search(r"prompt (\d+) tokens", page.inner_text(".message.assistant .stats")).group(1))
    cached = total - read  # the chat template's first tokens may still be in the slot from another test
    assert read > 1024 and 0 <= cached < 50
    assert any(cached < done < total for done, _ in first), first  # shown while the prompt was being read
    assert page.locator("#messages .progress").count() == 0  # and gone once the reply came

    page.evaluate("window.__progress = []")
    send(page, "And now in one word: " + "dolor sit amet " * 25)
    wait_for_reply(page, index=3)
    second = _progress_shown(page)
    # The cached conversation counts as read: never past 100%, never fewer tokens than the first prompt.
    assert all(total <= done <= later_total for done, later_total in second), second


def _progress_shown(page) -> list[tuple[int, int]]:
    """(tokens read, prompt tokens) of each progress text the page showed; each one well-formed."""
    shown = []
    for text in page.evaluate("window.__progress"):
        match = PROGRESS_TEXT.fullmatch(text)
        assert match, text
        percent, done, total = map(int, match.groups())
        assert 0 <= done <= total and percent == round(100 * done / total), text
        shown.append((done, total))
    assert shown, "no prompt progress was shown"
    return shown


def test_settings_are_seeded_from_props_and_reach_the_server(page, server):
    page.click("#open-settings")
    assert page.input_value("#sampler-fields input[name=temperature]") == "0.8"
    assert page.input_value("#sampler-fields input[name=top_k]") == "40"
    screenshot(page, "04-settings")
    page.click("#cancel-settings")
    change_settings(page, fields={"temperature": "0.3", "top_k": "7"}, system="You are terse.",
                    custom={"n_predict": 8})
    with page.expect_request("**/v1/chat/completions") as request:
        send(page, "Hi")
    body = request.value.post_data_json
    assert body["messages"][0] == {"role": "system", "content": "You are terse."}
    assert "top_p" not in body  # left at the server's default: not sent
    wait_for_reply(page)
    params = httpx.get(server + "/slots").json()[0]["params"]
    assert params["temperature"] == pytest.approx(0.3) and params["top_k"] == 7 and params["n_predict"] == 8
    assert page.inner_text(".message.assistant .stats").startswith("8 tokens")


def test_conversations_rename_search_export_import_delete(page, browser, server, tmp_path):
    change_settings(page, custom={"n_predict": 4})
    send(page, "First conversation")
    wait_for_reply(page)
    page.click("#new-chat")
    send(page, "Second conversation")
    wait_for_reply(page)
    page.click("#conversation-list li.active .rename-conversation")
    page.fill("#conversation-list input.rename", "Renamed")
    page.press("#conversation-list input.rename", "Enter")
    assert page.inner_text("#title") == "Renamed"
    page.fill("#search", "first")
    assert page.locator("#conversation-list .conversation-title").all_inner_texts() == ["First conversation"]
    page.fill("#search", "")
    with page.expect_download() as download:
        page.click("#export")
    exported = tmp_path / "export.json"
    download.value.save_as(exported)
    saved = json.loads(exported.read_text())["conversations"]
    assert sorted(c["title"] for c in saved) == ["First conversation", "Renamed"]

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#conversation-list li.active .delete-conversation")
    assert page.locator("#conversation-list li").count() == 1

    fresh = browser.new_context()
    other = fresh.new_page()
    open_chat(other, server)
    other.set_input_files("#import", str(exported))
    other.wait_for_selector("#conversation-list li >> nth=1")
    assert sorted(other.locator("#conversation-list .conversation-title").all_inner_texts()) == \
        ["First conversation", "Renamed"]
    assert "Imported 2 conversations" in other.inner_text("#banner")
    fresh.close()


def test_errors_are_shown(page):
    change_settings(page, custom={"temperature": "hot"})  # the server's 400 names the field
    send(page, "Hi")
    error = page.wait_for_selector(".message.assistant .error")
    assert "400" in error.inner_text() and "temperature" in error.inner_text()
    screenshot(page, "05-error-400")

    change_settings(page, custom={})
    page.route("**/v1/chat/completions", lambda route: route.abort())  # the server is unreachable
    send(page, "Again")
    error = page.wait_for_selector('.message.assistant[data-index="3"] .error')
    assert "Cannot reach the server" in error.inner_text()
    page.unroute("**/v1/chat/completions")

    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=401, content_type="application/json",
        body=json.dumps({"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}})))
    send(page, "With a key")
    error = page.wait_for_selector('.message.assistant[data-index="5"] .error')
    assert "API key" in error.inner_text()
    page.click("#open-settings")
    assert page.is_visible("#api-key")  # the field shows once the server asked for a key
    page.click("#cancel-settings")

    page.click("#open-settings")  # bad JSON is caught in the dialog, before any request
    page.fill("#custom-json", "{not json")
    page.click("#save-settings")
    assert "invalid JSON" in page.inner_text("#settings-error")


def test_reasoning_progress_theme_and_phone_layout(page):
    # A reply with reasoning_content and prompt progress, as a reasoning model's stream sends them.
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}], "prompt_progress": {"total": 100, "cache": 0, "processed": 40, "time_ms": 5}},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "The user greets me. "}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "I greet back."}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hello!"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
         "timings": {"prompt_n": 100, "prompt_ms": 50, "prompt_per_second": 2000, "predicted_n": 3,
                     "predicted_ms": 30, "predicted_per_second": 100}},
    ]
    stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"Content-Type": "text/event-stream"}, body=stream))
    send(page, "Hi")
    wait_for_reply(page)
    reasoning = page.locator(".message.assistant details.reasoning")
    assert not reasoning.evaluate("element => element.open")  # folded once the answer came
    reasoning.locator("summary").click()
    assert reasoning.locator(".reasoning-text").inner_text() == "The user greets me. I greet back."
    assert page.inner_text(".message.assistant .content") == "Hello!"
    assert page.inner_text(".message.assistant .stats").startswith("3 tokens, 100.0 tokens/s")
    screenshot(page, "06-reasoning")

    page.click("#theme")  # auto -> light -> dark
    page.click("#theme")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    screenshot(page, "07-dark")
    page.set_viewport_size({"width": 390, "height": 800})
    sidebar_hidden = "document.getElementById('sidebar').getBoundingClientRect().right <= 0"
    page.wait_for_function(sidebar_hidden)  # a drawer, off screen until asked for
    screenshot(page, "08-phone")
    page.click("#toggle-sidebar")
    page.wait_for_timeout(250)  # the drawer slides in
    screenshot(page, "09-phone-sidebar")
    page.click("#backdrop", position={"x": 370, "y": 400})
    page.wait_for_function(sidebar_hidden)


# ---- images (issue 23) ---------------------------------------------------------------------------
# The tiny model has no vision projector: the page is told it has one by routing /props, and the
# chat request is answered with a canned stream where a test checks what the page sends. The real
# server's refusal of an image is tested as such.


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG, small enough to pass to the page inline."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))  # filter byte 0 per row
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


RED, GREEN, BLUE = png(64, 48, (220, 30, 30)), png(40, 40, (30, 180, 60)), png(30, 60, (40, 70, 220))


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def file_spec(name: str, content: bytes | None = None, kind: str = "image/png", size: int = 0) -> dict:
    """A file for the page to build: `content`, or `size` zero bytes made in the page (a big file
    need not cross from Python)."""
    return {"name": name, "type": kind, "b64": base64.b64encode(content).decode() if content else "", "size": size}


# Builds a DataTransfer holding the files (and text) and dispatches `kind` on `selector`; returns
# whether the page took the event (preventDefault).
DISPATCH_JS = """([selector, kind, files, text]) => {
    const transfer = new DataTransfer();
    for (const f of files) {
        const bytes = f.b64 ? Uint8Array.from(atob(f.b64), (c) => c.charCodeAt(0)) : new Uint8Array(f.size);
        transfer.items.add(new File([bytes], f.name, {type: f.type}));
    }
    if (text) transfer.setData('text/plain', text);
    const target = document.querySelector(selector);
    const init = {bubbles: true, cancelable: true};
    if (kind === 'paste') return !target.dispatchEvent(new ClipboardEvent('paste', {...init, clipboardData: transfer}));
    target.dispatchEvent(new DragEvent('dragover', {...init, dataTransfer: transfer}));
    return !target.dispatchEvent(new DragEvent('drop', {...init, dataTransfer: transfer}));
}"""


def paste(page, files: list[dict], text: str | None = None) -> bool:
    return page.evaluate(DISPATCH_JS, ["#input", "paste", files, text])


def drop(page, files: list[dict], selector: str = "#input") -> bool:
    return page.evaluate(DISPATCH_JS, [selector, "drop", files, None])


def attach(page, name: str, content: bytes) -> None:
    page.set_input_files("#attach-input", files=[{"name": name, "mimeType": "image/png", "buffer": content}])


def image_sources(page, selector: str) -> list[str]:
    """The data URLs shown by the images under `selector`, once every one has loaded."""
    page.wait_for_function("""(selector) => {
        const images = [...document.querySelectorAll(selector + ' img')];
        return images.length && images.every((image) => image.complete && image.naturalWidth > 0);
    }""", arg=selector)
    return page.eval_on_selector_all(selector + " img", "images => images.map((image) => image.src)")


STORED_IMAGES_JS = """() => new Promise((resolve, reject) => {
    const opening = indexedDB.open('lamplight');
    opening.onerror = () => reject(opening.error);
    opening.onsuccess = () => {
        const counting = opening.result.transaction('images').objectStore('images').count();
        counting.onsuccess = () => resolve(counting.result);
    };
})"""


def wait_for_stored_images(page, count: int) -> None:
    """Waits until the page's IndexedDB holds `count` images (pruning runs in the background)."""
    deadline = time.monotonic() + 10
    while (stored := page.evaluate(STORED_IMAGES_JS)) != count:
        assert time.monotonic() < deadline, f"{stored} images stored, expected {count}"
        time.sleep(0.05)


def _props_with_vision(route) -> None:
    try:
        response = route.fetch()
        props = response.json()
    except sync_api.Error:  # the page closed while its /props was on the way (a test ending): no one to answer
        return
    props["modalities"] = {**props.get("modalities", {}), "vision": True}
    route.fulfill(response=response, json=props)


@pytest.fixture
def vision_page(browser, server):
    """The chat page, told by /props that the model takes images."""
    yield from _page(browser, server, before_open=lambda page: page.route("**/props", _props_with_vision))


class CannedChat:
    """Answers /v1/chat/completions with a short stream and keeps each request body."""

    def __init__(self, page, reply: str = "A coloured rectangle."):
        self.bodies: list[dict] = []
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": reply}}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
        self.stream = "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"
        page.route("**/v1/chat/completions", self.answer)

    def answer(self, route) -> None:
        self.bodies.append(route.request.post_data_json)
        route.fulfill(status=200, headers={"Content-Type": "text/event-stream"}, body=self.stream)

    def last_user_content(self):
        return [m for m in self.bodies[-1]["messages"] if m["role"] == "user"][-1]["content"]


def image_part(image: bytes) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(image)}}


def test_images_attach_paste_drop_thumbnails_and_removal(vision_page):
    page = vision_page
    assert page.is_visible("#attach")
    attach(page, "red.png", RED)
    page.wait_for_selector("#attachments .thumb")
    assert paste(page, [file_spec("green.png", GREEN)])  # an image-only paste is the page's to take
    page.wait_for_function("document.querySelectorAll('#attachments .thumb').length === 2")
    drop(page, [file_spec("blue.png", BLUE), file_spec("notes.txt", b"hello", kind="text/plain")])
    page.wait_for_function("document.querySelectorAll('#attachments .thumb').length === 3")
    assert image_sources(page, "#attachments") == [data_url(RED), data_url(GREEN), data_url(BLUE)]
    assert page.inner_text("#composer-notice") == "notes.txt is not an image (text/plain)."
    screenshot(page, "10-images-pending")

    page.click("#attachments .thumb:nth-child(2) .remove-image")
    page.wait_for_function("document.querySelectorAll('#attachments .thumb').length === 2")
    assert image_sources(page, "#attachments") == [data_url(RED), data_url(BLUE)]

    drop(page, [file_spec("huge.png", size=11 * 2**20)])  # over the 10 MiB limit: refused, said so
    page.wait_for_function("document.getElementById('composer-notice').textContent.includes('huge.png')")
    assert page.inner_text("#composer-notice") == "huge.png is 11.0 MiB: images over 10 MiB are refused."
    # A clipboard with plain text beside the image (a spreadsheet's cells) pastes the text too.
    assert not paste(page, [file_spec("cells.png", GREEN)], text="a\tb")
    page.wait_for_function("document.querySelectorAll('#attachments .thumb').length === 3")


def test_images_are_sent_as_parts_shown_kept_after_reload_and_resent(vision_page):
    page = vision_page
    chat = CannedChat(page)
    send(page, "Hello")
    wait_for_reply(page)
    assert chat.last_user_content() == "Hello"  # a text-only message stays a plain string

    attach(page, "red.png", RED)
    drop(page, [file_spec("blue.png", BLUE)])
    page.wait_for_function("document.querySelectorAll('#attachments .thumb').length === 2")
    send(page, "What colours are these?")
    wait_for_reply(page, index=3)
    parts = [{"type": "text", "text": "What colours are these?"}, image_part(RED), image_part(BLUE)]
    assert chat.last_user_content() == parts
    assert chat.bodies[-1]["messages"][0] == {"role": "user", "content": "Hello"}
    assert page.is_hidden("#attachments")  # sent: the composer is empty again
    bubble = '.message.user[data-index="2"]'
    assert image_sources(page, bubble) == [data_url(RED), data_url(BLUE)]
    screenshot(page, "11-image-in-conversation")

    page.click(f"{bubble} .view-image >> nth=0")  # full size in a dialog
    page.wait_for_selector("#image-viewer[open]")
    assert page.eval_on_selector("#viewer-image", "image => [image.naturalWidth, image.naturalHeight]") == [64, 48]
    screenshot(page, "12-image-viewer")
    page.keyboard.press("Escape")
    page.wait_for_selector("#image-viewer", state="hidden")

    page.reload()
    assert image_sources(page, bubble) == [data_url(RED), data_url(BLUE)]  # kept by the browser
    # ... in IndexedDB: the conversations in localStorage name the images, they do not hold them.
    stored = page.evaluate("localStorage.getItem('lamplight.conversations')")
    assert "base64" not in stored and len(json.loads(stored)[0]["messages"][2]["images"]) == 2

    page.click('.message.assistant[data-index="3"] .regenerate')
    wait_for_reply(page, index=3)
    assert chat.last_user_content() == parts

    page.click(f"{bubble} .edit-message")
    page.wait_for_function(f"document.querySelectorAll('{bubble} .editor .thumb').length === 2")
    page.click(f"{bubble} .editor .thumb >> nth=0 >> .remove-image")
    page.fill(f"{bubble} textarea", "And this one?")
    page.click(f"{bubble} .resend")
    wait_for_reply(page, index=3)
    assert chat.last_user_content() == [{"type": "text", "text": "And this one?"}, image_part(BLUE)]
    assert image_sources(page, bubble) == [data_url(BLUE)]

    page.click("#new-chat")  # an image alone: no text part
    attach(page, "green.png", GREEN)
    page.wait_for_selector("#attachments .thumb")
    page.click("#send")
    wait_for_reply(page)
    assert chat.last_user_content() == [image_part(GREEN)]
    assert page.inner_text("#title") == "Image"
    wait_for_stored_images(page, 3)  # red, blue, green; red is no longer named by any message...
    page.reload()
    wait_for_stored_images(page, 2)  # ... and is deleted when the page next opens


def test_images_travel_in_an_export(vision_page, browser, server, tmp_path):
    page = vision_page
    CannedChat(page)
    attach(page, "red.png", RED)
    page.wait_for_selector("#attachments .thumb")
    send(page, "Look")
    wait_for_reply(page)
    with page.expect_download() as download:
        page.click("#export")
    exported = tmp_path / "export.json"
    download.value.save_as(exported)
    (saved,) = json.loads(exported.read_text())["conversations"]
    assert saved["messages"][0]["images"] == [data_url(RED)]  # the image itself, not this browser's id
    wait_for_stored_images(page, 1)
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#conversation-list li.active .delete-conversation")
    wait_for_stored_images(page, 0)  # a deleted conversation's images go with it

    fresh = browser.new_context()
    other = fresh.new_page()
    open_chat(other, server)
    other.set_input_files("#import", str(exported))
    other.wait_for_selector('.message.user[data-index="0"]')
    assert image_sources(other, '.message.user[data-index="0"]') == [data_url(RED)]
    other.reload()
    assert image_sources(other, '.message.user[data-index="0"]') == [data_url(RED)]
    fresh.close()


def test_without_vision_images_are_refused(page, server):
    assert httpx.get(server + "/props").json()["modalities"]["vision"] is False  # no projector
    assert page.is_hidden("#attach")
    paste(page, [file_spec("green.png", GREEN)])
    page.wait_for_selector("#composer-notice:not([hidden])")
    assert "cannot take images" in page.inner_text("#composer-notice")
    page.evaluate("document.getElementById('composer-notice').hidden = true")
    drop(page, [file_spec("red.png", RED)])
    page.wait_for_selector("#composer-notice:not([hidden])")
    assert "cannot take images" in page.inner_text("#composer-notice")
    page.evaluate("document.getElementById('composer-notice').hidden = true")
    assert not paste(page, [file_spec("cells.png", GREEN)], text="a\tb")  # the text alone, no complaint
    page.wait_for_timeout(100)
    assert page.is_hidden("#composer-notice")
    assert page.locator("#attachments .thumb").count() == 0
    screenshot(page, "13-no-vision")


def test_the_servers_refusal_of_an_image_is_shown(vision_page):
    # The page believes the model takes images; the real server, with no projector, answers 400.
    page = vision_page
    attach(page, "red.png", RED)
    page.wait_for_selector("#attachments .thumb")
    send(page, "What is this?")
    error = page.wait_for_selector(".message.assistant .error")
    assert error.inner_text().startswith("400 ")
    assert image_sources(page, '.message.user[data-index="0"]') == [data_url(RED)]
    screenshot(page, "14-image-refused-400")
