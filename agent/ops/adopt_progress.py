"""A progress_regex that fits the lines a script really printed: pure text rules.

The lines with a training loss (`loss` and a number) are tried, in order, against the default
progress format (`step 120 | loss 3.41 | elapsed 31.2s`: no regex needed), the formats of
well-known scripts, and regexes made from such lines themselves: a line's step counter
(`iter 10`, `step 10`, `batch 10`) and its loss, the literal text between them kept. The one
that parses the most of those lines wins (the default format on a tie), and only when it
parses at least half of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runner.summary import SUMMARY_SEPARATOR, parse_custom_progress, parse_progress

# Progress formats of well-known scripts: (a marker in the script's code, its progress_regex).
PROGRESS_FORMATS = (
    (r"iter \{\w+\}: loss", r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"),  # nanoGPT
    (r"\bTrainer\(", r"\{'loss': '?(?P<loss>[\d.]+)'?"),  # Hugging Face Trainer's dict lines
    # Lightning's bars (tqdm: `train/loss=0.51`, rich: `train/loss: 0.51`) and tqdm postfixes
    (r"lightning|set_postfix|tqdm",
     r".*(?<![\d/])(?P<step>\d+)/\d+ .*?(?<![\w/])(?:train[/_])?loss[=:]\s*(?P<loss>[\d.]+)"),
    (r"\| epoch", r"(?P<step>\d+)/\s*\d+ batches .*loss\s+(?P<loss>[\d.]+)"),
    (r"Train Epoch:", r"Train Epoch: \d+ \[(?P<step>\d+)/\d+.*Loss: (?P<loss>[\d.]+)"),
)
NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_LOSS = re.compile(rf"(?<![\w.])(?:\w+[ _/])?loss\b[\s:=]{{0,3}}({NUMBER}|nan|inf)(?![\w.])",
                   re.IGNORECASE)
_STEP = re.compile(r"(?<![\w.])(step|iter|iteration|it|batch)\b[\s:=#]{0,3}(\d+)(?![\d.]|ms)",
                   re.IGNORECASE)
_ANY_NUMBER = re.compile(NUMBER)


@dataclass(frozen=True)
class ProgressFit:
    """How a script's progress lines can be read: `regex` None with `default` True needs no
    progress_regex; None and not default: nothing fits (or no line has a loss)."""

    regex: str | None
    default: bool
    matched: int  # loss lines parsed
    lines: int  # loss lines printed
    example: str = ""


def loss_lines(lines: list[str]) -> list[str]:
    """The printed lines with a training loss and a number, before any `---` summary block."""
    found = []
    for line in lines:
        if line.strip() == SUMMARY_SEPARATOR:
            break
        if _LOSS.search(line) and not re.match(r"\s*(val|valid|test|eval)", line, re.I):
            found.append(line.rstrip("\n"))
    return found


def _parsed(lines: list[str], pattern: re.Pattern[str]) -> list[str]:
    return [line for line in lines if parse_custom_progress(line, pattern) is not None]


def made_from(line: str) -> str | None:
    """A regex made from one line: its step counter and its loss, the text between them kept."""
    loss = _LOSS.search(line)
    if loss is None:
        return None
    step = _STEP.search(line)
    parts = [(loss.start(1), loss.end(1), f"(?P<loss>{NUMBER})")]
    if step is not None:
        parts.append((step.start(2), step.end(2), r"(?P<step>\d+)"))
    start = min(loss.start(), step.start() if step else loss.start())
    out, at = [], start
    for begin, end, group in sorted(parts):
        out.append(_literal(line[at:begin]))
        out.append(group)
        at = end
    return "".join(out)


def _literal(text: str) -> str:
    """Text between the groups: numbers become NUMBER, runs of spaces `\\s+`, the rest escaped."""
    out, at = [], 0
    for m in _ANY_NUMBER.finditer(text):
        out.append(re.escape(text[at:m.start()]))
        out.append(f"(?:{NUMBER})")
        at = m.end()
    out.append(re.escape(text[at:]))
    return re.sub(r"(?:\\ )+", r"\\s+", "".join(out))


def fit_progress(lines: list[str]) -> ProgressFit:
    """The best way to read these printed lines' losses (see the module docstring)."""
    losses = loss_lines(lines)
    if not losses:
        return ProgressFit(None, False, 0, 0)
    need = max(1, (len(losses) + 1) // 2)
    default = [line for line in losses if parse_progress(line) is not None]
    made = {rx for line in losses[:20] if (rx := made_from(line)) is not None}
    best: tuple[int, str, list[str]] | None = None
    for rx in [*(rx for _, rx in PROGRESS_FORMATS), *sorted(made)]:
        hits = _parsed(losses, re.compile(rx))
        if hits and (best is None or len(hits) > best[0]):
            best = (len(hits), rx, hits)
    if len(default) >= need and (best is None or len(default) >= best[0]):
        return ProgressFit(None, True, len(default), len(losses), default[0])
    if best is not None and best[0] >= need:
        return ProgressFit(best[1], False, best[0], len(losses), best[2][0])
    return ProgressFit(None, False, 0, len(losses), losses[0])
