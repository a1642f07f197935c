"""A text stream that says it is a terminal, for the progress bars that redraw in place only
there (:func:`ggopt.opt.progress.write_progress`)."""

from __future__ import annotations

import io


class Terminal(io.StringIO):
    """A ``StringIO`` whose ``isatty()`` is True."""

    def isatty(self) -> bool:
        return True
