"""Results of a benchmark run: summary rows, the printed table and the JSON document."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from lamplight.bench.client import ServerInfo

JSON_FORMAT_VERSION = 1
# Ratios closer to 1 than this are reported as a tie rather than a win.
TIE_TOLERANCE = 0.03


@dataclass
class MetricRow:
    """One summary figure of a scenario, per server label ("A", "B")."""

    scenario: str
    name: str
    unit: str
    higher_is_better: bool
    values: dict[str, float | None]
    samples: dict[str, int] = field(default_factory=dict)
    # False for a figure of the host rather than the server (the bandwidth a roofline is taken
    # from) or of the answers (how much of them repeats the prompt): no ratio, no winner; `aside`
    # says what it is of, in place of which way is better.
    compared: bool = True
    aside: str = "of the host"

    def ratio(self) -> float | None:
        """A/B, when both values exist."""
        a, b = self.values.get("A"), self.values.get("B")
        if not self.compared or a is None or b is None or b == 0:
            return None
        return a / b

    def better(self) -> str | None:
        ratio = self.ratio()
        if ratio is None:
            return None
        if abs(ratio - 1) <= TIE_TOLERANCE:
            return "tie"
        a_wins = ratio > 1 if self.higher_is_better else ratio < 1
        return "A" if a_wins else "B"

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario,
            "metric": self.name,
            "unit": self.unit,
            "higher_is_better": self.higher_is_better,
            "values": self.values,
            "samples": self.samples,
            "ratio_a_over_b": self.ratio(),
            "better": self.better(),
        }


@dataclass
class ScenarioResult:
    name: str
    params: dict
    records: list[dict] = field(default_factory=list)
    rows: list[MetricRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Per-batch figures of the concurrency scenario (wall time, aggregate throughput...).
    batches: list[dict] = field(default_factory=list)

    def records_of(self, label: str, **tags) -> list[dict]:
        return [r for r in self.records
                if r["server"] == label and all(r.get(k) == v for k, v in tags.items())]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "params": self.params,
            "notes": self.notes,
            "summary": [row.to_dict() for row in self.rows],
            "batches": self.batches,
            "requests": self.records,
        }


@dataclass
class BenchReport:
    servers: dict[str, ServerInfo]
    scenarios: list[ScenarioResult]
    options: dict
    started_at: str
    duration_s: float
    warmup: list[dict] = field(default_factory=list)

    def rows(self) -> list[MetricRow]:
        return [row for scenario in self.scenarios for row in scenario.rows]

    def error_count(self) -> int:
        return sum(1 for s in self.scenarios for r in s.records if r["error"])

    def warnings(self) -> list[str]:
        warnings = []
        for scenario in self.scenarios:
            warnings.extend(f"{scenario.name}: {note}" for note in scenario.notes)
            for label in self.servers:
                warnings.extend(_request_warnings(scenario, label))
        return warnings

    def to_dict(self) -> dict:
        return {
            "format": "lamplight.bench",
            "version": JSON_FORMAT_VERSION,
            "started_at": self.started_at,
            "duration_s": self.duration_s,
            "options": self.options,
            "servers": {label: info.to_dict() for label, info in self.servers.items()},
            "summary": [row.to_dict() for row in self.rows()],
            "scenarios": [scenario.to_dict() for scenario in self.scenarios],
            "warmup": self.warmup,
            "warnings": self.warnings(),
            "errors": self.error_count(),
        }


def _request_warnings(scenario: ScenarioResult, label: str) -> list[str]:
    records = scenario.records_of(label)
    errors = [r for r in records if r["error"]]
    short = [r for r in records if r["short"]]
    warnings = []
    if errors:
        warnings.append(f"{scenario.name}: server {label}: {len(errors)}/{len(records)} requests "
                        f"failed, first error: {errors[0]['error']}")
    if short:
        warnings.append(
            f"{scenario.name}: server {label}: {len(short)}/{len(records)} requests returned fewer "
            f"tokens than max_tokens (the server may ignore `ignore_eos`); per-token rates stay "
            f"valid but totals are not like-for-like")
    return warnings


def median_or_none(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def write_json(report: BenchReport, path: str | Path) -> None:
    Path(path).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")


def format_table(report: BenchReport) -> str:
    labels = list(report.servers)
    header = ["scenario", "metric", *labels]
    if len(labels) == 2:
        header += ["A/B", "better"]
    lines = [f"{label}: {info.url} (model {info.model or '?'}, n_ctx {info.n_ctx or '?'})"
             for label, info in report.servers.items()]
    rows = [header] + [_table_cells(row, labels) for row in report.rows()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, cells in enumerate(rows):
        lines.append("  ".join(_align(c, w, col) for col, (c, w) in enumerate(zip(cells, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _table_cells(row: MetricRow, labels: list[str]) -> list[str]:
    direction = ("higher is better" if row.higher_is_better else "lower is better") if row.compared else row.aside
    cells = [row.scenario, f"{row.name} [{row.unit}] ({direction})"]
    cells += [_format_number(row.values.get(label)) for label in labels]
    if len(labels) == 2:
        ratio = row.ratio()
        cells += ["-" if ratio is None else f"{ratio:.2f}", row.better() or "-"]
    return cells


def _format_number(value: float | None) -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


def _align(cell: str, width: int, column: int) -> str:
    # Text columns left, figures right.
    return cell.ljust(width) if column < 2 else cell.rjust(width)
