"""A bar chart written as a PNG by hand (zlib + struct), for machines without matplotlib:
grouped bars on a log scale, a line at 1x, and labels in a 3x5 pixel font.

Standard library only.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

# 3x5 glyphs: five rows of three bits, top row first.
FONT = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111",
    "3": "111001111001111", "4": "101101111001001", "5": "111100111001111",
    "6": "111100111101111", "7": "111001010010010", "8": "111101111101111",
    "9": "111101111001111", "a": "010101111101101", "b": "110101110101110",
    "c": "011100100100011", "d": "110101101101110", "e": "111100110100111",
    "f": "111100110100100", "g": "011100101101011", "h": "101101111101101",
    "i": "111010010010111", "j": "001001001101010", "k": "101101110101101",
    "l": "100100100100111", "m": "101111111101101", "n": "110101101101101",
    "o": "010101101101010", "p": "110101110100100", "q": "010101101110011",
    "r": "110101110101101", "s": "011100010001110", "t": "111010010010010",
    "u": "101101101101111", "v": "101101101101010", "w": "101101111111101",
    "x": "101101010101101", "y": "101101010010010", "z": "111001010100111",
    ".": "000000000000010", "-": "000000111000000", "_": "000000000000111",
    "^": "010101000000000", "/": "001001010100100", "(": "010100100100010",
    ")": "010001001001010", ",": "000000000010100", " ": "000000000000000",
}
COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: tuple[int, int, int]) -> None:
        x0, x1 = max(0, min(x0, x1)), min(self.width, max(x0, x1))
        y0, y1 = max(0, min(y0, y1)), min(self.height, max(y0, y1))
        for y in range(y0, y1):
            start = (y * self.width + x0) * 3
            self.pixels[start : start + 3 * (x1 - x0)] = bytes(color) * (x1 - x0)

    def text(self, x: int, y: int, text: str, scale: int = 2, vertical: bool = False) -> None:
        """Draws `text` at (x, y); `vertical` stacks the glyphs downwards instead."""
        for index, char in enumerate(text.lower()):
            glyph = FONT.get(char, FONT[" "])
            for bit, on in enumerate(glyph):
                if on == "1":
                    row, col = divmod(bit, 3)
                    if vertical:
                        px, py = x + col * scale, y + index * 6 * scale + row * scale
                    else:
                        px, py = x + (index * 4 + col) * scale, y + row * scale
                    self.rect(px, py, px + scale, py + scale, (0, 0, 0))

    def save(self, path: Path) -> None:
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * self.width * 3 : (y + 1) * self.width * 3])
            for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
        png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
        path.write_bytes(png)


def bar_chart(
    path: Path, names: list[str], series: dict[str, list[float | None]], title: str
) -> None:
    """Grouped bars of `series` (label -> one value per name) on a log scale around 1."""
    values = [v for vs in series.values() for v in vs if v]
    top = math.log10(max(values + [10.0])) + 0.1
    bottom = math.log10(min(values + [0.1])) - 0.1
    width, height, left, plot_top, plot_bottom = 1200, 860, 70, 50, 380
    canvas = Canvas(width, height)
    canvas.text(left, 12, title[:140])

    def y_of(value: float) -> int:
        fraction = (math.log10(value) - bottom) / (top - bottom)
        return round(plot_bottom - fraction * (plot_bottom - plot_top))

    for power in range(math.floor(bottom), math.ceil(top) + 1):
        if bottom <= power <= top:
            y = y_of(10.0**power)
            canvas.rect(left - 6, y, width - 20, y + 1, (220, 220, 220))
            canvas.text(8, y - 5, f"{10.0**power:g}x")
    group = (width - left - 20) / max(1, len(names))
    bar = group * 0.8 / max(1, len(series))
    for s, (label, vs) in enumerate(series.items()):
        color = COLORS[s % len(COLORS)]
        for i, value in enumerate(vs):
            if value:
                x0 = round(left + i * group + group * 0.1 + s * bar)
                canvas.rect(x0, y_of(value), round(x0 + bar) - 1, y_of(1.0), color)
        canvas.rect(left + 200 * s, 32, left + 200 * s + 12, 44, color)
        canvas.text(left + 200 * s + 18, 34, label)
    canvas.rect(left, y_of(1.0), width - 20, y_of(1.0) + 2, (0, 0, 0))
    for i, name in enumerate(names):
        canvas.text(round(left + (i + 0.5) * group) - 3, plot_bottom + 12, name[:38], vertical=True)
    canvas.save(path)
