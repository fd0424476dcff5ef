"""Load and validate a target's overnight.toml into a frozen TargetConfig.

Pure: the stdlib, pydantic and agent.core (errors, prune_policy) only. Every mistake raises
ConfigError naming the key. Besides [target], an optional [prune] table sets the early stop's
policy (PruneTable: agent.core.prune_policy.PrunePolicy's knobs, validated by it), and an
optional [track] table the experiment tracker that mirrors the sweep (agent.core.tracking).
"""

from __future__ import annotations

import enum
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from agent.core.bounds import EXAMPLES as BOUND_EXAMPLES
from agent.core.bounds import Bound, bounds_table, parse_bounds
from agent.core.budget import EXAMPLES, ComputeBudget, budget_text, parse_budget
from agent.core.errors import ConfigError
from agent.core.prune_policy import PrunePolicy
from agent.core.tracking import TrackTable

CONFIG_FILE = "overnight.toml"
MAX_CONFIRM_RUNS = 10
# keys of an earlier keep rule: a config that still sets one is told what replaced it
_RULE_WHY = ("the keep rule's level comes from `fdr`, its discard bar is `discard_below` and the "
             "speed's tolerance is measured (docs/keep-rule.md)")
_SIGMA_WHY = ("σ is measured from the night's own runs, which is what holds the false-discovery "
              "rate: a stated σ 20 % too small lets it reach 28 % on a night of rare small gains; "
              "a script that ignores OVERNIGHT_SEED is judged on one run each "
              "(docs/keep-rule.md#the-four-outcomes)")
REMOVED_KEYS = {"keep_z": _RULE_WHY, "discard_z": _RULE_WHY, "futility": _RULE_WHY,
                "throughput_tolerance": _RULE_WHY, "noise_sigma": _SIGMA_WHY}
REMOVED_PRUNE_KEYS = frozenset({"z", "min_curves", "floor_rel", "speed_tol", "spread_upper",
                                "futile_z", "futile_runs", "pool_earlier", "checks", "window"})
# Early stop of clearly losing runs (agent.rules.prune): "auto" judges a change's runs against
# the incumbent's curves at the policy's checks, "off" never stops one. The default is one
# constant so a measurement can flip it in one place.
PRUNE_DEFAULT: Literal["auto", "off"] = "auto"
# The kinds of change a proposal can be (agent.rules.categories.Category has the same values).
CATEGORY_NAMES = ("hyperparameter", "architecture", "optimizer", "data/schedule",
                  "simplification")
_REQUIRED = ("command", "editable", "metric")


class Direction(str, enum.Enum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


Path_ = Annotated[str, AfterValidator(lambda v: _relpath(v))]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not an environment variable name")
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]


def _asset(value: str) -> str:
    p = PurePosixPath(value)
    if not value.strip() or ".." in p.parts or str(p) == ".":
        raise ValueError(f"{value!r} must be a folder or file inside the repository or an "
                         "absolute path")
    return str(p)


Asset = Annotated[str, AfterValidator(lambda v: _asset(v))]


def _relpath(value: str) -> str:
    p = PurePosixPath(value)
    if not value.strip() or p.is_absolute() or ".." in p.parts:
        raise ValueError(f"{value!r} must be a non-empty path inside the repository")
    return str(p)


class PruneTable(BaseModel):
    """A target's [prune] table: the early stop's policy where it departs from the default
    (a key left out keeps PrunePolicy's default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    exempt: tuple[str, ...] | None = None  # categories never stopped early

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        gone = sorted(set(data) & REMOVED_PRUNE_KEYS) if isinstance(data, dict) else []
        if gone:
            raise ValueError(f"{', '.join(gone)}: no longer settings: the early stop is the keep "
                             "rule's own test, taken at the end of each of `max_runs` equal "
                             "parts of the budget but the last on the loss over that part, its "
                             "spread pooled over every earlier incumbent "
                             "(docs/keep-rule.md#the-early-stop)")
        return data

    @field_validator("exempt", mode="before")
    @classmethod
    def _exempt(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, list | tuple) or any(x not in CATEGORY_NAMES for x in v):
            raise ValueError(f"must be a list of categories ({', '.join(CATEGORY_NAMES)}), "
                             f"got {v!r}")
        return tuple(sorted(set(v)))

    def policy(self, looks: int | None = None) -> PrunePolicy:
        """The PrunePolicy this table asks for, with `looks` parts of the budget (the keep
        rule's max_runs; PrunePolicy's defaults for what is left out)."""
        given: dict[str, Any] = {k: v for k, v in self.model_dump().items() if v is not None}
        if looks is not None:
            given["looks"] = looks
        if "exempt" in given:
            given["exempt"] = frozenset(given["exempt"])
        return PrunePolicy(**given)


class TargetConfig(BaseModel):
    """A target's rules ([target] of overnight.toml), validated once and carried typed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    command: str
    editable: tuple[Path_, ...] = Field(min_length=1)
    protected: tuple[Path_, ...] = ()
    metric: str
    direction: Literal["minimize", "maximize"] = Direction.MINIMIZE.value
    budget_s: float = Field(300.0, gt=0)  # training seconds (unless `budget` is set)
    # a compute budget instead: train exactly this many steps or tokens (agent.core.budget)
    budget: ComputeBudget | None = None
    timeout_s: float = 900.0  # hard kill; default max(3 x budget_s, budget_s + 60), else 900
    seed: StrictInt = 42
    min_delta: float = Field(0.0, ge=0)
    # strict: extra runs of a would-be keep; sequential (deprecated there): max_runs = k + 1
    confirm_runs: StrictInt = Field(0, ge=0, le=MAX_CONFIRM_RUNS)
    # the keep rule (agent.rules.decide): "sequential" (default) or "strict" (autoresearch's
    # one run)
    decision: Literal["sequential", "strict"] = "sequential"
    # the night's false-discovery rate: the share of keeps that are not real gains, held by
    # the keep rule's online procedure (agent.rules.fdr)
    fdr: float = Field(0.2, gt=0, lt=1)
    # a change whose t (gain over its standard error) is below this after a run is discarded
    discard_below: float = 0.5
    max_runs: StrictInt = Field(4, ge=2, le=20)
    baseline_runs: StrictInt = Field(5, ge=1, le=20)
    # re-run the best every N proposals, and once right after a keep on 2 runs (0: never)
    incumbent_every: StrictInt = Field(8, ge=0, le=10_000)
    pass_env: tuple[EnvName, ...] = ()  # service variables a run gets beyond the allow-list
    sandbox: Literal["none", "bwrap"] = "none"  # bwrap: read-only root, writable worktree
    sandbox_network: StrictBool = False  # the bwrap sandbox keeps the network
    # the most of the experiments one kind of change may take: (("architecture", 0.3),);
    # read and written as a table ({ architecture = 0.3 }), kept as pairs so the model hashes
    category_shares: tuple[tuple[str, float], ...] = ()
    workdir: Path_ = "."  # where `command` runs, relative to the repository root
    assets: tuple[Asset, ...] = ()  # data outside git: linked into each worktree, hashed
    progress_regex: str | None = None  # extra progress-line format (named groups step/loss)
    # an editable file of command-line arguments appended to `command` for each run (shell
    # words, `#` comments): the flags a sweep may search (agent.proposers.knob_chain)
    args_file: Path_ | None = None
    # how to evaluate a finished training again from the checkpoint the script wrote to
    # $OVERNIGHT_CHECKPOINT_DIR (run once, in the same worktree, when its evaluation crashed)
    eval_command: str | None = None
    # stop a change's run early when its loss curve is clearly behind the incumbent's
    prune: Literal["auto", "off"] = PRUNE_DEFAULT
    # its policy: the [prune] table of overnight.toml (not a key of [target])
    prune_policy: PruneTable = Field(default_factory=PruneTable)
    # a summary-block key the protected harness prints that no proposer sees during the night
    # (recorded per run, out of the summary and the logs; the report shows it after the night)
    holdout_metric: str | None = None
    # summary-block keys recorded and shown beside the metric (the mean of the runs a change's
    # value rests on, agent.analysis.secondary); the keep rule never reads them
    secondary: tuple[str, ...] = ()
    # bounds on summary-block keys ([target.constraints], agent.core.bounds): a hard one
    # discards a change past it, a soft one asks it for more gain
    constraints: tuple[Bound, ...] = ()
    # a change that removes lines is kept unless worse than the incumbent by more than this
    # (a non-inferiority test, docs/keep-rule.md); 0: a simplification must be better too
    simplicity_margin: float = Field(0.0, ge=0)
    # the tracker that mirrors the sweep: the [track] table of overnight.toml (not a key of
    # [target]); None: none (unless `--track` names one)
    track: TrackTable | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_timeout(cls, data: Any) -> Any:
        if isinstance(data, dict) and "timeout_s" not in data:
            budget = data.get("budget_s", 300.0)
            if isinstance(budget, int | float) and not isinstance(budget, bool):
                data = {**data, "timeout_s": max(budget * 3, budget + 60)}
        return data

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        gone = sorted(set(data) & set(REMOVED_KEYS)) if isinstance(data, dict) else []
        if gone:
            keys_of: dict[str, list[str]] = {}  # each reason once, its keys in front of it
            for k in gone:
                keys_of.setdefault(REMOVED_KEYS[k], []).append(k)
            raise ValueError("; ".join(
                f"{', '.join(keys)}: no longer {'settings' if len(keys) > 1 else 'a setting'}: "
                f"{why}" for why, keys in keys_of.items()))
        return data

    @model_validator(mode="before")
    @classmethod
    def _confirm_runs_caps_max_runs(cls, data: Any) -> Any:
        """The deprecated `confirm_runs = k` of the sequential rule means max_runs = k + 1."""
        if isinstance(data, dict) and "max_runs" not in data:
            k = data.get("confirm_runs")
            if isinstance(k, int) and not isinstance(k, bool) and k > 0:
                data = {**data, "max_runs": max(2, k + 1)}
        return data

    @field_validator(
        "budget_s", "timeout_s", "min_delta", "fdr", "discard_below", "simplicity_margin",
        mode="before",
    )
    @classmethod
    def _number(cls, v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError(f"must be a number, got {v!r}")
        return float(v)

    @field_validator("budget", mode="before")
    @classmethod
    def _compute_budget(cls, v: Any) -> Any:
        if v is None or isinstance(v, ComputeBudget):
            return v
        if not isinstance(v, str):
            raise ValueError(f"must be a string such as {EXAMPLES}, got {v!r}")
        parsed = parse_budget(v)  # ValueError: pydantic names the key
        if not isinstance(parsed, ComputeBudget):
            raise ValueError(f"training seconds are budget_s = {parsed:g}; budget is a compute "
                             f"budget: {EXAMPLES}")
        return parsed

    @field_serializer("budget")
    def _dump_budget(self, v: ComputeBudget | None) -> str | None:
        return None if v is None else str(v)

    @field_validator("category_shares", mode="before")
    @classmethod
    def _shares(cls, v: Any) -> tuple[tuple[str, float], ...]:
        if isinstance(v, list | tuple) and all(isinstance(p, list | tuple) and len(p) == 2
                                               for p in v):
            v = dict(v)
        if not isinstance(v, dict):
            raise ValueError("must be a table such as { architecture = 0.3, optimizer = 0.5 }")
        for key, share in v.items():
            if key not in CATEGORY_NAMES:
                raise ValueError(f"unknown category {key!r} (one of {', '.join(CATEGORY_NAMES)})")
            if isinstance(share, bool) or not isinstance(share, int | float) or \
                    not 0 < share <= 1:
                raise ValueError(f"{key} must be a fraction in (0, 1], got {share!r}")
        return tuple(sorted((k, float(s)) for k, s in v.items()))

    @field_serializer("category_shares")
    def _dump_shares(self, v: tuple[tuple[str, float], ...]) -> dict[str, float]:
        return dict(v)
    @field_validator("command")
    @classmethod
    def _command(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must be a non-empty string such as 'python train.py'")
        return v.strip()

    @field_validator("eval_command")
    @classmethod
    def _eval_command(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must be a non-empty string such as 'python evaluate.py' (or "
                             "left out)")
        return None if v is None else v.strip()

    @field_validator("progress_regex")
    @classmethod
    def _progress_regex(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            pattern = re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc}): {v!r}") from None
        if "loss" not in pattern.groupindex:
            raise ValueError("needs a named group (?P<loss>...) (and optionally (?P<step>...), "
                             f"(?P<elapsed>...)), got {v!r}")
        return v

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if not v.isidentifier():
            raise ValueError(f"must be a summary-block key such as 'val_bpb', got {v!r}")
        return v

    @field_validator("holdout_metric")
    @classmethod
    def _holdout_metric(cls, v: str | None) -> str | None:
        return None if v is None else cls._metric(v)

    @field_validator("secondary", mode="before")
    @classmethod
    def _secondary(cls, v: Any) -> tuple[str, ...]:
        example = 'such as ["peak_vram_mb", "tokens_per_s"]'
        if not isinstance(v, list | tuple) or not all(isinstance(k, str) for k in v):
            raise ValueError(f"must be a list of summary-block keys {example}, got {v!r}")
        bad = [k for k in v if not k.isidentifier()]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a summary-block key ({example})")
        twice = sorted({k for k in v if v.count(k) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once")
        return tuple(v)

    @field_validator("constraints", mode="before")
    @classmethod
    def _constraints(cls, v: Any) -> tuple[Bound, ...]:
        if isinstance(v, tuple) and all(isinstance(b, Bound) for b in v):
            return v
        if not isinstance(v, dict):
            raise ValueError(f"must be a table of bounds such as {{ peak_memory_mb = "
                             f"\"<= 70000\" }}: {BOUND_EXAMPLES}; got {v!r}")
        return parse_bounds(v)  # ValueError: pydantic names the key

    @field_serializer("constraints")
    def _dump_constraints(self, v: tuple[Bound, ...]) -> dict[str, str | list[str]]:
        return bounds_table(v)

    @model_validator(mode="after")
    def _consistent(self) -> TargetConfig:
        both = sorted(set(self.editable) & set(self.protected))
        if both:
            raise ValueError(f"editable/protected: {', '.join(both)} cannot be both")
        clash = sorted(set(self.assets) & (set(self.editable) | set(self.protected)))
        if clash:
            raise ValueError(f"assets: {', '.join(clash)} is also editable or protected; "
                             "assets are files outside git")
        if self.holdout_metric is not None and self.holdout_metric == self.metric:
            raise ValueError(f"holdout_metric: must differ from metric ({self.metric})")
        if self.metric in self.secondary:
            raise ValueError(f"secondary: {self.metric} is the metric itself; list other "
                             "summary-block keys")
        if self.holdout_metric is not None and self.holdout_metric in self.secondary:
            raise ValueError(f"secondary: {self.holdout_metric} is the sealed holdout_metric, "
                             "shown only after the night")
        bounded = self.bounded_keys
        if self.metric in bounded:
            raise ValueError(f"constraints: {self.metric} is the metric, which the keep rule "
                             "judges; bound other summary-block keys (min_delta asks a larger "
                             "gain)")
        if self.holdout_metric is not None and self.holdout_metric in bounded:
            raise ValueError(f"constraints: {self.holdout_metric} is the sealed holdout_metric, "
                             "which no decision may read during the night")
        if self.args_file is not None and self.args_file not in self.editable:
            raise ValueError(f"args_file: {self.args_file} must also be listed in editable")
        if self.budget is None and self.timeout_s <= self.budget_s:
            raise ValueError(f"timeout_s: must be greater than budget_s ({self.budget_s:g}), "
                             f"got {self.timeout_s:g}")
        return self

    @property
    def bounded_keys(self) -> tuple[str, ...]:
        """The summary-block keys `constraints` bounds, each once, in order."""
        return tuple(dict.fromkeys(b.key for b in self.constraints))

    @property
    def time_budget(self) -> bool:
        """Whether runs train for `budget_s` seconds (the machine's speed is then part of their
        metric) rather than for a compute budget (docs/keep-rule.md#the-model)."""
        return self.budget is None

    @property
    def budget_steps(self) -> int | None:
        """The steps a run trains on a budget of steps (None: seconds or tokens), what its
        progress lines are counted against."""
        return self.budget.amount if self.budget is not None and self.budget.unit == "steps" \
            else None

    @property
    def budget_text(self) -> str:
        """The budget as a person reads it: "300 s" or "600 steps"."""
        return budget_text(self.budget_s, self.budget)

    def budget_env(self) -> dict[str, str]:
        """What the script is handed: OVERNIGHT_BUDGET_S, or the compute budget's variable."""
        return {"OVERNIGHT_BUDGET_S": f"{self.budget_s:g}"} if self.budget is None \
            else self.budget.env

    def early_stop_policy(self) -> PrunePolicy:
        """The early stop's policy: the [prune] table's, its budget cut into `max_runs` parts."""
        return self.prune_policy.policy(self.max_runs)

    def to_dict(self) -> dict[str, Any]:
        """Every key, as stored with a sweep: of the budget's two keys, the one in use."""
        data = self.model_dump(mode="json")
        del data["budget_s" if self.budget is not None else "budget"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | TargetConfig) -> TargetConfig:
        """A config as stored with a sweep. A sweep stored by an earlier version carries the
        keys of the rule it replaced (every key, defaults included): those are dropped, as the
        rule that read them is gone; a target file that sets one is refused (parse_config)."""
        if isinstance(data, TargetConfig):  # already typed (Sweep.config): nothing to parse
            return data
        data = {k: v for k, v in data.items() if k not in REMOVED_KEYS}
        if data.get("budget") is not None:  # every key is stored: budget_s is its default
            data.pop("budget_s", None)
        table = data.get("prune_policy")
        if isinstance(table, dict):
            data["prune_policy"] = {k: v for k, v in table.items()
                                    if k not in REMOVED_PRUNE_KEYS}
        return parse_config(data, source="config")

    def with_budget(self, budget_s: float | ComputeBudget | None,
                    timeout_s: float | None = None) -> TargetConfig:
        """Override the budget (seconds, or a compute budget in place of either); a time
        budget's hard timeout keeps its ratio unless given (never below 2x), a compute budget
        keeps the timeout. The keys the target did not set stay unset (defaults, as `doctor`
        tells them apart)."""
        if budget_s is None and timeout_s is None:
            return self
        data = self.model_dump(mode="json", exclude_unset=True)
        if isinstance(budget_s, ComputeBudget):
            data.pop("budget_s", None)
            data["budget"], data["timeout_s"] = str(budget_s), self.timeout_s
        elif budget_s is not None:
            data.pop("budget", None)
            data["budget_s"] = budget_s
            if timeout_s is None:
                ratio = max(self.timeout_s / self.budget_s, 2.0) if self.time_budget else 3.0
                data["timeout_s"] = max(budget_s * ratio, budget_s + 60.0)
        if timeout_s is not None:
            data["timeout_s"] = timeout_s
        return parse_config(data, source="overrides")


def validation_message(exc: ValidationError, source: str = "") -> str:
    """pydantic's errors as one line naming each key: 'budget_s: must be > 0, got 0'."""
    problems = []
    for e in exc.errors():
        key = ".".join(str(part) for part in e["loc"] if not isinstance(part, int))
        key = re.sub(r"^prune_policy\.?", "[prune] ", key).strip()  # its own table
        key = re.sub(r"^track\.?", "[track] ", key).strip()
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("greater_than", "greater_than_equal", "less_than_equal"):
            msg = f"{msg}, got {e.get('input')!r}"
        problems.append(f"{key}: {msg}" if key else msg)
    return (f"{source}: " if source else "") + "; ".join(problems)


def parse_config(data: dict[str, Any], source: str = CONFIG_FILE) -> TargetConfig:
    """Validate a [target] table (already unwrapped) and return the config."""
    unknown = sorted(set(data) - set(TargetConfig.model_fields) - set(REMOVED_KEYS))
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)} in [target]")
    for key in _REQUIRED:
        if key not in data:
            raise ConfigError(f"{source}: missing required key '{key}' in [target]")
    if "budget_s" in data and data.get("budget") is not None:
        raise ConfigError(f"{source}: budget_s and budget: set one, training seconds "
                          f"(budget_s = 300) or a compute budget (budget = {EXAMPLES})")
    if "budget_s" not in data and data.get("budget") is None:
        raise ConfigError(f"{source}: missing required key 'budget_s' in [target] (training "
                          f"seconds; or a compute budget: budget = {EXAMPLES})")
    try:
        return TargetConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc)) from None


def load_config(target: Path) -> TargetConfig:
    """Read <target>/overnight.toml. Raises ConfigError with the problem and the file."""
    path = Path(target) / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"{path}: not found (a target needs an {CONFIG_FILE} at its root)")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from None
    extra = sorted(set(raw) - {"target", "prune", "track"})
    if extra:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(extra)}; expected [target] "
                          "and optionally [prune] and [track]")
    table = raw.get("target")
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: missing [target] table")
    if "prune_policy" in table:
        raise ConfigError(f"{path}: prune_policy is set as a [prune] table, not a key of "
                          "[target]")
    if "prune" in raw:
        if not isinstance(raw["prune"], dict):
            raise ConfigError(f"{path}: prune must be a [prune] table")
        table = {**table, "prune_policy": raw["prune"]}
    if "track" in table:
        raise ConfigError(f"{path}: track is set as a [track] table, not a key of [target]")
    if "track" in raw:
        if not isinstance(raw["track"], dict):
            raise ConfigError(f"{path}: track must be a [track] table")
        table = {**table, "track": raw["track"]}
    return parse_config(table, source=str(path))


def args_words(text: str) -> list[str]:
    """The arguments of an `args_file`: shell words, `#` comments and blank lines ignored."""
    words: list[str] = []
    for line in text.splitlines():
        words += shlex.split(line, comments=True)
    return words


def extra_args(config: TargetConfig, root: Path) -> list[str]:
    """The words of `args_file` read from the checkout `root` (none without one); they follow
    `command`. Raises ConfigError when the file is missing or is not valid shell words."""
    if config.args_file is None:
        return []
    try:
        return args_words((root / config.args_file).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"args_file {config.args_file}: {exc}") from None
