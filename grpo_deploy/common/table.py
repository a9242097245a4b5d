"""Plain-text table formatting for every CLI verb (one place, so all output looks alike); every cell printed through
shown.printable (a cell may hold what a container or a host's command wrote)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence

from grpo_deploy.common.shown import printable


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], max_width: int | None = None) -> str:
    """Left-aligned columns; the last column wraps to the terminal width (its later lines indented by 2 more), no line
    wider than *max_width* unless the columns before the last one already are."""
    max_width = max_width or max(shutil.get_terminal_size((120, 20)).columns, 80)
    cells = [[printable(h) for h in headers]] + [["" if c is None else printable(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    fixed = sum(widths[:-1]) + 2 * (len(headers) - 1)
    last = max(20, max_width - fixed)
    lines = []
    for n, row in enumerate(cells):
        head = "  ".join(c.ljust(widths[i]) for i, c in enumerate(row[:-1]))
        wrapped = _wrap(row[-1], last, last - 2 if head else last)
        lines.append((head + "  " if head else "") + wrapped[0])
        lines.extend(" " * (fixed + 2 if head else 0) + w for w in wrapped[1:])
        if n == 0:
            lines.append("  ".join("-" * widths[i] for i in range(len(headers) - 1)) + ("  " if head else "")
                         + "-" * min(widths[-1], last))
    return "\n".join(line.rstrip() for line in lines)


def _wrap(text: str, width: int, rest: int) -> list[str]:
    """*text* in lines of *width* (the first) and *rest* (the others) columns, broken between words; a word longer
    than a line (a path) broken after a '/' where it has one, else at the width."""
    lines, cur = [], ""
    for w in text.split(" "):
        limit = width if not lines else rest
        if cur and len(cur) + 1 + len(w) > limit:
            lines.append(cur)
            cur, limit = "", rest
        while len(w) > limit and not cur:
            cut = w.rfind("/", 0, limit) + 1 or limit
            lines.append(w[:cut])
            w, limit = w[cut:], rest
        cur = f"{cur} {w}" if cur else w
    lines.append(cur)
    return lines


def human_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"
