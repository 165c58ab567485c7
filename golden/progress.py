"""Progress on stderr for long commands: a tqdm bar on a terminal, else a plain line every few seconds.

A bar redrawn with carriage returns floods a log file (CI, ``| tee``), so when the stream is not a
terminal :class:`Progress` prints one line for the first finished item, then at most one every
:data:`LINE_INTERVAL` seconds, and one for the last. Used by ``gdn2-oracle golden`` and by
``gdn2-oracle validate|bench`` (which may import ``golden``; this module imports nothing of the project).
"""

from __future__ import annotations

import sys
import time

LINE_INTERVAL = 5.0  # seconds between two progress lines when stderr is not a terminal


def _isatty(stream):
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


class Progress:
    """Count ``total`` items: ``update(n)``, ``set_postfix_str(label)``, ``close()`` (tqdm's names)."""

    def __init__(self, total, desc="", unit="it", *, file=None, interval=LINE_INTERVAL):
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.file = file if file is not None else sys.stderr
        self.count, self.postfix = 0, ""
        self.t0, self.last_line = time.monotonic(), None
        self.bar = None
        if _isatty(self.file):
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, desc=desc, unit=unit, file=self.file, dynamic_ncols=True, leave=False)

    def set_postfix_str(self, s):
        """Name what is running (shown on the bar, and on the next line)."""
        self.postfix = s
        if self.bar is not None:
            self.bar.set_postfix_str(s)

    def update(self, n=1):
        """``n`` more items are done."""
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if self.last_line is None or now - self.last_line >= self.interval or self.count >= self.total:
            self.last_line = now
            print(f"{self.desc}: {self.count}/{self.total} {self.unit}s done ({now - self.t0:.0f} s)"
                  f"{' ' + self.postfix if self.postfix else ''}", file=self.file, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
