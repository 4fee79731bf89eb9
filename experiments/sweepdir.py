"""A finished (or interrupted) sweep read back: its spec, its table, its aggregates."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aifabric.fabric.errors import AifabricError

# and a scheduled workload's bytes over the ATSW layer and its jobs' waits
HEADLINE = (
    "busbw_gbps", "goodput_gbps", "time_ns", "efficiency", "completion_ns", "atsw_bytes",
    "wait_ns",
)  # fmt: skip
# and per wave of a drain plan, what it cost and what it kept (experiments/columns.py)
WAVE_HEADLINE = re.compile(r"wave\d+_(busbw_gbps@.*|capacity_kept\..*)")


@dataclass
class SweepResults:
    path: Path
    spec: dict[str, Any]  # sweep.json
    frame: Any  # pandas.DataFrame of results.csv

    @property
    def keys(self) -> list[str]:
        return list(self.spec.get("keys", []))

    @property
    def report(self) -> dict[str, Any]:
        return dict(self.spec.get("report", {}))

    def columns(self, wanted: list[str] | None = None) -> list[str]:
        """Metric columns: those named (or every job's or tier's column of a metric named
        without @JOB or .TIER), else the report's metric and the headline ones (busbw, job
        time, efficiency, completion; bytes over the ATSW layer and waits for GPUs; each
        wave's busbw and capacity kept)."""
        from aifabric.experiments.stats import metric_columns, split_metric

        have = metric_columns(self.frame, self.keys)
        if not wanted:
            wanted = [m for m in (self.report.get("metric"),) if m in have] + list(HEADLINE)
            wanted += [c for c in have if WAVE_HEADLINE.fullmatch(c)]
        out = []
        for name in wanted:
            if name in have:
                out.append(name)
                continue
            matches = [c for c in have if name in (split_metric(c)[0], c.split(".")[0])]
            if not matches and name not in HEADLINE:
                raise AifabricError(
                    f"the results have no metric {name!r}; they have {', '.join(have)}"
                )
            out.extend(matches)
        return list(dict.fromkeys(out))

    def aggregate(self, wanted: list[str] | None = None) -> list[dict]:
        from aifabric.experiments.stats import aggregate

        return aggregate(self.frame, self.keys, self.columns(wanted))

    def contrasts(self) -> list[dict]:
        """The comparisons the report makes: [report] baseline (and headline, label,
        published, published_band), then each of [[report.contrasts]]."""
        report = self.report
        keys = ("baseline", "headline", "label", "published", "published_band")
        first = [{k: report[k] for k in keys if k in report}] if report.get("baseline") else []
        return first + list(report.get("contrasts", []))

    def dcqcn_presets(self) -> dict[str, int]:
        """Each DCQCN preset the sweep's runs ran and how many ran it, from their run.json
        (the scenario as it ran: the preset named, or the one the NICs' rate chose); runs
        without DCQCN, or whose run.json cannot be read, are not counted."""
        counts: dict[str, int] = {}
        for run_dir in self.frame.get("run_dir", []):
            try:
                meta = json.loads((self.path / str(run_dir) / "run.json").read_text())
                preset = meta["scenario"]["congestion_control"].get("preset")
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if isinstance(preset, str):
                counts[preset] = counts.get(preset, 0) + 1
        return counts

    def effects(self, contrast: dict | None = None) -> list[dict]:
        """Every configuration against the baseline of `contrast` (default: the first)."""
        from aifabric.experiments.stats import effects

        if contrast is None:
            contrast = (self.contrasts() or [{}])[0]
        column = self.report.get("metric")
        if not contrast.get("baseline") or column not in self.frame:
            return []
        return effects(self.frame, self.keys, column, contrast["baseline"])


def open_sweep(path: str | Path) -> SweepResults:
    import pandas as pd

    path = Path(path)
    spec_file, table = path / "sweep.json", path / "results.csv"
    if not spec_file.is_file() or not table.is_file():
        raise AifabricError(f"{path} is not a sweep directory (no sweep.json and results.csv)")
    try:
        spec = json.loads(spec_file.read_text())
        frame = pd.read_csv(table)
    except (OSError, ValueError) as e:
        raise AifabricError(f"{path}: cannot read the sweep: {e}") from None
    return SweepResults(path, spec, frame)
