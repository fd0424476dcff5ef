import pytest

from agent.core.domain import CrashKind, Direction
from agent.rules.classify import CrashFacts, classify
from agent.rules.decide import is_improvement

NAN = float("nan")


@pytest.mark.parametrize(
    "metric, best, direction, min_delta, expected",
    [
        (0.99, 1.0, Direction.MINIMIZE, 0.0, True),
        (1.0, 1.0, Direction.MINIMIZE, 0.0, False),  # equal is not better
        (1.01, 1.0, Direction.MINIMIZE, 0.0, False),
        (0.999, 1.0, Direction.MINIMIZE, 0.002, False),  # inside the noise margin
        (0.997, 1.0, Direction.MINIMIZE, 0.002, True),
        (2.0, 1.0, Direction.MAXIMIZE, 0.0, True),
        (NAN, 1.0, Direction.MINIMIZE, 0.0, False),
        (None, 1.0, Direction.MINIMIZE, 0.0, False),
        (3.0, None, Direction.MINIMIZE, 0.0, True),
    ],
)
def test_is_improvement(metric, best, direction, min_delta, expected):
    assert is_improvement(metric, best, direction, min_delta) is expected


def facts(error=None, tail="", **kw):
    base = dict(
        timed_out=False,
        fail_marker=False,
        exit_code=1,
        signal=None,
        error=error,
        log_tail=tail or (error or ""),
        training_started=False,
        has_metric=False,
    )
    base.update(kw)
    return CrashFacts(**base)


TRACE = 'Traceback (most recent call last):\n  File "train.py", line 3\n'


@pytest.mark.parametrize(
    "f, kind",
    [
        (facts("SyntaxError: invalid syntax"), CrashKind.TRIVIAL),
        (facts("IndentationError: unexpected indent"), CrashKind.TRIVIAL),
        (facts("NameError: name 'lr' is not defined"), CrashKind.TRIVIAL),
        (facts("ModuleNotFoundError: No module named 'flash_attn'"), CrashKind.TRIVIAL),
        (facts("ImportError: cannot import name 'x'"), CrashKind.TRIVIAL),
        (facts("AttributeError: 'GPT' object has no attribute 'blokcs'"), CrashKind.TRIVIAL),
        (
            facts("TypeError: forward() takes 2 positional arguments but 3 were given"),
            CrashKind.TRIVIAL,
        ),
        (
            facts("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x128 and 256x128)"),
            CrashKind.TRIVIAL,
        ),
        # the same shape error once training is under way is not a typo
        (
            facts("RuntimeError: mat1 and mat2 shapes cannot be multiplied", training_started=True),
            CrashKind.FUNDAMENTAL,
        ),
        (facts("NameError: name 'x' is not defined", training_started=True), CrashKind.FUNDAMENTAL),
        (
            facts("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
            CrashKind.FUNDAMENTAL,
        ),
        (facts("MemoryError"), CrashKind.FUNDAMENTAL),
        (facts(None, "step 10 | loss nan\nFAIL\n", fail_marker=True), CrashKind.FUNDAMENTAL),
        (facts("ValueError: loss is nan"), CrashKind.FUNDAMENTAL),
        (facts(None, exit_code=None, signal=9), CrashKind.FUNDAMENTAL),
        (facts(None, timed_out=True, exit_code=None, signal=15), CrashKind.TIMEOUT),
        (facts(None, exit_code=0), CrashKind.FUNDAMENTAL),  # exited cleanly with no metric
        (facts("RuntimeError: something odd"), CrashKind.FUNDAMENTAL),
        (facts("ZeroDivisionError: division by zero"), CrashKind.FUNDAMENTAL),
        # an OOM reported only in the log tail, with a generic last line
        (
            facts("RuntimeError: DataLoader worker exited", TRACE + "Cannot allocate memory\n"),
            CrashKind.FUNDAMENTAL,
        ),
        # after the checkpoint was saved: the evaluation crashed, whatever the cause ...
        (facts("torch.OutOfMemoryError: CUDA out of memory", training_started=True,
               training_finished=True), CrashKind.EVALUATION),
        (facts("KeyError: 'losses'", training_started=True, training_finished=True),
         CrashKind.EVALUATION),
        (facts(None, exit_code=None, signal=9, training_finished=True), CrashKind.EVALUATION),
        # ... but a timeout stays a timeout, and a NaN loss a fundamental crash
        (facts(None, timed_out=True, exit_code=None, signal=15, training_finished=True),
         CrashKind.TIMEOUT),
        (facts(None, "FAIL\n", fail_marker=True, training_finished=True), CrashKind.FUNDAMENTAL),
    ],
)
def test_classify_table(f, kind):
    verdict = classify(f)
    assert verdict.kind is kind, verdict
    assert verdict.reason


def test_an_evaluation_crash_keeps_its_cause_first():
    verdict = classify(facts("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB",
                             training_started=True, training_finished=True))
    assert verdict.cause == "CUDA out of memory"
    assert verdict.reason.startswith("CUDA out of memory")
    assert verdict.reason.endswith("(in the evaluation: training had finished and saved its "
                                   "checkpoint)")


def test_reason_names_no_metric():
    assert "no metric" in classify(facts(None, exit_code=0)).reason


OOM_IN_SOURCE = (
    'Traceback (most recent call last):\n  File "train.py", line 9, in <module>\n'
    "    except torch.cuda.OutOfMemoryError:\nNameError: name 'torch' is not defined\n"
)
RANKED = (
    "[rank0]: Traceback (most recent call last):\n"
    '[rank0]:   File "train.py", line 3, in <module>\n'
    "[rank0]: NameError: name 'lrr' is not defined\n"
    "E0101 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1)\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
)
COMPILER = (
    "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:\n"
    "ImportError: cannot import name 'triton_key' from 'triton.compiler.compiler'\n"
)


@pytest.mark.parametrize(
    "f, kind, cause",
    [
        # the run's own exception line decides before the tail's evidence
        (
            facts("NameError: name 'torch' is not defined", OOM_IN_SOURCE),
            CrashKind.TRIVIAL,
            "undefined name",
        ),
        # a NaN named as an attribute is a typo, not instability
        (
            facts("AttributeError: module 'numpy' has no attribute 'NaN'"),
            CrashKind.TRIVIAL,
            "attribute error",
        ),
        # a launcher's wrapper is looked through: the root cause above it decides
        (
            facts("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", RANKED),
            CrashKind.TRIVIAL,
            "undefined name",
        ),
        # the error printed under "... raised:" is the compiler's, not a missing import
        (
            facts(COMPILER.splitlines()[1], COMPILER),
            CrashKind.FUNDAMENTAL,
            "torch.compile/triton failure",
        ),
        # a shell's 128 + 9
        (
            facts(None, exit_code=137),
            CrashKind.FUNDAMENTAL,
            "killed by SIGKILL (often the OOM killer)",
        ),
        (
            facts("AssertionError: n_embd must be divisible by n_head"),
            CrashKind.TRIVIAL,
            "failed assert",
        ),
        (facts("AssertionError", training_started=True), CrashKind.FUNDAMENTAL, "failed assert"),
        (
            facts("RuntimeError: expected scalar type Float but found BFloat16"),
            CrashKind.TRIVIAL,
            "dtype mismatch",
        ),
    ],
)
def test_classify_precedence(f, kind, cause):
    verdict = classify(f)
    assert (verdict.kind, verdict.cause) == (kind, cause), verdict
    assert verdict.reason.startswith(cause)
