"""The IR's exceptions: `HloParseError` (line, column, caret) and `HloVerifyError` (the failing
instruction marked among its neighbours, with the user's source line), and `BuilderError`.
Imports nothing from the rest of xfuse beyond this package.
"""

from __future__ import annotations


class HloError(Exception):
    """Base of the IR's errors."""


class HloParseError(HloError):
    """Malformed HLO text. `line` and `column` are 1-based."""

    def __init__(self, message: str, line: int, column: int, source_line: str) -> None:
        self.message = message
        self.line = line
        self.column = column
        self.source_line = source_line
        caret = " " * (column - 1) + "^"
        super().__init__(f"{line}:{column}: {message}\n  {source_line}\n  {caret}")


class HloVerifyError(HloError):
    """An ill-formed module; the message names the instruction and shows it in context."""

    def __init__(self, message: str, instruction: str | None = None, context: str = "") -> None:
        self.message = message
        self.instruction = instruction
        self.context = context
        super().__init__(message + (f"\n{context}" if context else ""))


class BuilderError(HloError, ValueError):
    """A builder call with operands or attributes the op does not accept."""
