"""Crash classification: trivial (fix and retry), fundamental (log and move on), timeout,
evaluation (training finished, its evaluation crashed).

Pure and table-driven (the causes are rows in agent.rules.crash_causes); imports only the stdlib
and the domain. Reads, in order: the hard-limit timeout and the FAIL marker; a fatal signal; the
run's last exception line; when that line is missing or a launcher's wrapper (torchrun's
ChildFailedError ...), the exception lines inside the log tail, whatever prefix they carry
(`[rank0]:`, a timestamp, `SUBPROCESS:`); evidence only the tail shows (a SIGKILLed worker, a
kernel assert, a native abort); a shell's 128 + N exit code. The verdict's `cause` names the fine
cause once ("CUDA out of memory", "dtype mismatch", "failed assert"), and the reason starts with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.domain import CrashKind
from agent.rules.crash_causes import (
    LINE_CAUSES,
    SIGNALS,
    TAIL_CAUSES,
    TAIL_CODE_CAUSES,
    WRAPPER,
    Cause,
)

__all__ = ["CrashFacts", "CrashVerdict", "classify", "is_device_failure"]

TAIL_CHARS = 8000  # the tail searched for evidence (TAIL_LINES of long log lines)
DETAIL_CHARS = 400  # the matched line quoted in the reason, at most


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
    # the script saved its checkpoint ($OVERNIGHT_CHECKPOINT_DIR): training had finished
    training_finished: bool = False


@dataclass(frozen=True)
class CrashVerdict:
    kind: CrashKind
    reason: str
    cause: str = ""  # the fine cause, e.g. "CUDA out of memory"; the reason starts with it


# An exception line inside a log line, after any prefix: "[rank0]: RuntimeError: ...".
_EXCEPTION_IN_LINE = re.compile(
    r"(?:^|(?<=[\s\]>|:]))((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt)(?::.*)?)$"
)
# "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:" then the inner error.
_RAISED = re.compile(r"raised:\s*$")


def classify(facts: CrashFacts) -> CrashVerdict:
    """Classify a failed run. Call only for runs that did not produce a usable metric."""
    if facts.timed_out:
        return CrashVerdict(CrashKind.TIMEOUT, "timeout: killed at the hard time limit", "timeout")
    if facts.fail_marker:
        why = "NaN/inf loss (the script printed FAIL)"
        return CrashVerdict(CrashKind.FUNDAMENTAL, why, "NaN/inf loss")
    crash = _crash(facts)
    if facts.training_finished:  # whatever killed it, the trained model was saved first
        why = f"{crash.reason} (in the evaluation: training had finished and saved its checkpoint)"
        return CrashVerdict(CrashKind.EVALUATION, why, crash.cause)
    return crash


def _crash(facts: CrashFacts) -> CrashVerdict:
    """An exception, a signal or an exit code: its cause and kind."""
    if facts.signal is not None:
        return _killed(facts.signal)
    tail = facts.log_tail[-TAIL_CHARS:]
    error = _wrapped(facts.error.strip(), tail) if facts.error else None
    found = _first(LINE_CAUSES, error) if error else None
    if found is None and (error is None or WRAPPER.search(error)):
        error = _tail_exception(tail) or error
        found = (_first(LINE_CAUSES, error) if error else None) or _first(TAIL_CODE_CAUSES, tail)
    if found is None:
        found = _first(TAIL_CAUSES, tail)
    if found is not None:
        cause, detail = found
        return _verdict(cause, detail, facts.training_started)
    return _fallback(facts, error)


def _first(causes: tuple[Cause, ...], text: str) -> tuple[Cause, str] | None:
    """The first cause whose pattern is in `text`, with the line it matched."""
    for cause in causes:
        match = cause.pattern.search(text)
        if match:
            start = text.rfind("\n", 0, match.start()) + 1
            end = text.find("\n", match.end())
            return cause, text[start : end if end >= 0 else None].strip()
    return None


def _wrapped(error: str, tail: str) -> str:
    """The error line, joined to the line above when that line says the error was raised inside
    it (so the compiler's ImportError reads as the compiler's failure, not a missing import)."""
    lines = tail.splitlines()
    for i in range(len(lines) - 1, 0, -1):
        if lines[i].strip() == error:
            above = lines[i - 1].strip()
            return f"{above} {error}" if _RAISED.search(above) else error
    return error


def _tail_exception(tail: str) -> str | None:
    """The last exception line in the tail that is not a launcher's wrapper, prefix removed."""
    for line in reversed(tail.splitlines()):
        match = _EXCEPTION_IN_LINE.search(line.strip())
        if match and not WRAPPER.search(match.group(1)):
            return match.group(1)
    return None


def _verdict(cause: Cause, detail: str | None, training_started: bool) -> CrashVerdict:
    name = cause.name
    if cause.before_training_only and training_started:
        why = _join(f"{name} after training started", detail)
        return CrashVerdict(CrashKind.FUNDAMENTAL, why, name)
    if cause.before_training_only and cause.kind is CrashKind.TRIVIAL:
        return CrashVerdict(cause.kind, _join(f"{name} before training", detail), name)
    return CrashVerdict(cause.kind, _join(name, detail), name)


def _join(head: str, detail: str | None) -> str:
    if not detail:
        return head
    cut = detail if len(detail) <= DETAIL_CHARS else detail[: DETAIL_CHARS - 1] + "…"
    return f"{head}: {cut}"


def _killed(signal: int) -> CrashVerdict:
    name = SIGNALS.get(signal, f"signal {signal}")
    return CrashVerdict(CrashKind.FUNDAMENTAL, f"killed by {name}", f"killed by {name}")


def _fallback(facts: CrashFacts, error: str | None) -> CrashVerdict:
    code = facts.exit_code
    if code is not None and code - 128 in SIGNALS:  # a shell reporting a death by signal
        name = SIGNALS[code - 128]
        return CrashVerdict(
            CrashKind.FUNDAMENTAL, f"killed by {name} (exit code {code})", f"killed by {name}"
        )
    if code == 0 and not facts.has_metric:
        return CrashVerdict(CrashKind.FUNDAMENTAL, "no metric in the summary block", "no metric")
    why = _join("crash", error or f"exit code {code}")
    return CrashVerdict(CrashKind.FUNDAMENTAL, why, "crash")


# A crash that says the accelerator itself is broken or gone (not the change's fault).
_DEVICE_FAILURE = re.compile(
    r"CUDA error(?!: out of memory)|no CUDA GPUs are available|CUDA driver|cuda runtime error"
    r"|NVML|uncorrectable ECC|GPU is lost|device-side assert|CUDA-capable device",
    re.IGNORECASE,
)


def is_device_failure(reason: str | None, log_tail: str | None) -> bool:
    """Does a crash's reason or log tail blame the device (driver, ECC, lost GPU)?"""
    return bool(_DEVICE_FAILURE.search(f"{reason or ''}\n{log_tail or ''}"))
