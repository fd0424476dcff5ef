"""Follow a growing log file line by line, and read the end of a finished one.

Stdlib only. Guaranteed: every byte appended to the file is delivered exactly once, as part of a
line, in order; invalid UTF-8 becomes U+FFFD; a callback error is logged and never propagates.
Not guaranteed: that a line is delivered before the writer ends it (partial lines wait until
``flush``), or that lines longer than MAX_LINE_CHARS arrive in one piece.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

READ_CHUNK_BYTES = 1 << 20
MAX_LINE_CHARS = 1 << 20
LOG_END_BYTES = 2 << 20
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

    @property
    def callback_errors(self) -> int:
        """How many times ``on_line`` raised."""
        return self._callback_errors

    def poll(self) -> None:
        """Deliver the complete lines appended since the last call."""
        if self._on_line is None:
            return
        try:
            with open(self._path, "rb") as handle:
                handle.seek(self._offset)
                while chunk := handle.read(READ_CHUNK_BYTES):
                    self._offset += len(chunk)
                    self._feed(self._decoder.decode(chunk))
        except OSError as exc:
            logger.warning("cannot read log %s: %s", self._path, exc)

    def flush(self) -> None:
        """Read what is left and deliver the final partial line, if any."""
        self.poll()
        if self._on_line is None:
            return
        self._feed(self._decoder.decode(b"", final=True))
        rest = self._pending.removesuffix("\r")
        self._pending = ""
        if rest:
            self._emit(rest)

    def _feed(self, text: str) -> None:
        data = self._pending + text
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
