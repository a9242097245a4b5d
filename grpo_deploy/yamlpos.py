"""YAML loading that remembers where every key sits, so errors can name file and line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Path_ = tuple[Any, ...]


@dataclass
class Located:
    """A parsed YAML document plus the line (1-based) of every mapping key and sequence item."""

    data: Any
    source: str
    lines: dict[Path_, int] = field(default_factory=dict)

    def line_of(self, path: Path_) -> int | None:
        """Line of the longest known prefix of *path* (so a bad nested value still points somewhere)."""
        path = tuple(path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)

    def where(self, path: Path_) -> str:
        line = self.line_of(path)
        return f"{self.source}:{line}" if line else self.source


class YamlSyntaxError(ValueError):
    """The file is not valid YAML; the message names file and line."""


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            lines[path + (key,)] = key_node.start_mark.line + 1
            _walk(value_node, path + (key,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), lines)


def load_text(text: str, source: str = "<string>") -> Located:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise YamlSyntaxError(f"{source}{line}: not valid YAML: {exc.problem or exc}") from None
    lines: dict[Path_, int] = {(): 1}
    if node is not None:
        _walk(node, (), lines)
    return Located(data=data, source=source, lines=lines)


def load_file(path: str | Path) -> Located:
    path = Path(path)
    return load_text(path.read_text(encoding="utf-8"), source=str(path))
