"""Load and validate a target's overnight.toml into a frozen TargetConfig.

Pure: stdlib and agent.errors only. Every mistake raises ConfigError naming the key.
"""

from __future__ import annotations

import enum
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from agent.errors import ConfigError

CONFIG_FILE = "overnight.toml"
_KEYS = {
    "command",
    "editable",
    "protected",
    "metric",
    "direction",
    "budget_s",
    "timeout_s",
    "seed",
    "min_delta",
    "confirm_runs",
}
MAX_CONFIRM_RUNS = 10
_REQUIRED = ("command", "editable", "metric", "budget_s")


class Direction(str, enum.Enum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


@dataclass(frozen=True)
class TargetConfig:
    """A target's rules, validated once (parse_config) and carried typed from then on."""

    command: str
    editable: tuple[str, ...]
    protected: tuple[str, ...]
    metric: str
    direction: str = Direction.MINIMIZE.value
    budget_s: float = 300.0
    timeout_s: float = 900.0
    seed: int = 42
    min_delta: float = 0.0
    confirm_runs: int = 0  # extra runs (other seeds) before a keep; the metric is their mean

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["editable"] = list(self.editable)
        d["protected"] = list(self.protected)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any] | TargetConfig) -> TargetConfig:
        if isinstance(data, TargetConfig):  # already typed (Sweep.config): nothing to parse
            return data
        return parse_config(data, source="config")

    def with_budget(self, budget_s: float | None, timeout_s: float | None = None) -> TargetConfig:
        """Override the budget; the hard timeout keeps its ratio unless given (never below 2x)."""
        if budget_s is None and timeout_s is None:
            return self
        data = self.to_dict()
        if budget_s is not None:
            data["budget_s"] = budget_s
            if timeout_s is None:
                ratio = max(self.timeout_s / self.budget_s, 2.0)
                data["timeout_s"] = max(budget_s * ratio, budget_s + 60.0)
        if timeout_s is not None:
            data["timeout_s"] = timeout_s
        return parse_config(data, source="overrides")


def _relpath(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{key}: every entry must be a non-empty relative path, got {value!r}")
    p = PurePosixPath(value)
    if p.is_absolute() or ".." in p.parts:
        raise ConfigError(f"{key}: {value!r} must be a path inside the repository")
    return str(p)


def _number(data: dict[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: must be a number, got {value!r}")
    return float(value)


def parse_config(data: dict[str, Any], source: str = CONFIG_FILE) -> TargetConfig:
    """Validate a [target] table (already unwrapped) and return the config."""
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)} in [target]")
    for key in _REQUIRED:
        if key not in data:
            raise ConfigError(f"{source}: missing required key '{key}' in [target]")
    command = data["command"]
    if not isinstance(command, str) or not command.strip():
        raise ConfigError("command: must be a non-empty string such as 'python train.py'")
    editable = data["editable"]
    if not isinstance(editable, list) or not editable:
        raise ConfigError("editable: must be a non-empty list of files a proposal may change")
    protected = data.get("protected", [])
    if not isinstance(protected, list):
        raise ConfigError("protected: must be a list of files")
    ed = tuple(_relpath(v, "editable") for v in editable)
    pr = tuple(_relpath(v, "protected") for v in protected)
    both = sorted(set(ed) & set(pr))
    if both:
        raise ConfigError(f"editable/protected: {', '.join(both)} cannot be both")
    metric = data["metric"]
    if not isinstance(metric, str) or not metric.isidentifier():
        raise ConfigError(f"metric: must be a summary-block key such as 'val_bpb', got {metric!r}")
    direction = data.get("direction", Direction.MINIMIZE.value)
    if direction not in {d.value for d in Direction}:
        raise ConfigError(f"direction: must be 'minimize' or 'maximize', got {direction!r}")
    budget = _number(data, "budget_s", 300)
    if budget <= 0:
        raise ConfigError(f"budget_s: must be > 0, got {budget:g}")
    timeout = _number(data, "timeout_s", max(budget * 3, budget + 60))
    if timeout <= budget:
        raise ConfigError(f"timeout_s: must be greater than budget_s ({budget:g}), got {timeout:g}")
    seed = data.get("seed", 42)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed: must be an integer, got {seed!r}")
    min_delta = _number(data, "min_delta", 0.0)
    if min_delta < 0:
        raise ConfigError(f"min_delta: must be >= 0, got {min_delta:g}")
    confirm = data.get("confirm_runs", 0)
    if isinstance(confirm, bool) or not isinstance(confirm, int) or not (
        0 <= confirm <= MAX_CONFIRM_RUNS
    ):
        raise ConfigError(f"confirm_runs: must be an integer from 0 to {MAX_CONFIRM_RUNS}, "
                          f"got {confirm!r}")
    return TargetConfig(
        command=command.strip(),
        editable=ed,
        protected=pr,
        metric=metric,
        direction=direction,
        budget_s=budget,
        timeout_s=timeout,
        seed=seed,
        min_delta=min_delta,
        confirm_runs=confirm,
    )


def load_config(target: Path) -> TargetConfig:
    """Read <target>/overnight.toml. Raises ConfigError with the problem and the file."""
    path = Path(target) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: not found (a target needs an {CONFIG_FILE} at its root)")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    extra = sorted(set(raw) - {"target"})
    if extra:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(extra)}; expected only [target]")
    table = raw.get("target")
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: missing [target] table")
    return parse_config(table, source=str(path))
