"""Crash classes on real tracebacks: each file of tests/fixtures/tracebacks/ through the loop.

Each file is a traceback quoted from a public issue thread (its URL in the header) with the class
judged by the loop protocol's definitions, written down before looking at what classify says.
A file is turned into the facts a run would give exactly as the runner and the loop do it: the
error line by `runner.last_error_line`, the tail by `runner.result.tail_lines`, the FAIL marker by
`runner.has_fail_marker`; exit code, signal, timeout and "training started" come from the header
(what the thread shows), and "training finished" (`finished: yes`: the thread says training
had completed before the crash; a run says it by saving its checkpoint). Then
`agent.rules.classify.classify`, which the loop's decision calls.

    .venv/bin/python -m pytest tests/test_crash_corpus.py -q -s   # -s prints the confusion
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.core.domain import CrashKind
from agent.rules.classify import CrashFacts, CrashVerdict, classify
from runner import has_fail_marker, last_error_line
from runner.result import tail_lines

CORPUS = Path(__file__).parent / "fixtures" / "tracebacks"
REQUIRED = ("source", "repository", "title", "expected", "why")
MIN_ACCURACY = 0.95


@dataclass(frozen=True)
class Case:
    name: str
    header: dict[str, str]
    log: str

    @property
    def expected(self) -> CrashKind:
        return CrashKind(self.header["expected"])

    @property
    def ambiguous(self) -> bool:
        return "ambiguous" in self.header

    def facts(self) -> CrashFacts:
        """What the runner and the loop would hand classify for this log."""
        h = self.header
        return CrashFacts(
            timed_out=h.get("timed_out", "no") == "yes",
            fail_marker=has_fail_marker(self.log),
            exit_code=_int(h.get("exit", "1")),
            signal=_int(h.get("signal", "none")),
            error=last_error_line(self.log),
            log_tail=tail_lines(self.log),
            training_started=h.get("started", "no") == "yes",
            has_metric=False,
            # the thread says training had finished (the loop knows it by the checkpoint)
            training_finished=h.get("finished", "no") == "yes",
        )


def _int(text: str) -> int | None:
    return None if text == "none" else int(text)


def _load(path: Path) -> Case:
    text = path.read_text(encoding="utf-8")
    head, sep, log = text.partition("\n---\n")
    assert sep, f"{path.name}: no '---' line between the header and the log"
    header = {}
    for line in head.splitlines():
        key, colon, value = line.partition(": ")
        assert colon, f"{path.name}: header line without 'key: value': {line!r}"
        header[key] = value.strip()
    return Case(path.stem, header, log)


CASES = [_load(p) for p in sorted(CORPUS.glob("*.txt"))]
IDS = [c.name for c in CASES]


def _confusion(results: list[tuple[Case, CrashVerdict]]) -> str:
    kinds = list(CrashKind)
    grid = Counter((c.expected, v.kind) for c, v in results)
    lines = ["expected \\ got  " + "".join(f"{k.value:>12}" for k in kinds) + "   right"]
    for want in kinds:
        row = [grid[want, got] for got in kinds]
        total = sum(row)
        share = f"{grid[want, want]}/{total}" if total else "-"
        lines.append(f"{want.value:<16}" + "".join(f"{n:>12}" for n in row) + f"   {share}")
    wrong = [
        f"  {c.name}: expected {c.expected.value}, got {v.kind.value} ({v.reason})"
        for c, v in results
        if v.kind is not c.expected
    ]
    return "\n".join(lines + (["misclassified:", *wrong] if wrong else []))


def test_corpus_is_large_enough_and_well_formed() -> None:
    assert len(CASES) >= 40
    for case in CASES:
        missing = [k for k in REQUIRED if not case.header.get(k)]
        assert not missing, f"{case.name}: header lacks {missing}"
        assert re.match(
            r"https://github\.com/[^/]+/[^/]+/(issues|pull)/\d+$", case.header["source"]
        ), case.name
        assert case.header["source"].split("/")[3:5] == case.header["repository"].split("/")
        assert case.log.strip(), f"{case.name}: empty log"
        case.facts()  # exit/signal/started parse
    kinds = Counter(c.expected for c in CASES)
    assert all(kinds[k] for k in CrashKind), kinds


def test_corpus_accuracy() -> None:
    results = [(c, classify(c.facts())) for c in CASES]
    right = sum(v.kind is c.expected for c, v in results)
    held = [(c, v) for c, v in results if c.header.get("set") == "held-out"]
    held_right = sum(v.kind is c.expected for c, v in held)
    report = _confusion(results)
    print(
        f"\ncrash corpus: {right}/{len(results)} right ({right / len(results):.1%}); "
        f"held out from the rules' tuning: {held_right}/{len(held)}\n{report}"
    )
    assert right / len(results) >= MIN_ACCURACY, report


@pytest.mark.parametrize(
    "case", [c for c in CASES if not c.ambiguous], ids=[c.name for c in CASES if not c.ambiguous]
)
def test_clear_case(case: Case) -> None:
    verdict = classify(case.facts())
    assert verdict.kind is case.expected, (case.header["why"], verdict)
    assert verdict.reason


# The fine cause the verdict records (and the reason starts with), for one case of each kind.
CAUSES = {
    "nanogpt-61-cuda-oom": "CUDA out of memory",
    "nanovlm-202-torch-oom": "CUDA out of memory",
    "h1111-23-prefixed-cuda-oom": "CUDA out of memory",
    "rlswarm-341-mps-oom": "MPS out of memory",
    "handsoff-4-cpu-alloc": "CPU out of memory",
    "mmhuman3d-331-numpy-memoryerror": "CPU out of memory",
    "qwen3-873-cublas-alloc": "CUDA out of memory (cuBLAS could not allocate)",
    "cppo-6-torchrun-sigkill": "killed by SIGKILL (often the OOM killer)",
    "simsg-3-killed": "killed by SIGKILL (often the OOM killer)",
    "uoais-16-nan-detectron2": "NaN/inf (numerical instability)",
    "heyjetson-7-keras-nan": "NaN/inf loss (numerical instability)",
    "llamafactory-251-loss-scale": "fp16 loss scale underflow (NaN/inf)",
    "colossalai-6169-dtype-ranked": "dtype mismatch",
    "boss-2-dtype-int-long": "dtype mismatch",
    "yolov3cluster-6-device": "device mismatch",
    "picl-4-shape": "shape mismatch",
    "detr-499-assert-heads": "failed assert",
    "lmeval-2935-np-nan-removed": "attribute error",
    "moddednanogpt-143-missing-module": "missing import",
    "infinity-31-inductor-import": "torch.compile/triton failure",
    "unet-375-device-assert-tail": "index out of range (CUDA device-side assert)",
    "megatron-1050-nccl-watchdog": "NCCL watchdog timeout (hung collective)",
    "point2skeleton-6-segfault-139": "segmentation fault",
    "regtr-33-logged-illegal-memory": "illegal memory access (CUDA)",
    "dolly-139-disk-full": "disk full",
    "lcnn-17-keyerror-after-training": "missing key",
    "fastmoe-47-hang-timeout": "timeout",
}


@pytest.mark.parametrize("name, cause", sorted(CAUSES.items()))
def test_reason_names_the_fine_cause(name: str, cause: str) -> None:
    (case,) = [c for c in CASES if c.name == name]
    verdict = classify(case.facts())
    assert verdict.cause == cause and verdict.reason.startswith(cause), verdict
