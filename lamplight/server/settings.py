"""Server-wide settings: the CLI flags that shape HTTP behaviour and per-request defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from lamplight import __version__

BUILD_INFO = f"b0-lamplight-{__version__}"  # llama-server clients expect a "b<number>-..." build string


@dataclass
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ("*",)
    alias: str | None = None  # overrides the model name reported in responses
    # Per-request defaults (`--temp`, `--top-k`, ...), keyed by request field name.
    sampling_defaults: dict = field(default_factory=dict)
    n_predict: int = -1
    n_keep: int = 0
    slots_endpoint: bool = True
    metrics: bool = False
    sse_ping_interval: float = 30.0  # seconds of silence in a stream before a `:` comment is sent
    timeout: float = 3600.0
    build_info: str = BUILD_INFO
    slot_save_path: str | None = None  # `--slot-save-path`: enables POST /slots/{id}?action=...
    spm_infill: bool = False  # `--spm-infill`: /infill puts the suffix before the prefix

    def origin_allowed(self, origin: str) -> bool:
        return "*" in self.cors_origins or origin in self.cors_origins
