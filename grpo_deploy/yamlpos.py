"""YAML loading that remembers where every key sits, so errors can name file and line.

A spec is small, hand-written YAML, so the loader refuses what a spec never needs and what a hostile or broken
file could use to hang or crash the kit: anchors and aliases (alias bombs, self-references), duplicate keys (the
last one would win silently), keys that are not strings, nesting deeper than MAX_DEPTH, files over MAX_BYTES and
files that are not UTF-8 text. Every refusal is a YamlSyntaxError whose message names the file (and the line
where there is one). Values are otherwise exactly what ``yaml.safe_load`` returns (YAML 1.1: ``on`` is True).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import Mark

Path_ = tuple[Any, ...]

MAX_BYTES = 1 << 20  # 1 MiB: a spec is a page or two of YAML
MAX_DEPTH = 64  # nested mappings/sequences; a spec needs about five

_STR_TAG = "tag:yaml.org,2002:str"
_VALUE_TAG = "tag:yaml.org,2002:value"  # the key `=`; SafeConstructor turns it into the string '='
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Characters a YAML stream may not hold (the same set as yaml.reader.Reader.NON_PRINTABLE).
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ALIAS_MESSAGE = "YAML anchors and aliases are not supported in a spec; write the value out"


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
    """The file is not valid YAML, or is YAML a spec may not use; the message names file and line."""


class _Refused(Exception):
    """Raised while composing: the document uses something a spec may not; carries the line (1-based)."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line
        self.message = message


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader (pure Python, so compose_node can be overridden) that refuses, while composing, what a spec
    may not hold. Nothing is expanded before the checks: an alias is refused at its first event."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(event.start_mark.line + 1, _ALIAS_MESSAGE)
        collection = isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent))
        if collection:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Refused(event.start_mark.line + 1,
                               f"nested deeper than {MAX_DEPTH} levels; a spec needs only a few, flatten it")
        try:
            return super().compose_node(parent, index)
        finally:
            if collection:
                self._depth -= 1

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)
        first_line: dict[str, int] = {}
        for key_node, _ in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                raise _Refused(line, "YAML merge keys (<<) are not supported in a spec; write the keys out")
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in (_STR_TAG, _VALUE_TAG):
                raise _Refused(line, f"keys must be strings, got {_describe_key(key_node)}; "
                                     "quote it if it is meant as a name")
            key = key_node.value
            if key in first_line:
                raise _Refused(line, f"key {key!r} appears twice in the same mapping "
                                     f"(lines {first_line[key]} and {line}); keep one")
            first_line[key] = line
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        # An explicit tag on a value that does not fit it (`!!int zz`, `!!timestamp x`) makes SafeConstructor
        # raise ValueError/AttributeError; turn those into a marked error on that node.
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, AttributeError, OverflowError, KeyError, IndexError) as exc:
            value = node.value if len(str(node.value)) <= 40 else f"{str(node.value)[:40]}..."
            raise ConstructorError(None, None, f"cannot read {value!r} as {_short_tag(node.tag)}: {exc}",
                                   node.start_mark) from None


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _describe_key(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    kind = node.tag.removeprefix("tag:yaml.org,2002:")
    return f"{node.value!r} (read as {kind})" if node.value else f"an empty key (read as {kind})"


def _line_at(text: str | bytes, offset: int) -> int:
    newline = b"\n" if isinstance(text, bytes) else "\n"
    return text.count(newline, 0, offset) + 1  # type: ignore[arg-type]


def _too_big(source: str, size: int) -> YamlSyntaxError:
    return YamlSyntaxError(f"{source}: the spec is {size} bytes; the limit is 1 MiB")


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
    """Parse one YAML document (parsed once: composed, checked, then constructed from the node)."""
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise _too_big(source, len(text.encode("utf-8", "surrogatepass")))
    bad = _NON_PRINTABLE.search(text)
    if bad:
        raise YamlSyntaxError(
            f"{source}:{_line_at(text, bad.start())}: holds the control character {ord(bad.group()):#04x}, "
            "which YAML text cannot contain (is this a binary file?); pass the spec's YAML file")
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except _Refused as exc:
        raise YamlSyntaxError(f"{source}:{exc.line}: {exc.message}") from None
    except yaml.MarkedYAMLError as exc:
        mark: Mark | None = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise YamlSyntaxError(f"{source}{line}: not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:  # ReaderError and other unmarked errors
        raise YamlSyntaxError(f"{source}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    lines: dict[Path_, int] = {(): 1}
    if node is not None:
        _walk(node, (), lines)
    return Located(data=data, source=source, lines=lines)


def shown_path(path: str | Path) -> str:
    """A path as an error shows it: as it is, or quoted when it holds a newline, NUL or other unprintable character
    (so that an error stays one line)."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def load_file(path: str | Path) -> Located:
    """Read *path* as a UTF-8 YAML spec: size checked before reading all of it, then decoded, then parsed."""
    path = Path(path)
    source = shown_path(path)
    if "\x00" in str(path):
        raise YamlSyntaxError(f"{source}: a path cannot hold a NUL byte; check the -f argument")
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_BYTES:  # a regular file: refused before reading any of it
                raise _too_big(source, size)
            raw = fh.read(MAX_BYTES + 1)  # bounded where the size is unknown (pipes, devices)
            if len(raw) > MAX_BYTES:
                raise YamlSyntaxError(f"{source}: the spec is more than {MAX_BYTES} bytes; the limit is 1 MiB")
    except FileNotFoundError:
        raise YamlSyntaxError(f"{source}: no such file; check the path "
                              "(or write a spec with `grpo-deploy init`)") from None
    except IsADirectoryError:
        raise YamlSyntaxError(f"{source}: is a directory, not a spec file; "
                              "pass the path of the spec's YAML file") from None
    except PermissionError:
        raise YamlSyntaxError(f"{source}: permission denied reading the file; make it readable by this user "
                              "(e.g. chmod u+r) or run as a user who can read it") from None
    except OSError as exc:
        raise YamlSyntaxError(f"{source}: cannot read the file ({exc.strerror or exc}); "
                              "check the path and that it is a regular file") from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise YamlSyntaxError(f"{source}: the file is UTF-16 encoded; save the spec as UTF-8")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise YamlSyntaxError(f"{source}:{_line_at(raw, nul)}: holds a NUL byte, so it is a binary file, "
                              "not YAML text; pass the spec's YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlSyntaxError(f"{source}:{_line_at(raw, exc.start)}: not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                              f"at offset {exc.start}); save the spec as UTF-8") from None
    return load_text(text.removeprefix("\ufeff"), source=source)
