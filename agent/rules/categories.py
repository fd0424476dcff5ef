"""Kinds of change (hyper-parameter, architecture, optimizer, data/schedule, simplification)
and the per-sweep caps on their share. Pure: stdlib and domain only.

A proposal's category rides in its `meta["category"]`; experiments that carry none (an agent's
or an older proposer's) are classified from the names of the constants they change and from
their description.
"""

from __future__ import annotations

import enum
import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping

from agent.core.domain import Experiment, ExperimentStatus


class Category(str, enum.Enum):
    HYPERPARAMETER = "hyperparameter"
    ARCHITECTURE = "architecture"
    OPTIMIZER = "optimizer"
    DATA_SCHEDULE = "data/schedule"
    SIMPLIFICATION = "simplification"


CATEGORY_VALUES = tuple(c.value for c in Category)
# Until this many experiments are counted, a share cap cannot yet say "exhausted".
MIN_COUNTED_FOR_SHARE = 5
_NAME_RULES: tuple[tuple[re.Pattern[str], Category], ...] = (
    (re.compile(r"MUON|ADAM|BETA|MOMENTUM|OPTIM|NESTEROV|EPS\b|_EPS"), Category.OPTIMIZER),
    (re.compile(r"WARMUP|WARMDOWN|DECAY_FRAC|FINAL_LR|SCHEDULE|BATCH|SEQ_LEN|DATA|TOKENS|EPOCH"),
     Category.DATA_SCHEDULE),
    (re.compile(r"DEPTH|LAYER|D_MODEL|WIDTH|DIM|HIDDEN|HEAD|MLP|SWIGLU|TIED|SOFTCAP|ROPE|"
                r"VOCAB|EMBED(?!_LR)|NORM|ATTN|KV"), Category.ARCHITECTURE),
)
_TEXT_RULES: tuple[tuple[re.Pattern[str], Category], ...] = (
    (re.compile(r"\b(remove|drop|delete|simplif|strip|inline)", re.I), Category.SIMPLIFICATION),
    (re.compile(r"\b(muon|adam|optimi[sz]er|momentum|beta)", re.I), Category.OPTIMIZER),
    (re.compile(r"\b(warm-?up|warm-?down|schedule|batch|sequence length|data)", re.I),
     Category.DATA_SCHEDULE),
    (re.compile(r"\b(layer|depth|width|head|attention|mlp|swiglu|embedding|norm|rope|"
                r"architecture)", re.I), Category.ARCHITECTURE),
)


@functools.lru_cache(maxsize=4096)
def category_of_knob(name: str) -> Category:
    """The category of changing one UPPER_CASE constant, from its name."""
    for pattern, category in _NAME_RULES:
        if pattern.search(name):
            return category
    return Category.HYPERPARAMETER


def category_of_text(description: str) -> Category:
    for pattern, category in _TEXT_RULES:
        if pattern.search(description):
            return category
    return Category.HYPERPARAMETER


def parse_category(value: object) -> Category | None:
    """A category from a string such as 'architecture' or 'data/schedule' (None if unknown)."""
    return _parse_category(value) if isinstance(value, str) else None


@functools.lru_cache(maxsize=1024)  # a digest asks once per experiment; the names are few
def _parse_category(value: str) -> Category | None:
    text = value.strip().lower().replace("-", "").replace(" ", "").replace("_", "")
    for c in Category:
        if text in (c.value.replace("/", ""), c.value, c.value.split("/")[0]):
            return c
    return {"hyperparameters": Category.HYPERPARAMETER, "hparam": Category.HYPERPARAMETER,
            "arch": Category.ARCHITECTURE, "data": Category.DATA_SCHEDULE,
            "schedule": Category.DATA_SCHEDULE, "simplify": Category.SIMPLIFICATION}.get(text)


def category_of(exp: Experiment, knob_names: Iterable[str] = ()) -> Category:
    """The recorded category, else one guessed from the changed constants or the description."""
    recorded = parse_category(exp.meta.get("category"))
    if recorded is not None:
        return recorded
    names = list(knob_names)
    if names:
        return category_of_knob(names[0])
    return category_of_text(exp.description)


def counts(history: Iterable[Experiment]) -> Counter[Category]:
    """Proposals per category, over the experiments that used (or tried to use) a run."""
    out: Counter[Category] = Counter()
    for exp in history:
        category = counted_category(exp)
        if category is not None:
            out[category] += 1
    return out


def counted_category(exp: Experiment) -> Category | None:
    """The category `counts` counts the experiment under; None if it is not counted."""
    if exp.is_baseline or exp.status in (ExperimentStatus.CANCELLED,
                                          ExperimentStatus.INTERRUPTED):
        return None
    return category_of(exp, _names_in_meta(exp))


_CONSTANT = re.compile(r"^([+-])([A-Z][A-Z0-9_]*)\s*(?::\s*\w+\s*)?=", re.MULTILINE)


def changed_constants(diff: str) -> list[str]:
    """UPPER_CASE constants whose line a diff both removes and adds, in order."""
    return list(_changed_constants(diff))


@functools.lru_cache(maxsize=1 << 16)  # as constant_changes: a digest asks for every diff
def _changed_constants(diff: str) -> tuple[str, ...]:
    removed, added = set(), []
    for sign, name in _CONSTANT.findall(diff):
        if sign == "-":
            removed.add(name)
        elif name not in added:
            added.append(name)
    return tuple(n for n in added if n in removed)


def _names_in_meta(exp: Experiment) -> list[str]:
    knob = exp.meta.get("knob")
    return [knob] if isinstance(knob, str) else changed_constants(exp.diff)


def exhausted(history: list[Experiment], shares: Mapping[str, float],
              max_experiments: int | None) -> dict[Category, str]:
    """Categories whose cap is used up, each with a one-line reason.

    With `max_experiments` a category may take ceil(share × max_experiments) proposals; without
    it, its running share may not exceed `share` once MIN_COUNTED_FOR_SHARE are counted.
    """
    if not shares:
        return {}  # no caps: nothing to count
    return exhausted_in(counts(history), shares, max_experiments)


def exhausted_in(used: Mapping[Category, int], shares: Mapping[str, float],
                 max_experiments: int | None) -> dict[Category, str]:
    """exhausted, from the proposals per category (counts)."""
    total = sum(used.values())
    out: dict[Category, str] = {}
    for key, share in shares.items():
        category = parse_category(key)
        if category is None:
            continue
        n = used.get(category, 0)
        if max_experiments is not None:
            allowed = math.ceil(share * max_experiments)
            if n >= allowed:
                out[category] = (f"{n} of {allowed} allowed ({share:.0%} of "
                                 f"{max_experiments} experiments)")
        elif total >= MIN_COUNTED_FOR_SHARE and (n + 1) / (total + 1) > share:
            out[category] = f"{n} of {total} experiments ({n / total:.0%}; cap {share:.0%})"
    return out
