"""The crash causes classify knows: one row per cause, its class and how its message reads.

Tables only (stdlib `re` and the domain). Each row: pattern, class, the cause's name as the
reason starts with it, and whether the row stands only before training started (a code error in
a change that already trained is logged, not repaired: docs/proposals.md, "Crash classes").
Order matters, first match wins; the patterns are PyTorch's, CUDA's, NCCL's, triton's, NumPy's
and llama.cpp's own message texts, as real tracebacks show them (tests/fixtures/tracebacks/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.core.domain import CrashKind

T, F = CrashKind.TRIVIAL, CrashKind.FUNDAMENTAL


@dataclass(frozen=True)
class Cause:
    pattern: re.Pattern[str]
    kind: CrashKind
    name: str  # what the reason starts with, e.g. "CUDA out of memory"
    before_training_only: bool = False


def _c(pattern: str, kind: CrashKind, name: str, before: bool = False, case: bool = False) -> Cause:
    flags = re.MULTILINE | (0 if case else re.IGNORECASE)
    return Cause(re.compile(pattern, flags), kind, name, before)


_CPU_OOM = (
    r"DefaultCPUAllocator|Cannot allocate memory|can't allocate memory|not enough memory"
    r"|Unable to allocate|\bMemoryError\b|bad_alloc|insufficient memory"
)
_DTYPE = (
    r"expected scalar type \w+ but found|same dtype|Found dtype \w+ but expected"
    r"|scalar type \w+ but got scalar type|dtype \w+ but got"
    r"|expected \w*(Float|Half|Double|Long)Tensor"
    r"|not implemented for '(Half|BFloat16|Float|Double|Long|Int|Bool|Char|Byte)'"
    r"|Input type \(\S+\) and weight type \(\S+\) should be the same|desired output type"
)
_DEVICE = r"on the same device|found at least two devices|expected device \S+ but got"
_SHAPE = (
    r"size mismatch|shapes? cannot be multiplied|must match the size|Expected .*(size|shape|dim)"
    r"|shape '\[.*\]' is invalid|not broadcastable|dimension out of range"
    r"|Sizes of tensors must match|stack expects each tensor to be equal size|invalid shape"
    r"|to have \d+ channels|expanded size of the tensor|too many indices"
)
_AUTOGRAD = (
    r"modified by an inplace operation|backward through the graph a second time"
    r"|does not require grad and does not have a grad_fn"
)
_SIGKILL = r"killed by signal: Killed|SIGKILL|exit ?code\s*:?\s*-9\b|^Killed\s*$|\]Killed\s*$"
_DISK_FULL = r"No space left on device|Disk quota exceeded|\[Errno 28\]"
_GPU_UNSUPPORTED = (
    r"no kernel image|CUDA driver|NVML|no CUDA GPUs|CUDA-capable device|uncorrectable ECC"
    r"|GPU is lost|only supports Ampere|is_sm\d+"
)
_KERNEL_ASSERT = r"device-side assert|Assertion `.*` failed"
_WATCHDOG = r"Watchdog caught collective operation timeout"
_NAN_IN_LOG = (
    r"loss[^\n]{0,30}\bnan\b|\bnan\b[^\n]{0,30}\bloss|returned nan values|infinite or NaN"
    r"|Invalid loss, terminating|loss scale[^\n]*minimum"
)

# The exception line (or one found in the tail): the exception's own type decides first for the
# errors that are always code mistakes, then the message.
LINE_CAUSES: tuple[Cause, ...] = (
    _c(r"^(SyntaxError|IndentationError|TabError)\b", T, "syntax error", case=True),
    _c(r"^(NameError|UnboundLocalError)\b", T, "undefined name", True, case=True),
    _c(r"^(ModuleNotFoundError|ImportError)\b", T, "missing import", True, case=True),
    _c(r"^AttributeError\b", T, "attribute error", True, case=True),
    _c(r"^KeyboardInterrupt\b", F, "interrupted (KeyboardInterrupt)", case=True),
    _c(_DISK_FULL, F, "disk full"),
    _c(r"MPS backend out of memory", F, "MPS out of memory"),
    _c(r"CUBLAS_STATUS_ALLOC_FAILED", F, "CUDA out of memory (cuBLAS could not allocate)"),
    _c(
        r"CUDA out of memory|CUDA error: out of memory|cudaErrorMemoryAllocation",
        F,
        "CUDA out of memory",
    ),
    _c(_CPU_OOM, F, "CPU out of memory"),
    _c(r"out of memory|OutOfMemoryError|RESOURCE_EXHAUSTED", F, "out of memory"),
    _c(r"out of resource", F, "GPU kernel resources exhausted (shared memory)"),
    _c(r"loss scale.*minimum|minimum loss scale", F, "fp16 loss scale underflow (NaN/inf)"),
    _c(r"\bnan\b|\binf(inite)?\b|non-finite|diverg", F, "NaN/inf (numerical instability)"),
    _c(_SIGKILL, F, "killed by SIGKILL (often the OOM killer)"),
    _c(r"segmentation fault|SIGSEGV", F, "segmentation fault"),
    _c(r"bus error|SIGBUS", F, "bus error (shared memory)"),
    _c(r"killed by signal", F, "a worker process was killed"),
    _c(_KERNEL_ASSERT, T, "index out of range (CUDA device-side assert)", True),
    _c(
        r"illegal memory access|cudaErrorIllegalAddress|misaligned address",
        F,
        "illegal memory access (CUDA)",
    ),
    _c(_WATCHDOG, F, "NCCL watchdog timeout (hung collective)"),
    _c(r"NCCL|DistBackendError", F, "NCCL/distributed error"),
    _c(r"cuDNN error|CUDNN_STATUS", F, "cuDNN error"),
    _c(r"CUBLAS_STATUS", F, "cuBLAS error"),
    _c(
        r"BackendCompilerFailed|InductorError|InternalTorchDynamoError|torch\._inductor|\btriton\b"
        r"|ptxas|LLVM ERROR",
        F,
        "torch.compile/triton failure",
    ),
    _c(_GPU_UNSUPPORTED, F, "GPU or driver unavailable/unsupported"),
    _c(_DTYPE, T, "dtype mismatch", True),
    _c(_DEVICE, T, "device mismatch", True),
    _c(_SHAPE, T, "shape mismatch", True),
    _c(r"^IndexError\b|index out of range", T, "index out of range", True),
    _c(_AUTOGRAD, T, "autograd misuse (in-place op or reused graph)", True),
    _c(r"^AssertionError\b", T, "failed assert", True, case=True),
    _c(r"^TypeError\b", T, "type error (a wrong call)", True, case=True),
    _c(r"^KeyError\b", T, "missing key", True, case=True),
    _c(r"^ValueError\b", T, "bad value", True, case=True),
    _c(r"^FileNotFoundError\b", F, "missing file", case=True),
)

# What only the log tail shows when the exception line says nothing: a killed worker, a kernel
# assert, a native abort. Searched in the whole tail.
TAIL_CAUSES: tuple[Cause, ...] = (
    _c(_SIGKILL, F, "killed by SIGKILL (often the OOM killer)"),
    _c(r"MPS backend out of memory", F, "MPS out of memory"),
    _c(r"CUDA out of memory|CUDA error: out of memory|cudaMalloc failed", F, "CUDA out of memory"),
    _c(_CPU_OOM + r"|not enough space in the buffer", F, "CPU out of memory"),
    _c(r"out of resource", F, "GPU kernel resources exhausted (shared memory)"),
    _c(_NAN_IN_LOG, F, "NaN/inf loss (numerical instability)"),
    _c(r"illegal memory access|cudaErrorIllegalAddress", F, "illegal memory access (CUDA)"),
    _c(_WATCHDOG, F, "NCCL watchdog timeout (hung collective)"),
    _c(r"NCCL error|DistBackendError", F, "NCCL/distributed error"),
    _c(r"segmentation fault|SIGSEGV", F, "segmentation fault"),
    _c(_DISK_FULL, F, "disk full"),
    _c(_GPU_UNSUPPORTED, F, "GPU or driver unavailable/unsupported"),
    _c(r"BackendCompilerFailed|LLVM ERROR|ptxas fatal", F, "torch.compile/triton failure"),
    _c(r"GGML_ASSERT|Abort trap|^Aborted\b|\bAborted\s*$", F, "native abort (assert in a library)"),
    _c(_KERNEL_ASSERT, T, "index out of range (CUDA device-side assert)", True),
)

# Code mistakes whose message is specific enough to trust anywhere in the tail (used only when
# there is no exception line of the run's own, e.g. an IDE's "Exception has occurred" block).
TAIL_CODE_CAUSES: tuple[Cause, ...] = (
    _c(_DTYPE, T, "dtype mismatch", True),
    _c(_DEVICE, T, "device mismatch", True),
    _c(_SHAPE, T, "shape mismatch", True),
)

# Launchers' wrappers: the real error is above them (torchrun, accelerate, mp.spawn, a pool).
WRAPPER = re.compile(
    r"ChildFailedError|CalledProcessError|ProcessRaisedException|ProcessExitedException"
    r"|BrokenProcessPool|Process \d+ terminated with"
)

# A signal that ended the run, by number; 128 + N is the same death reported by a shell.
SIGNALS = {
    2: "SIGINT (interrupted)",
    6: "SIGABRT (aborted)",
    7: "SIGBUS (bus error)",
    9: "SIGKILL (often the OOM killer)",
    11: "SIGSEGV (segmentation fault)",
    15: "SIGTERM",
}


_OOM_FAMILY = re.compile(r"out of memory|OutOfMemory|MemoryError|OOM killer", re.IGNORECASE)
_NAN_FAMILY = re.compile(r"\bnan\b|\binf\b|diverg|\bFAIL\b|loss scale", re.IGNORECASE)


def crash_family(cause: str) -> str:
    """oom / nan / crash: what the search learns from a fundamental crash's cause."""
    if _OOM_FAMILY.search(cause):
        return "oom"
    if _NAN_FAMILY.search(cause):
        return "nan"
    return "crash"
