"""The one error type users see: ``error: <where>: <what>`` and exit code 2."""

from __future__ import annotations

MAX_LINE = 1000  # an error line never echoes a whole file (a value read from a huge or binary input)


class KvsimError(Exception):
    """Bad input or an impossible configuration.

    ``where`` names the file (and line or key) at fault; ``what`` says what is wrong, in one line.
    The CLI prints ``error: {where}: {what}`` and exits 2, with no traceback.
    """

    def __init__(self, where: str, what: str) -> None:
        # args must be (where, what): SimPy re-raises a process's exception as type(e)(*e.args), and
        # pickling (worker processes, Ray) rebuilds it the same way
        super().__init__(where, what)
        self.where = where
        self.what = what

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"

    def one_line(self) -> str:
        text = f"error: {self.where}: {self.what}" if self.where else f"error: {self.what}"
        text = " ".join(text.split())
        return text if len(text) <= MAX_LINE else text[: MAX_LINE - 3] + "..."
