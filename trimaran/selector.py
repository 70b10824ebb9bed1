"""JMS message selectors: parsed once, evaluated per message.

A selector is the conditional subset of SQL-92 that JMS 2.0 (section 3.8.1) defines, the filter
``apache.org:selector-filter:string`` carries for AMQP 1.0 receivers:

- literals: strings in single quotes (``''`` is a quote), exact numerics (``57``, ``-957``, ``0x1F``,
  ``017``, ``10L``), approximate numerics (``7E3``, ``-57.9E2``, ``7.``, ``.5``, ``1.5f``),
  ``TRUE`` and ``FALSE``;
- identifiers (Java identifiers that are not ``NULL``, ``TRUE``, ``FALSE``, ``NOT``, ``AND``, ``OR``,
  ``BETWEEN``, ``LIKE``, ``IN``, ``IS``, ``ESCAPE``), read from the message's fields: a missing one
  is ``NULL``;
- ``=`` ``<>`` ``<`` ``<=`` ``>`` ``>=``, ``+`` ``-`` ``*`` ``/``, unary ``+`` and ``-``;
- ``[NOT] BETWEEN a AND b``, ``[NOT] IN ('a', 'b')``, ``[NOT] LIKE 'pattern' [ESCAPE 'c']``
  (``_`` one character, ``%`` any run), ``IS [NOT] NULL``, parentheses;
- ``AND``, ``OR``, ``NOT`` with SQL's three values: a comparison with ``NULL``, of unlike types, or
  of strings or booleans by order is UNKNOWN, and a message is selected only when the whole
  selector is TRUE. Keywords are case-insensitive, identifiers are not.

Two readings where JMS leaves room, both as ActiveMQ does: a field that holds text and is compared
with or computed on a number is read as that number when it is one (MQTT user properties and
AMQP 0.9.1 string headers carry only text), and ``/`` divides as a floating-point number (a
division by zero is UNKNOWN).

:func:`compile_selector` parses a selector into a :class:`Selector` (closures, no tree walked per
message) or raises :class:`SelectorError`, which says where and what was expected. Stdlib only, no
clock: every hull and the queues may use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["Fields", "Selector", "SelectorError", "Text", "compile_selector"]

#: What a selector reads a message through: ``get(name)`` is the field's value or None.
Fields = Mapping[str, Any]
Value = Any  # None (NULL / UNKNOWN), bool, int, float or str
Node = Callable[[Fields], Value]

KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "NULL", "TRUE", "FALSE", "ESCAPE"}
)
MAX_LENGTH: Final = 64 * 1024  # longer selectors are refused, not parsed
MAX_NESTING: Final = 40  # parentheses, NOT and unary signs inside each other (the parser recurses)
MAX_DEPTH: Final = 100  # operators inside each other once parsed (evaluation recurses)


class SelectorError(ValueError):
    """A selector that does not parse: ``position`` (0-based offset into the text; the message says
    the column, from 1) and what the parser ``expected`` there."""

    def __init__(self, text: str, position: int, expected: str, found: str) -> None:
        self.text = text
        self.position = position
        self.expected = expected
        self.found = found
        super().__init__(f"selector error at column {position + 1}: expected {expected}, found {found}")


class Text(str):
    """A field value that is text only because its protocol has no other type (MQTT user
    properties): compared with a number, it is read as one when it is one."""

    __slots__ = ()


class Selector:
    """A compiled selector: ``selector(fields)`` is True when the message is selected."""

    __slots__ = ("_node", "names", "text")

    def __init__(self, text: str, node: Node, names: frozenset[str]) -> None:
        self.text = text
        self._node = node
        self.names = names  # the identifiers it reads

    def __call__(self, fields: Fields) -> bool:
        return self._node(fields) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector:
    """Parse ``text`` once into a :class:`Selector`; :class:`SelectorError` when it does not parse."""
    if len(text) > MAX_LENGTH:
        raise SelectorError(text, MAX_LENGTH, f"at most {MAX_LENGTH} characters", "more")
    parser = _Parser(text)
    node, kind = parser.expression()
    token = parser.peek()
    if token.kind != "end":
        parser.fail("an operator or the end of the selector", token)
    if kind not in (BOOL, ANY):
        raise SelectorError(text, 0, "a condition (a comparison, LIKE, IN, BETWEEN, IS NULL ...)", kind)
    return Selector(text, node, frozenset(parser.names))


# -- tokens -----------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<string>'(?:[^']|'')*')
  | (?P<approx>(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?[fFdD]?|\d+[eE][+-]?\d+[fFdD]?|\d+[fFdD])
  | (?P<hex>0[xX][0-9a-fA-F]+[lL]?)
  | (?P<exact>\d+[lL]?)
  | (?P<ident>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|<=|>=|[=<>+\-*/(),])
    """,
    re.VERBOSE,
)

BOOL: Final = "a condition"
NUM: Final = "a number"
STR: Final = "a string"
ANY: Final = "a field"  # an identifier: any type until a message says


class _Token:
    __slots__ = ("kind", "pos", "text", "value")

    def __init__(self, kind: str, text: str, pos: int, value: Value = None) -> None:
        self.kind = kind  # "string", "number", "ident", "keyword", "op", "end"
        self.text = text
        self.pos = pos
        self.value = value

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the selector"
        return repr(self.text)


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    pos, end = 0, len(text)
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] == "'":
                raise SelectorError(text, pos, "a closing quote for the string that starts here", "none")
            raise SelectorError(
                text, pos, "a field, a literal, an operator or a parenthesis", repr(text[pos])
            )
        kind, lexeme = m.lastgroup, m.group()
        nxt = m.end()
        if nxt < end and kind in ("approx", "hex", "exact") and (text[nxt].isalnum() or text[nxt] in "_$."):
            raise SelectorError(text, nxt, "an operator after a number", repr(text[nxt]))
        if kind == "string":
            out.append(_Token("string", lexeme, pos, lexeme[1:-1].replace("''", "'")))
        elif kind == "approx":
            out.append(_Token("number", lexeme, pos, float(lexeme.rstrip("fFdD"))))
        elif kind == "hex":
            out.append(_Token("number", lexeme, pos, int(lexeme.rstrip("lL"), 16)))
        elif kind == "exact":
            digits = lexeme.rstrip("lL")
            if len(digits) > 1 and digits[0] == "0":  # Java's octal literal
                if any(c in "89" for c in digits):
                    raise SelectorError(text, pos, "an octal number (digits 0 to 7)", repr(lexeme))
                out.append(_Token("number", lexeme, pos, int(digits, 8)))
            else:
                out.append(_Token("number", lexeme, pos, int(digits)))
        elif kind == "ident":
            upper = lexeme.upper()
            if upper in KEYWORDS:
                out.append(_Token("keyword", upper, pos))
            else:
                out.append(_Token("ident", lexeme, pos, lexeme))
        elif kind == "op":
            out.append(_Token("op", lexeme, pos))
        pos = nxt
    out.append(_Token("end", "", end))
    return out


# -- three-valued logic and comparisons ------------------------------------------------------------


def _number(value: Value) -> int | float | None:
    """``value`` as a number, or None: booleans are not numbers; text from a text-only protocol is
    read as one when it is one."""
    cls = type(value)
    if cls is int or cls is float:
        return value  # type: ignore[no-any-return]
    if cls is Text:
        try:
            return int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return None
            return number if number == number else None  # NaN is no number to compare
    return None


def _compare(op: str, left: Value, right: Value) -> bool | None:
    if left is None or right is None:
        return None
    a, b = _number(left), _number(right)
    if a is not None and b is not None:
        if op == "=":
            return a == b
        if op == "<>":
            return a != b
        if op == "<":
            return a < b
        if op == "<=":
            return a <= b
        if op == ">":
            return a > b
        return a >= b
    # Strings and booleans: only = and <>, and only between like types.
    same = type(left) is bool if type(right) is bool else isinstance(left, str) and isinstance(right, str)
    if same and op == "=":
        return bool(left == right)
    if same and op == "<>":
        return bool(left != right)
    return None


def _arith(op: str, left: Value, right: Value) -> Value:
    a, b = _number(left), _number(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    return a / b


def _condition(value: Value) -> bool | None:
    """A value used as a condition: a boolean field is one, anything else is UNKNOWN."""
    return value if isinstance(value, bool) else None


def like_pattern(pattern: str, escape: str | None) -> re.Pattern[str]:
    """A LIKE pattern as a regular expression matched against the whole value."""
    parts: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if escape is not None and c == escape and i + 1 < len(pattern):
            parts.append(re.escape(pattern[i + 1]))
            i += 2
            continue
        parts.append(".*" if c == "%" else "." if c == "_" else re.escape(c))
        i += 1
    return re.compile("".join(parts), re.DOTALL)


# -- parser: one closure per node -------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.i = 0
        self.nesting = 0
        self.depths: dict[Node, int] = {}  # operators inside each node, leaves not counted
        self.names: set[str] = set()

    def peek(self) -> _Token:
        return self.tokens[self.i]

    def take(self) -> _Token:
        token = self.tokens[self.i]
        if token.kind != "end":
            self.i += 1
        return token

    def fail(self, expected: str, token: _Token | None = None) -> SelectorError:
        token = token if token is not None else self.peek()
        raise SelectorError(self.text, token.pos, expected, token.describe())

    def keyword(self, word: str) -> bool:
        token = self.peek()
        if token.kind == "keyword" and token.text == word:
            self.i += 1
            return True
        return False

    def op(self, *ops: str) -> str | None:
        token = self.peek()
        if token.kind == "op" and token.text in ops:
            self.i += 1
            return token.text
        return None

    def expect_op(self, op: str) -> None:
        if self.op(op) is None:
            self.fail(repr(op))

    def deeper(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            self.fail(f"at most {MAX_NESTING} levels of nesting")

    def make(self, node: Node, *children: Node) -> Node:
        depths = self.depths
        depth = 1 + max([depths.get(child, 0) for child in children])
        if depth > MAX_DEPTH:
            self.fail(f"at most {MAX_DEPTH} operators inside each other")
        depths[node] = depth
        return node

    def need(self, kind: str, want: tuple[str, ...], token: _Token, what: str) -> None:
        if kind != ANY and kind not in want:
            raise SelectorError(self.text, token.pos, what, f"{kind} ({token.describe()})")

    # expression := or
    def expression(self) -> tuple[Node, str]:
        return self.disjunction()

    def disjunction(self) -> tuple[Node, str]:
        start = self.peek()
        node, kind = self.conjunction()
        terms = [node]
        while self.keyword("OR"):
            self.need(kind, (BOOL,), start, "a condition before OR")
            start = self.peek()
            right, kind = self.conjunction()
            self.need(kind, (BOOL,), start, "a condition after OR")
            terms.append(right)
        if len(terms) == 1:
            return node, kind
        return self.make(_any(terms), *terms), BOOL

    def conjunction(self) -> tuple[Node, str]:
        start = self.peek()
        node, kind = self.negation()
        terms = [node]
        while self.keyword("AND"):
            self.need(kind, (BOOL,), start, "a condition before AND")
            start = self.peek()
            right, kind = self.negation()
            self.need(kind, (BOOL,), start, "a condition after AND")
            terms.append(right)
        if len(terms) == 1:
            return node, kind
        return self.make(_all(terms), *terms), BOOL

    def negation(self) -> tuple[Node, str]:
        if self.keyword("NOT"):
            self.deeper()
            start = self.peek()
            inner, kind = self.negation()
            self.nesting -= 1
            self.need(kind, (BOOL,), start, "a condition after NOT")
            return self.make(_not(inner), inner), BOOL
        return self.predicate()

    def predicate(self) -> tuple[Node, str]:
        start = self.peek()
        left, kind = self.sum()
        token = self.peek()
        if token.kind == "op" and token.text in ("=", "<>", "<", "<=", ">", ">="):
            self.i += 1
            rstart = self.peek()
            right, rkind = self.sum()
            if kind != ANY and rkind != ANY and kind != rkind:
                raise SelectorError(
                    self.text, rstart.pos, f"{kind} to compare with", f"{rkind} ({rstart.describe()})"
                )
            if token.text not in ("=", "<>"):
                self.need(kind, (NUM,), start, f"a number before {token.text}")
                self.need(rkind, (NUM,), rstart, f"a number after {token.text}")
            return self.make(_comparison(token.text, left, right), left, right), BOOL
        negated = self.keyword("NOT")
        if self.keyword("BETWEEN"):
            self.need(kind, (NUM,), start, "a number before BETWEEN")
            lstart = self.peek()
            low, lkind = self.sum()
            self.need(lkind, (NUM,), lstart, "a number after BETWEEN")
            if not self.keyword("AND"):
                self.fail("AND in BETWEEN ... AND ...")
            hstart = self.peek()
            high, hkind = self.sum()
            self.need(hkind, (NUM,), hstart, "a number after BETWEEN ... AND")
            node = self.make(_between(left, low, high), left, low, high)
        elif self.keyword("LIKE"):
            self.need(kind, (STR,), start, "a string before LIKE")
            pattern = self.string("a quoted pattern after LIKE")
            escape: str | None = None
            if self.keyword("ESCAPE"):
                etoken = self.peek()
                escape = self.string("a quoted escape character after ESCAPE")
                if len(escape) != 1:
                    raise SelectorError(self.text, etoken.pos, "one escape character", etoken.describe())
            node = self.make(_like(left, like_pattern(pattern, escape)), left)
        elif self.keyword("IN"):
            self.need(kind, (STR,), start, "a string before IN")
            self.expect_op("(")
            values = [self.string("a quoted string in the IN list")]
            while self.op(","):
                values.append(self.string("a quoted string in the IN list"))
            self.expect_op(")")
            node = self.make(_in(left, frozenset(values)), left)
        elif not negated and self.keyword("IS"):
            null_negated = self.keyword("NOT")
            if not self.keyword("NULL"):
                self.fail("NULL after IS" + (" NOT" if null_negated else ""))
            return self.make(_not_null(left) if null_negated else _is_null(left), left), BOOL
        elif negated:
            self.fail("BETWEEN, LIKE or IN after NOT")
        else:
            return left, kind
        return (self.make(_not(node), node) if negated else node), BOOL

    def string(self, expected: str) -> str:
        token = self.peek()
        if token.kind != "string":
            self.fail(expected, token)
        self.i += 1
        return str(token.value)

    def sum(self) -> tuple[Node, str]:
        start = self.peek()
        node, kind = self.product()
        while True:
            op = self.op("+", "-")
            if op is None:
                return node, kind
            self.need(kind, (NUM,), start, f"a number before {op}")
            start = self.peek()
            right, rkind = self.product()
            self.need(rkind, (NUM,), start, f"a number after {op}")
            node, kind = self.make(_arithmetic(op, node, right), node, right), NUM

    def product(self) -> tuple[Node, str]:
        start = self.peek()
        node, kind = self.unary()
        while True:
            op = self.op("*", "/")
            if op is None:
                return node, kind
            self.need(kind, (NUM,), start, f"a number before {op}")
            start = self.peek()
            right, rkind = self.unary()
            self.need(rkind, (NUM,), start, f"a number after {op}")
            node, kind = self.make(_arithmetic(op, node, right), node, right), NUM

    def unary(self) -> tuple[Node, str]:
        op = self.op("+", "-")
        if op is None:
            return self.primary()
        self.deeper()
        start = self.peek()
        if op == "-" and start.kind == "number":  # a negative literal stays a constant
            self.i += 1
            self.nesting -= 1
            value = -start.value
            return (lambda _f: value), NUM
        inner, kind = self.unary()
        self.nesting -= 1
        self.need(kind, (NUM,), start, f"a number after unary {op}")
        return self.make(_negate(inner) if op == "-" else _plus(inner), inner), NUM

    def primary(self) -> tuple[Node, str]:
        token = self.take()
        if token.kind == "number":
            number = token.value
            return (lambda _f: number), NUM
        if token.kind == "string":
            text = token.value
            return (lambda _f: text), STR
        if token.kind == "ident":
            name = token.text
            self.names.add(name)
            return _field(name), ANY
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE"):
            truth = token.text == "TRUE"
            return (lambda _f: truth), BOOL
        if token.kind == "op" and token.text == "(":
            self.deeper()
            node, kind = self.expression()
            self.nesting -= 1
            self.expect_op(")")
            return node, kind
        raise SelectorError(self.text, token.pos, "a field, a literal or '('", token.describe())


def _field(name: str) -> Node:
    def get(fields: Fields) -> Value:
        return fields.get(name)

    return get


def _any(terms: list[Node]) -> Node:
    """OR of ``terms``: TRUE if one is, else UNKNOWN if one is, else FALSE."""

    def node(fields: Fields) -> Value:
        unknown = False
        for term in terms:
            value = term(fields)
            if value is True:
                return True
            if not isinstance(value, bool):
                unknown = True
        return None if unknown else False

    return node


def _all(terms: list[Node]) -> Node:
    """AND of ``terms``: FALSE if one is, else UNKNOWN if one is, else TRUE."""

    def node(fields: Fields) -> Value:
        unknown = False
        for term in terms:
            value = term(fields)
            if value is False:
                return False
            if not isinstance(value, bool):
                unknown = True
        return None if unknown else True

    return node


def _not(a: Node) -> Node:
    def node(fields: Fields) -> Value:
        value = _condition(a(fields))
        return None if value is None else not value

    return node


def _comparison(op: str, a: Node, b: Node) -> Node:
    def node(fields: Fields) -> Value:
        return _compare(op, a(fields), b(fields))

    return node


def _arithmetic(op: str, a: Node, b: Node) -> Node:
    def node(fields: Fields) -> Value:
        return _arith(op, a(fields), b(fields))

    return node


def _negate(a: Node) -> Node:
    def node(fields: Fields) -> Value:
        number = _number(a(fields))
        return None if number is None else -number

    return node


def _plus(a: Node) -> Node:
    def node(fields: Fields) -> Value:
        return _number(a(fields))

    return node


def _between(a: Node, low: Node, high: Node) -> Node:
    def node(fields: Fields) -> Value:
        value = a(fields)
        above = _compare(">=", value, low(fields))
        if above is False:
            return False
        below = _compare("<=", value, high(fields))
        if below is False:
            return False
        return None if above is None or below is None else True

    return node


def _like(a: Node, pattern: re.Pattern[str]) -> Node:
    match = pattern.fullmatch

    def node(fields: Fields) -> Value:
        value = a(fields)
        if not isinstance(value, str):
            return None
        return match(value) is not None

    return node


def _in(a: Node, values: frozenset[str]) -> Node:
    def node(fields: Fields) -> Value:
        value = a(fields)
        if not isinstance(value, str):
            return None
        return value in values

    return node


def _is_null(a: Node) -> Node:
    def node(fields: Fields) -> Value:
        return a(fields) is None

    return node


def _not_null(a: Node) -> Node:
    def node(fields: Fields) -> Value:
        return a(fields) is not None

    return node
