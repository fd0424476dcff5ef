"""Crash classification: trivial (fix and retry), fundamental (log and move on), timeout.

Pure and table-driven: the first rule whose pattern matches decides. Imports only the stdlib
and the domain.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.domain import CrashKind


@dataclass(frozen=True)
class CrashFacts:
    """What the runner observed, reduced to what classification needs."""

    timed_out: bool
    fail_marker: bool
    exit_code: int | None
    signal: int | None
    error: str | None  # last exception line, e.g. "NameError: name 'x' is not defined"
    log_tail: str
    training_started: bool  # at least one progress line was printed
    has_metric: bool


@dataclass(frozen=True)
class Verdict:
    kind: CrashKind
    reason: str


# Searched in the log tail too (not just the error line): out-of-memory shows up in many forms.
_OOM = re.compile(
    r"out of memory|OutOfMemoryError|MemoryError|Cannot allocate memory", re.IGNORECASE
)

# (pattern on the last exception line, kind, reason, only-before-training)
_RULES: tuple[tuple[re.Pattern[str], CrashKind, str, bool], ...] = (
    (
        re.compile(r"\bnan\b|loss.*\binf\b|diverg", re.IGNORECASE),
        CrashKind.FUNDAMENTAL,
        "numerical instability (NaN/divergence)",
        False,
    ),
    (
        re.compile(r"^(SyntaxError|IndentationError|TabError)\b"),
        CrashKind.TRIVIAL,
        "syntax error",
        False,
    ),
    (
        re.compile(r"^(NameError|UnboundLocalError|ImportError|ModuleNotFoundError)\b"),
        CrashKind.TRIVIAL,
        "undefined name or missing import",
        True,
    ),
    (
        re.compile(r"^(AttributeError|TypeError|KeyError|ValueError)\b"),
        CrashKind.TRIVIAL,
        "typo-class error (attribute/type/key)",
        True,
    ),
    (
        re.compile(
            r"size mismatch|shapes? cannot be multiplied|must match the size|"
            r"Expected .*(size|shape|dim)|shape '\[.*\]' is invalid|"
            r"mat1 and mat2|not broadcastable|dimension out of range",
            re.IGNORECASE,
        ),
        CrashKind.TRIVIAL,
        "shape mismatch",
        True,
    ),
)


def classify(facts: CrashFacts) -> Verdict:
    """Classify a failed run. Call only for runs that did not produce a usable metric."""
    if facts.timed_out:
        return Verdict(CrashKind.TIMEOUT, "killed at the hard time limit")
    if facts.fail_marker:
        return Verdict(CrashKind.FUNDAMENTAL, "the script printed FAIL (NaN or exploding loss)")
    if facts.signal is not None:
        name = {9: "SIGKILL (often the OOM killer)", 11: "SIGSEGV", 6: "SIGABRT"}.get(
            facts.signal, f"signal {facts.signal}"
        )
        return Verdict(CrashKind.FUNDAMENTAL, f"killed by {name}")
    error = (facts.error or "").strip()
    if _OOM.search(error) or _OOM.search(facts.log_tail[-4000:]):
        return Verdict(
            CrashKind.FUNDAMENTAL, f"out of memory: {error}" if error else "out of memory"
        )
    # "torch.nn.modules.module.ModuleAttributeError: x" matches on its last dotted part.
    short = re.sub(r"^(?:\w+\.)+(?=\w+(Error|Exception)\b)", "", error)
    for pattern, kind, reason, before_training_only in _RULES:
        if not pattern.search(short):
            continue
        if before_training_only and facts.training_started:
            return Verdict(CrashKind.FUNDAMENTAL, f"{reason} after training started: {error}")
        return Verdict(kind, f"{reason}: {error}" if error else reason)
    if facts.exit_code == 0 and not facts.has_metric:
        return Verdict(CrashKind.FUNDAMENTAL, "no metric in the summary block")
    detail = error or f"exit code {facts.exit_code}"
    return Verdict(CrashKind.FUNDAMENTAL, f"crash: {detail}")


# A crash that says the accelerator itself is broken or gone (not the change's fault).
_DEVICE_FAILURE = re.compile(
    r"CUDA error(?!: out of memory)|no CUDA GPUs are available|CUDA driver|cuda runtime error"
    r"|NVML|uncorrectable ECC|GPU is lost|device-side assert|CUDA-capable device",
    re.IGNORECASE,
)


def is_device_failure(reason: str | None, log_tail: str | None) -> bool:
    """Does a crash's reason or log tail blame the device (driver, ECC, lost GPU)?"""
    return bool(_DEVICE_FAILURE.search(f"{reason or ''}\n{log_tail or ''}"))
