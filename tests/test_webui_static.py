"""The chat page's static serving (no browser): `/` and its files, public while the API is keyed
or the model loads, ETag revalidation, gzip, caching, `--path DIR`, `--no-webui`, and no file
outside the folder. The page's behaviour is tested in a real browser in test_webui_browser.py."""

from __future__ import annotations

import math
import re

import httpx
import pytest
from test_server_support import ServerThread

from lamplight.cli import build_parser, server_settings
from lamplight.server import ServerSettings, ServerState
from lamplight.server.webui import BUILT_IN_ROOT, static_file_path


def _server(**settings) -> ServerThread:
    # No model attached: the API answers 503 (loading), which is all these tests need of it.
    return ServerThread(ServerState(ServerSettings(**settings))).start()


@pytest.fixture(scope="module")
def keyed():
    server = _server(api_keys=("sekret",))
    yield server
    server.stop()


def test_the_page_is_served_at_root_without_the_api_key_while_loading(keyed):
    page = httpx.get(keyed.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="js/app.js">' in page.text
    script = httpx.get(keyed.url + "/js/app.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    # The API itself is still protected (and still loading).
    assert httpx.get(keyed.url + "/props").status_code in (401, 503)
    assert httpx.get(keyed.url + "/nope").status_code in (401, 503)


def test_etag_gzip_and_cache_headers(keyed):
    first = httpx.get(keyed.url + "/", headers={"Accept-Encoding": "gzip"})
    assert first.headers["content-encoding"] == "gzip" and first.headers["cache-control"] == "no-cache"
    assert first.text == (BUILT_IN_ROOT / "index.html").read_text()  # httpx undoes the gzip
    again = httpx.get(keyed.url + "/", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    plain = httpx.get(keyed.url + "/vendor/marked.esm.js", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and "max-age" in plain.headers["cache-control"]
    raw = httpx.get(keyed.url + "/vendor/marked.esm.js", headers={"Accept-Encoding": "gzip"})
    assert raw.headers["content-encoding"] == "gzip" and int(raw.headers["content-length"]) < len(plain.content) / 2


def test_no_file_outside_the_folder(tmp_path):
    # Checked on the resolver itself: HTTP clients normalise `..` away before sending.
    (tmp_path / "site").mkdir()
    (tmp_path / "secret.txt").write_text("no")
    (tmp_path / "site" / "link.txt").symlink_to(tmp_path / "secret.txt")
    settings = ServerSettings(static_path=str(tmp_path / "site"))
    for path in ("/../secret.txt", "/./../secret.txt", "/link.txt", "/missing.html"):
        assert static_file_path(settings, path) is None, path
    assert static_file_path(ServerSettings(), "/") == BUILT_IN_ROOT / "index.html"
    assert static_file_path(ServerSettings(webui=False), "/") is None


def test_no_webui_makes_root_a_404():
    server = _server(webui=False)
    try:
        response = httpx.get(server.url + "/")
        assert response.status_code == 503  # as any API path while loading: nothing static is served
    finally:
        server.stop()


def test_path_serves_the_users_folder(tmp_path):
    (tmp_path / "index.html").write_text("<h1>mine</h1>")
    (tmp_path / "app.css").write_text("body{}")
    server = _server(static_path=str(tmp_path))
    try:
        assert httpx.get(server.url + "/").text == "<h1>mine</h1>"
        assert httpx.get(server.url + "/app.css").headers["content-type"].startswith("text/css")
        assert httpx.get(server.url + "/js/app.js").status_code == 503  # not the built-in page's files
    finally:
        server.stop()


def test_cli_flags():
    args = build_parser().parse_args(["serve", "--no-webui", "--path", "/srv/www"])
    settings = server_settings(args)
    assert settings.webui is False and settings.static_path == "/srv/www"
    assert server_settings(build_parser().parse_args(["serve"])).webui is True


def test_vendored_files_are_documented():
    vendor = BUILT_IN_ROOT / "vendor"
    notes = (vendor / "VERSIONS.md").read_text()
    for path in vendor.glob("*.*"):
        if path.name != "VERSIONS.md":
            assert f"`{path.name}`" in notes, path.name


def _module_imports(path) -> list[str]:
    """The relative paths a page module imports (`import ... from "./x.js"`)."""
    return re.findall(r'^\s*(?:import|export)\b[^;]*?\bfrom\s+"(\.{1,2}/[^"]+)"', path.read_text(), re.MULTILINE | re.DOTALL)


def test_every_module_the_page_imports_is_served(keyed):
    # A module missing from the folder (a new file left out of a package) breaks the whole page.
    (entry,) = re.findall(r'<script type="module" src="([^"]+)">', (BUILT_IN_ROOT / "index.html").read_text())
    seen, todo = set(), [BUILT_IN_ROOT / entry]
    while todo:
        path = todo.pop().resolve()
        if path in seen:
            continue
        seen.add(path)
        response = httpx.get(keyed.url + "/" + path.relative_to(BUILT_IN_ROOT).as_posix())
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/javascript"), path
        todo += [path.parent / name for name in _module_imports(path)]
    assert BUILT_IN_ROOT / "js" / "images.js" in seen


def test_the_image_limit_fits_the_servers_default_body_limit():
    # The page refuses an image over MAX_IMAGE_MIB; one at the limit, base64 in a data: URL inside
    # the JSON body, must not meet the server's 413.
    (mib,) = re.findall(r"export const MAX_IMAGE_MIB = (\d+);", (BUILT_IN_ROOT / "js" / "images.js").read_text())
    encoded = 4 * math.ceil(int(mib) * 2**20 / 3) + 4096  # the data URL and the rest of the body
    assert encoded < ServerSettings().limits.max_body_bytes


def test_the_attach_input_takes_several_images():
    page = (BUILT_IN_ROOT / "index.html").read_text()
    (attach,) = re.findall(r'<input id="attach-input"[^>]*>', page)
    assert 'accept="image/*"' in attach and " multiple" in attach and " hidden" in attach
