"""The models a router lists, from its three sources, as llama-server finds them:

- the caches (source "cache"): the built-in aliases `lamplight pull` fetched (named by their
  alias) and the GGUF files of huggingface_hub's cache that `-hf` fills (named `USER/REPO:QUANT`,
  llama-server's names for its cache);
- `--models-dir` (source "models_dir"): each `NAME.gguf` is the model NAME; each subfolder is the
  model named after it, holding one GGUF, or a split one (`*-00001-of-0000N.gguf` and its parts),
  and perhaps its `mmproj*.gguf`; a folder's model overrides a cached one of the same name;
- `--models-preset` (source "preset"): a section naming a model of the others gives its flags;
  any other section is a model of its own (`model = PATH` or `hf-repo = ...`).

A file that cannot be read, or is no GGUF, or a split model missing a part, is listed with the
reason (`ModelEntry.problem`) and never started; the other models are listed as usual. A model's
name is only ever looked up here: a request's `"model"` never becomes a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .presets import Preset, PresetError

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
QUANT = re.compile(r"^(I?Q\d\w*|F16|F32|BF16|MXFP4\w*|TQ\d\w*)$", re.IGNORECASE)  # as lamplight.hf_hub's
GGUF_MAGIC = b"GGUF"


class CatalogError(ValueError):
    """The models cannot be listed (a missing folder, two models of one name...); the message says why."""


@dataclass
class ModelEntry:
    name: str
    source: str  # "models_dir", "cache" or "preset"
    path: str | None = None  # the GGUF (a split model's first part); None for a preset's hf-repo
    hf_repo: str | None = None
    mmproj: str | None = None  # the projector in the model's folder: its server loads it (--mmproj)
    preset: Preset = field(default_factory=lambda: Preset(""))  # its section, when the file has one
    problem: str | None = None  # why it cannot be loaded (an unreadable file...), else None

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.preset.aliases


def scan_models_dir(folder: str) -> list[ModelEntry]:
    root = Path(folder)
    if not root.is_dir():
        raise CatalogError(f"--models-dir {folder}: not a directory")
    entries = []
    for item in sorted(root.iterdir(), key=lambda p: p.name):
        if item.is_dir():
            entries += _folder_model(item)
        elif item.name.lower().endswith(".gguf") and "mmproj" not in item.name.lower():
            entries.append(_checked(ModelEntry(item.name[:-5], "models_dir", str(item.resolve()))))
    return entries


def _folder_model(folder: Path) -> list[ModelEntry]:
    """The model of a subfolder (llama-server's scan_subdir): its split set's first part, else its
    GGUF; its mmproj file beside it."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.lower().endswith(".gguf"))
    mmproj = next((p for p in files if "mmproj" in p.name.lower()), None)
    models = [p for p in files if p is not mmproj]
    first_parts = [p for p in models if (m := SPLIT.search(p.name)) and int(m.group(1)) == 1]
    unsplit = [p for p in models if not SPLIT.search(p.name)]
    chosen = (first_parts or unsplit or [None])[0]
    if chosen is None:
        return []
    entry = ModelEntry(folder.name, "models_dir", str(chosen.resolve()), mmproj=str(mmproj.resolve()) if mmproj else None)
    return [_checked(entry)]


def _checked(entry: ModelEntry) -> ModelEntry:
    entry.problem = gguf_problem(Path(entry.path))
    return entry


def gguf_problem(path: Path) -> str | None:
    """Why `path` cannot be a model's file (unreadable, not a GGUF, a split part missing), else None."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if magic != GGUF_MAGIC:
        return f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})"
    split = SPLIT.search(path.name)
    if split:
        stem, count = path.name[:split.start()], int(split.group(2))
        for index in range(2, count + 1):
            part = path.with_name(f"{stem}-{index:05d}-of-{count:05d}.gguf")
            if not part.is_file():
                return f"{path.name}: part {part.name} of the split model is missing"
    return None


def cached_models() -> list[ModelEntry]:
    """The built-in aliases `lamplight pull` fetched, then the Hugging Face cache's GGUF files."""
    from lamplight.sources import ALIASES, cache_dir

    entries = [ModelEntry(alias, "cache", str(cache_dir() / package.filename))
               for alias, package in sorted(ALIASES.items()) if (cache_dir() / package.filename).is_file()]
    return entries + _hub_models()


def _hub_models() -> list[ModelEntry]:
    from huggingface_hub import try_to_load_from_cache

    from lamplight.hf_hub import cached_hub_models

    entries = []
    for repo, filename, _ in cached_hub_models():
        split = SPLIT.search(filename)
        if "mmproj" in filename.lower() or (split and int(split.group(1)) != 1):
            continue
        path = try_to_load_from_cache(repo, filename)
        if isinstance(path, str):
            entries.append(ModelEntry(f"{repo}:{_quant_of(filename)}", "cache", path))
    return entries


def _quant_of(filename: str) -> str:
    """`Qwen2.5-0.5B-Instruct-Q4_K_M.gguf` -> `Q4_K_M` (the file's name where it has no quant tag)."""
    stem = SPLIT.sub(".gguf", filename)[:-5]
    tokens = [token for token in re.split(r"[-./]", stem) if QUANT.match(token)]
    return tokens[-1].upper() if tokens else stem


def build_catalog(cached: list[ModelEntry], local: list[ModelEntry], presets: dict[str, Preset],
                  every_model: Preset) -> dict[str, ModelEntry]:
    """Every model by name: the cache's, overridden by the folder's, given their preset sections;
    the preset's own models added (as llama-server's load_models cascades them)."""
    catalog = {entry.name: entry for entry in cached}
    catalog.update({entry.name: entry for entry in local})
    for name, preset in presets.items():
        if name in catalog:
            catalog[name].preset = preset
            if preset.names_a_model:  # the section also says which file: it is the preset's model now
                catalog[name] = _preset_model(name, preset)
        elif preset.names_a_model:
            catalog[name] = _preset_model(name, preset)
        else:
            raise PresetError(f"preset [{name}] names no model that the other sources list, and gives no "
                              f"'model = PATH' or 'hf-repo = USER/REPO[:QUANT]' of its own "
                              f"(listed: {', '.join(sorted(catalog)) or 'none'})")
    _drop_deduplicated(catalog, presets, bool(every_model.dedup_cache_models))
    _check_names(catalog)
    return catalog


def _preset_model(name: str, preset: Preset) -> ModelEntry:
    entry = ModelEntry(name, "preset", preset.model, hf_repo=preset.hf_repo, preset=preset)
    if preset.model and preset.model.lower().endswith(".gguf"):
        entry.problem = gguf_problem(Path(preset.model))
    return entry


def _drop_deduplicated(catalog: dict[str, ModelEntry], presets: dict[str, Preset], everywhere: bool) -> None:
    """`dedup-cache-models` (in a section, or in `[*]` for all): a cached model that a preset's
    hf-repo also serves is listed once, as the preset's entry."""
    for preset in presets.values():
        dedup = everywhere if preset.dedup_cache_models is None else preset.dedup_cache_models
        if preset.hf_repo and dedup:
            cached = catalog.get(preset.hf_repo)
            if cached is not None and cached.source == "cache":
                del catalog[preset.hf_repo]


def _check_names(catalog: dict[str, ModelEntry]) -> None:
    """Aliases must not collide with names or each other (llama-server's add_model checks)."""
    owners: dict[str, str] = {}
    for entry in catalog.values():
        for alias in entry.aliases:
            other = alias if alias in catalog and alias != entry.name else owners.get(alias)
            if other is not None:
                raise CatalogError(f"alias '{alias}' of model '{entry.name}' is also the name or an alias of "
                                   f"model '{other}'")
            owners[alias] = entry.name

