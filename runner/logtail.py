"""Follow a growing log file line by line, and read the end of a finished one.

Stdlib only. Guaranteed: every byte appended to the file is delivered exactly once, as part of a
line, in order; invalid UTF-8 becomes U+FFFD; a callback error is logged and never propagates.
Reads are bounded (POLL_MAX_BYTES per ``poll``), so following a flood never holds the caller.
Not guaranteed: that a line is delivered before the writer ends it (partial lines wait until
``flush``), that lines longer than MAX_LINE_CHARS arrive in one piece, or that every line is
delivered when the reader falls more than MAX_BACKLOG_BYTES behind (it skips to the newest part
and delivers a note saying how much it skipped). ``cap_log`` keeps a finished log's head and
tail and notes the cut.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

POLL_MAX_BYTES = 64 << 10
MAX_BACKLOG_BYTES = 8 << 20
FLUSH_BACKLOG_BYTES = 256 << 10
MAX_LINE_CHARS = 1 << 20
LOG_END_BYTES = 2 << 20
LOG_MAX_BYTES = 25_000_000
CUT_NOTE = "[overnight: {cut} bytes cut from the middle of this log ({total} bytes in all)]"
# `\r` counts as a line end: progress bars redraw one terminal line with it.
_LINE_END = re.compile(r"\r\n|\r|\n")


class LogTailer:
    """Reads new bytes from ``path`` on each ``poll`` and calls ``on_line`` per complete line."""

    def __init__(self, path: Path, on_line: Callable[[str], None] | None) -> None:
        self._path = path
        self._on_line = on_line
        self._offset = 0
        self._pending = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._callback_errors = 0
        self._skip_partial = False

    def poll(self, max_bytes: int = POLL_MAX_BYTES, backlog: int = MAX_BACKLOG_BYTES) -> bool:
        """Deliver complete lines appended since the last call, reading at most ``max_bytes``.

        Returns True when more bytes are waiting (the caller may poll again at once).
        """
        if self._on_line is None:
            return False
        try:
            with open(self._path, "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                self._skip_backlog(size, backlog)
                handle.seek(self._offset)
                chunk = handle.read(min(max_bytes, max(0, size - self._offset)))
        except OSError as exc:
            logger.warning("cannot read log %s: %s", self._path, exc)
            return False
        self._offset += len(chunk)
        self._feed(self._decoder.decode(chunk))
        return self._offset < size

    def _skip_backlog(self, size: int, backlog: int) -> None:
        """Far behind a flood, jump to the newest ``backlog`` bytes (at a line start)."""
        behind = size - self._offset
        if behind <= backlog:
            return
        self._offset = size - backlog
        self._decoder.reset()
        self._pending = ""
        self._skip_partial = True
        self._emit(f"[overnight: skipped {behind - backlog} bytes of output]")

    def flush(self) -> None:
        """Deliver what is left (the last FLUSH_BACKLOG_BYTES at most) and any partial line."""
        while self.poll(backlog=FLUSH_BACKLOG_BYTES):
            pass
        if self._on_line is None:
            return
        self._feed(self._decoder.decode(b"", final=True))
        rest = self._pending.removesuffix("\r")
        self._pending = ""
        if rest:
            self._emit(rest)

    def _feed(self, text: str) -> None:
        data = self._pending + text
        if self._skip_partial:
            # After a skip the first (cut) line is dropped up to its end.
            match = _LINE_END.search(data)
            if match is None:
                self._pending = ""
                return
            data = data[match.end():]
            self._skip_partial = False
        # A trailing "\r" may be the first half of "\r\n": keep it until more text arrives.
        hold_cr = data.endswith("\r")
        if hold_cr:
            data = data[:-1]
        pieces = _LINE_END.split(data)
        for line in pieces[:-1]:
            self._emit(line)
        rest = pieces[-1]
        while len(rest) > MAX_LINE_CHARS:
            self._emit(rest[:MAX_LINE_CHARS])
            rest = rest[MAX_LINE_CHARS:]
        self._pending = rest + ("\r" if hold_cr else "")

    def _emit(self, line: str) -> None:
        if self._on_line is None:
            return
        try:
            self._on_line(line)
        except Exception:
            self._callback_errors += 1
            if self._callback_errors == 1:
                logger.exception("on_line callback failed (further failures logged at debug)")
            else:
                logger.debug("on_line callback failed again", exc_info=True)


def read_log_end(path: Path, max_bytes: int = LOG_END_BYTES) -> str:
    """The last ``max_bytes`` of the file as text, starting at a line boundary; "" if unreadable."""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = max(0, size - max_bytes)
            handle.seek(start)
            data = handle.read()
    except OSError as exc:
        logger.warning("cannot read log %s: %s", path, exc)
        return ""
    text = data.decode("utf-8", errors="replace")
    if start > 0:
        # The first line was cut by the byte window; drop it rather than show half a line.
        _, _, text = text.partition("\n")
    return text


def cap_log(path: Path, max_bytes: int = LOG_MAX_BYTES) -> int:
    """Shrink a finished log over ``max_bytes`` to its head and tail with a note of the cut.

    Returns the bytes cut (0 when the log was small enough or unreadable). The result, note
    included, is at most ``max_bytes`` long; lines at the cut are kept whole.
    """
    try:
        size = path.stat().st_size
        if size <= max_bytes:
            return 0
        with open(path, "rb") as handle:
            keep = max(0, (max_bytes - 200) // 2)
            head = handle.read(keep)
            handle.seek(size - keep)
            tail = handle.read(keep)
        head = head[: head.rfind(b"\n") + 1]
        tail = tail[tail.find(b"\n") + 1 :]
        cut = size - len(head) - len(tail)
        note = CUT_NOTE.format(cut=cut, total=size).encode() + b"\n"
        tmp = path.with_name(path.name + ".cap")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(head + note + tail)
        os.replace(tmp, path)
    except OSError as exc:
        logger.warning("cannot cap log %s: %s", path, exc)
        return 0
    logger.info("log %s: cut %d of %d bytes", path, cut, size)
    return cut
