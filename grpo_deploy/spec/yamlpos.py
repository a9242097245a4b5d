"""YAML loading that remembers where every key sits, so errors can name file and line.

A spec is small, hand-written YAML, so the loader refuses what a spec never needs and what a hostile or broken
file could use to hang or crash the kit: anchors and aliases (alias bombs, self-references), duplicate keys (the
last one would win silently), keys that are not strings, nesting deeper than MAX_DEPTH, files over MAX_BYTES and
files that are not UTF-8 text. Every refusal is a YamlSyntaxError whose message names the file (and the line
where there is one). Values are otherwise exactly what ``yaml.safe_load`` returns (YAML 1.1: ``on`` is True).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.error import Mark

from grpo_deploy.common.readback import ReadRefused, line_at, read_bytes, shown_path
from grpo_deploy.common.shown import shown, shown_key

Path_ = tuple[Any, ...]

MAX_BYTES = 1 << 20  # 1 MiB: a spec is a page or two of YAML
MAX_DEPTH = 64  # nested mappings/sequences; a spec needs about five

_STR_TAG = "tag:yaml.org,2002:str"
_VALUE_TAG = "tag:yaml.org,2002:value"  # the key `=`; SafeConstructor turns it into the string '='
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Characters a YAML stream may not hold (the same set as yaml.reader.Reader.NON_PRINTABLE).
_NON_PRINTABLE = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"
# The numbers a spec writes: plain decimal. YAML 1.1 also reads 0755 as octal (01000 is 512), 1:30 as base 60 (90),
# 0x1f, 0b101 and 1_000: a reader of the spec (or another YAML 1.2 tool) would see another number than the kit.
_PLAIN_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_PLAIN_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)")
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
                raise _Refused(line, f"key {shown_key(key)!r} appears twice in the same mapping "
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
        except (ValueError, TypeError, AttributeError, OverflowError, KeyError, IndexError):
            # Neither the value nor the exception's text (which quotes it) is shown past a scrubbed prefix.
            raise ConstructorError(None, None, f"cannot read {shown(node.value)} as {_short_tag(node.tag)}",
                                   node.start_mark) from None


def _plain_number(node: yaml.ScalarNode, path: Path_) -> None:
    """Refuse a YAML 1.1 number read from untagged text that is not plain decimal (octal, base 60, hex, binary,
    with '_'), naming its key."""
    if node.style is not None or node.tag not in (_INT_TAG, _FLOAT_TAG) or \
            _SpecLoader.resolve(_RESOLVER, yaml.ScalarNode, node.value, (True, False)) != node.tag:
        return
    text = node.value
    plain = _PLAIN_INT if node.tag == _INT_TAG else _PLAIN_FLOAT
    if plain.fullmatch(text):
        return
    digits = text.lstrip("+-")
    if ":" in text:
        kind = "a base-60 number (YAML 1.1 reads 1:30 as 90)"
    elif "_" in text:
        kind = "a number with '_' (YAML 1.1 drops them; YAML 1.2 reads it as text)"
    elif digits[:2].lower() in ("0x", "0b"):
        kind = "a hexadecimal or binary number"
    elif node.tag == _INT_TAG and digits.startswith("0"):
        kind = "an octal number (YAML 1.1 reads 01000 as 512)"
    else:
        kind = "a number that is not plain decimal"
    key = ".".join(f"[{p}]" if isinstance(p, int) else shown_key(p) for p in path).replace(".[", "[")
    raise _Refused(node.start_mark.line + 1, f"{key or '<top>'}: {shown(text)} is {kind}: write the plain decimal "
                                             "number, or quote it if it is text (a umask: '0022')")


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix("tag:yaml.org,2002:") if tag.startswith("tag:yaml.org,2002:") else tag


def _describe_key(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    kind = node.tag.removeprefix("tag:yaml.org,2002:")
    return f"{shown(node.value)} (read as {kind})" if node.value else f"an empty key (read as {kind})"


def _line_at(text: str | bytes, offset: int) -> int:
    newline = b"\n" if isinstance(text, bytes) else "\n"
    return text.count(newline, 0, offset) + 1  # type: ignore[arg-type]


def _too_big(source: str, size: int) -> YamlSyntaxError:
    return YamlSyntaxError(f"{source}: the spec is {size} bytes; the limit is 1 MiB")


_RESOLVER = yaml.resolver.Resolver()


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> None:
    if isinstance(node, yaml.ScalarNode):
        _plain_number(node, path)
    elif isinstance(node, yaml.MappingNode):
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
        try:
            _walk(node, (), lines)
        except _Refused as exc:
            raise YamlSyntaxError(f"{source}:{exc.line}: {exc.message}") from None
    return Located(data=data, source=source, lines=lines)


def load_file(path: str | Path) -> Located:
    """Read *path* as a UTF-8 YAML spec through the kit's one bounded reader (a regular file only, never through a
    link, never blocking on a FIFO or device, never more than MAX_BYTES read), then parse it."""
    source = shown_path(path)
    try:
        raw = read_bytes(path, MAX_BYTES, "a spec")
    except ReadRefused as exc:
        if exc.kind == "missing":
            raise YamlSyntaxError(f"{source}: no such file; check the path "
                                  "(or write a spec with `grpo-deploy init`)") from None
        if exc.kind == "too-big":
            raise YamlSyntaxError(f"{source}: the spec is {exc.size or 'more than ' + str(MAX_BYTES)} bytes; "
                                  "the limit is 1 MiB") from None
        if exc.kind == "not-regular" and Path(path).is_dir():
            raise YamlSyntaxError(f"{source}: is a directory, not a spec file; "
                                  "pass the path of the spec's YAML file") from None
        raise YamlSyntaxError(str(exc)) from None
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise YamlSyntaxError(f"{source}: the file is UTF-16 encoded; save the spec as UTF-8")
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise YamlSyntaxError(f"{source}:{line_at(raw, nul)}: holds a NUL byte, so it is a binary file, "
                              "not YAML text; pass the spec's YAML file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlSyntaxError(f"{source}:{line_at(raw, exc.start)}: not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                              f"at offset {exc.start}); save the spec as UTF-8") from None
    return load_text(text.removeprefix("\ufeff"), source=source)
