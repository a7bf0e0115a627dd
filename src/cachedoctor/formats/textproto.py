"""A minimal, defensive parser for protobuf text format (what XLA writes for autotune results).

We have no schema, so the result is untyped: a message is a dict from field name to the list of
its values, each an ``int``, a ``float``, ``bytes`` (quoted strings, after unescaping), a ``str``
(a bare identifier: enum value, ``true``, ``inf``) or a nested message. Extension and ``Any``
field names keep their brackets (``"[type.googleapis.com/xla.Foo]"``). Any malformed input
raises ``TextFormatError`` (a ``CorruptFormat``) naming the line and column; depth and size are
bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from cachedoctor.formats.errors import CorruptFormat, TooLarge

TextValue = Union[int, float, bytes, str, "TextMessage"]
TextMessage = dict[str, list[TextValue]]

MAX_DEPTH = 64
MAX_TEXT = 16 << 20

_TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<number>-?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?))
  | (?P<ident>-?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[{}<>\[\]:,;/.])
    """,
    re.VERBOSE,
)

_SIMPLE_ESCAPES = {
    "n": 10, "t": 9, "r": 13, "\\": 92, "'": 39, '"': 34, "?": 63,
    "a": 7, "b": 8, "f": 12, "v": 11,
}  # fmt: skip


class TextFormatError(CorruptFormat):
    """The text is not well-formed protobuf text format."""


@dataclass
class _Token:
    kind: str
    text: str
    pos: int


def _unescape(body: str, where: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        i += 1
        if i >= len(body):
            raise TextFormatError(f"dangling backslash in string {where}")
        esc = body[i]
        if esc in _SIMPLE_ESCAPES:
            out.append(_SIMPLE_ESCAPES[esc])
            i += 1
        elif esc in "01234567":
            m = re.match(r"[0-7]{1,3}", body[i:])
            assert m is not None
            out.append(int(m.group(), 8) & 0xFF)
            i += len(m.group())
        elif esc in "xX":
            m = re.match(r"[0-9a-fA-F]{1,2}", body[i + 1 :])
            if m is None:
                raise TextFormatError(f"bad \\x escape in string {where}")
            out.append(int(m.group(), 16))
            i += 1 + len(m.group())
        elif esc in "uU":
            width = 4 if esc == "u" else 8
            digits = body[i + 1 : i + 1 + width]
            if len(digits) != width or not re.fullmatch(r"[0-9a-fA-F]+", digits):
                raise TextFormatError(f"bad \\{esc} escape in string {where}")
            try:
                out += chr(int(digits, 16)).encode("utf-8", "surrogatepass")
            except ValueError:
                raise TextFormatError(f"bad \\{esc} escape in string {where}") from None
            i += 1 + width
        else:
            raise TextFormatError(f"unknown escape \\{esc} in string {where}")
    return bytes(out)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = self._tokenize(text)
        self.i = 0

    def where(self, pos: int) -> str:
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return f"at line {line}, column {col}"

    def _tokenize(self, text: str) -> list[_Token]:
        tokens: list[_Token] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise TextFormatError(f"unexpected character {text[pos]!r} {self.where(pos)}")
            kind = m.lastgroup or ""
            if kind != "space":
                tokens.append(_Token(kind, m.group(), pos))
            pos = m.end()
        return tokens

    def peek(self) -> _Token | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def next(self, what: str) -> _Token:
        tok = self.peek()
        if tok is None:
            raise TextFormatError(f"text ends where {what} was expected")
        self.i += 1
        return tok

    def expect(self, text: str) -> None:
        tok = self.next(repr(text))
        if tok.text != text:
            raise TextFormatError(f"expected {text!r}, found {tok.text!r} {self.where(tok.pos)}")

    def message(self, close: str | None, depth: int) -> TextMessage:
        if depth > MAX_DEPTH:
            tok = self.peek()
            where = self.where(tok.pos if tok else 0)
            raise TextFormatError(f"nesting deeper than {MAX_DEPTH} {where}")
        out: TextMessage = {}
        while True:
            tok = self.peek()
            if tok is None:
                if close is not None:
                    raise TextFormatError(f"text ends inside a message (missing {close!r})")
                return out
            if close is not None and tok.text == close:
                self.i += 1
                return out
            name = self.field_name()
            value_tok = self.peek()
            if value_tok is not None and value_tok.text == ":":
                self.i += 1
                value_tok = self.peek()
            if value_tok is not None and value_tok.text in ("{", "<"):
                self.i += 1
                values: list[TextValue] = [
                    self.message("}" if value_tok.text == "{" else ">", depth + 1)
                ]
            elif value_tok is not None and value_tok.text == "[":
                self.i += 1
                values = self.list_values(depth)
            else:
                values = [self.scalar()]
            out.setdefault(name, []).extend(values)
            sep = self.peek()
            if sep is not None and sep.text in (",", ";"):
                self.i += 1

    def field_name(self) -> str:
        tok = self.next("a field name")
        if tok.kind == "ident" and not tok.text.startswith("-"):
            return tok.text
        if tok.text == "[":
            parts = []
            while True:
                part = self.next("']'")
                if part.text == "]":
                    break
                if not (part.kind == "ident" or part.text in (".", "/")):
                    raise TextFormatError(f"bad extension name {self.where(part.pos)}")
                parts.append(part.text)
            return "[" + "".join(parts) + "]"
        raise TextFormatError(f"expected a field name, found {tok.text!r} {self.where(tok.pos)}")

    def list_values(self, depth: int) -> list[TextValue]:
        values: list[TextValue] = []
        tok = self.peek()
        if tok is not None and tok.text == "]":
            self.i += 1
            return values
        while True:
            tok = self.peek()
            if tok is not None and tok.text in ("{", "<"):
                self.i += 1
                values.append(self.message("}" if tok.text == "{" else ">", depth + 1))
            else:
                values.append(self.scalar())
            end = self.next("',' or ']'")
            if end.text == "]":
                return values
            if end.text != ",":
                raise TextFormatError(f"expected ',' or ']' {self.where(end.pos)}")

    def scalar(self) -> TextValue:
        tok = self.next("a value")
        if tok.kind == "string":
            data = _unescape(tok.text[1:-1], self.where(tok.pos))
            while (more := self.peek()) is not None and more.kind == "string":
                self.i += 1
                data += _unescape(more.text[1:-1], self.where(more.pos))
            return data
        if tok.kind == "number":
            return _number(tok.text)
        if tok.kind == "ident":
            return tok.text
        raise TextFormatError(f"expected a value, found {tok.text!r} {self.where(tok.pos)}")


def _number(text: str) -> int | float:
    try:
        return _parse_number(text)
    except ValueError:
        raise TextFormatError(f"bad number {text!r}") from None


def _parse_number(text: str) -> int | float:
    body = text.lstrip("-")
    sign = -1 if text.startswith("-") else 1
    if body[:2] in ("0x", "0X"):
        return sign * int(body[2:], 16)
    if re.fullmatch(r"\d+", body):
        if len(body) > 1 and body.startswith("0"):
            return sign * int(body, 8)  # C-style octal, as protobuf accepts
        return sign * int(body)
    return sign * float(body.rstrip("fF"))


def parse(text: str) -> TextMessage:
    """Parse one message in text format; raises TextFormatError or TooLarge."""
    if len(text) > MAX_TEXT:
        raise TooLarge(f"text proto of {len(text)} characters, over the {MAX_TEXT} limit")
    return _Parser(text).message(None, 0)


def first_message(msg: TextMessage, name: str) -> TextMessage | None:
    """The last value of a message field (proto semantics), or None."""
    for value in reversed(msg.get(name, [])):
        if isinstance(value, dict):
            return value
    return None


def first_scalar(msg: TextMessage, name: str) -> int | float | bytes | str | None:
    values = [v for v in msg.get(name, []) if not isinstance(v, dict)]
    return values[-1] if values else None
