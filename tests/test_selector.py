"""JMS message selectors (trimaran/selector.py): the JMS 2.0 examples, SQL's three values, the parse
errors, and hypothesis: a random expression printed and parsed again evaluates as a reference
interpreter says, and random or cut text raises only ``SelectorError``."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimaran.selector import MAX_NESTING, SelectorError, Text, compile_selector


def selects(text: str, **fields: Any) -> bool:
    return compile_selector(text)(fields)


# -- the spec's examples -----------------------------------------------------------------------------


def test_spec_examples() -> None:
    assert selects(
        "JMSType = 'car' AND color = 'blue' AND weight > 2500", JMSType="car", color="blue", weight=3000
    )
    assert not selects(
        "JMSType = 'car' AND color = 'blue' AND weight > 2500", JMSType="car", color="blue", weight=2
    )
    assert selects("age BETWEEN 15 AND 19", age=15)
    assert selects("age NOT BETWEEN 15 AND 19", age=20)
    assert selects("Country IN (' UK', 'US', 'France')", Country="US")
    assert not selects("Country NOT IN (' UK', 'US', 'France')", Country="US")
    assert selects("phone LIKE '12%3'", phone="123") and selects("phone LIKE '12%3'", phone="12993")
    assert not selects("phone LIKE '12%3'", phone="1234")
    assert selects("word LIKE 'l_se'", word="lose") and not selects("word LIKE 'l_se'", word="loose")
    assert selects("underscored LIKE '\\_%' ESCAPE '\\'", underscored="_foo")
    assert not selects("underscored LIKE '\\_%' ESCAPE '\\'", underscored="bar")
    assert selects("prop_name IS NULL") and not selects("prop_name IS NULL", prop_name=1)
    assert selects("prop_name IS NOT NULL", prop_name="x")


def test_literals() -> None:
    assert selects("a = 57 AND b = -957 AND c = +62", a=57, b=-957, c=62)
    assert selects("a = 0x1F AND b = 017 AND c = 10L", a=31, b=15, c=10)
    assert selects(
        "a = 7E3 AND b = -57.9E2 AND c = 7. AND d = .5 AND e = 1.5f", a=7000, b=-5790, c=7, d=0.5, e=1.5
    )
    assert selects("s = 'it''s'", s="it's")
    assert selects("flag = TRUE AND other = false", flag=True, other=False)
    assert selects("flag", flag=True) and not selects("flag", flag=False) and not selects("flag", flag=1)
    assert selects("a = 3 / 2", a=1.5)  # divides as a floating-point number, as ActiveMQ does


def test_three_valued_logic() -> None:
    # a missing field is NULL: a comparison with it is UNKNOWN, and NOT UNKNOWN is UNKNOWN
    assert not selects("missing > 1") and not selects("NOT (missing > 1)")
    assert selects("missing > 1 OR TRUE") and not selects("missing > 1 AND TRUE")
    assert not selects("missing > 1 OR FALSE") and not selects("NOT (missing > 1 OR FALSE)")
    assert selects("NOT (missing > 1 AND FALSE)")
    assert not selects("missing NOT IN ('a')") and not selects("missing NOT LIKE 'a'")
    assert selects("x NOT BETWEEN 1 AND missing", x=0)  # x < 1: FALSE BETWEEN whatever the bound
    assert not selects("a / 0 = 1 OR a / 0 <> 1", a=1)  # a division by zero is UNKNOWN


def test_types() -> None:
    assert not selects("a = 1", a="1") and not selects("a <> 1", a="1")  # unlike types: UNKNOWN
    assert not selects("a < b", a="a", b="b")  # strings compare only by = and <>
    with pytest.raises(SelectorError, match="a number after <"):
        compile_selector("a < 'b'")  # ... which a literal shows before any message
    assert not selects("a = 1", a=True)  # a boolean is no number
    assert selects("a = 1 AND b > 10.5", a=Text("1"), b=Text("12"))  # text-only protocols
    assert not selects("a = 1", a=Text("one")) and not selects("a > 0", a=Text("nan"))
    assert selects("a = 'x'", a=Text("x")) and selects("a LIKE 'x%'", a=Text("xy"))
    assert selects("a + 1 = 3 AND a * a = 4 AND -a = -2", a=2)


@pytest.mark.parametrize(
    ("text", "column", "expected"),
    [
        ("colour = ", 10, "a field, a literal or '('"),
        ("a = 'x", 5, "a closing quote"),
        ("1 + 2", 1, "a condition"),
        ("a LIKE 3", 8, "a quoted pattern after LIKE"),
        ("a >< 2", 4, "a field, a literal or '('"),
        ("09 = a", 1, "an octal number"),
        ("a IS NOT 3", 10, "NULL after IS NOT"),
        ("a = 1 b = 2", 7, "an operator or the end"),
        ("'a' + 1 = 2", 1, "a number before +"),
        ("a = 1 AND 2", 11, "a condition after AND"),
        ("a = 'x' ESCAPE", 9, "an operator or the end"),
        ("a LIKE 'x' ESCAPE 'ab'", 19, "one escape character"),
        ("a BETWEEN 1 OR 2", 13, "AND in BETWEEN"),
        ("a IN ()", 7, "a quoted string in the IN list"),
        ("a IN ('x' 'y')", 11, "')'"),
        ("a NOT = 1", 7, "BETWEEN, LIKE or IN after NOT"),
        ("TRUE = 1", 8, "a condition to compare with"),
        ("a # 1", 3, "a field, a literal, an operator or a parenthesis"),
        ("12abc = 1", 3, "an operator after a number"),
        ("", 1, "a field, a literal or '('"),
    ],
)
def test_errors_say_where(text: str, column: int, expected: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    assert caught.value.position == column - 1
    assert expected in caught.value.expected
    assert f"column {column}:" in str(caught.value)


def test_limits() -> None:
    deep = "(" * (MAX_NESTING + 1) + "a" + ")" * (MAX_NESTING + 1)
    with pytest.raises(SelectorError, match="levels of nesting"):
        compile_selector(deep)
    assert selects("(" * MAX_NESTING + "a = 1" + ")" * MAX_NESTING, a=1)
    long_and = " AND ".join(f"a{i} = {i}" for i in range(2000))  # flat: no recursion per term
    assert compile_selector(long_and)({f"a{i}": i for i in range(2000)})
    with pytest.raises(SelectorError, match="operators inside each other"):
        compile_selector(" + ".join(["a"] * 500) + " = 1")


def test_names_and_case() -> None:
    selector = compile_selector("Colour = 'red' and NOT (size between 1 AND 2) Or x is null")
    assert selector.names == {"Colour", "size", "x"}
    assert selector({"Colour": "red", "size": 3})
    assert not selector({"colour": "red", "size": 3, "x": 1})  # identifiers are case-sensitive


# -- hypothesis: printed and parsed again, against a reference interpreter --------------------------

NAMES = ["a", "b", "c", "JMSPriority", "x_1", "$d"]
fields_st = st.dictionaries(
    st.sampled_from(NAMES),
    st.one_of(
        st.integers(-5, 5),
        st.floats(-5, 5, allow_nan=False),
        st.sampled_from(["", "a", "ab", "x_y", "%", "red"]),
        st.booleans(),
        st.builds(Text, st.sampled_from(["1", "2.5", "x", "-3"])),
    ),
)

num_leaf = st.one_of(
    st.tuples(st.just("int"), st.integers(0, 99)),
    st.tuples(st.just("float"), st.sampled_from([0.5, 1.0, 2.25, 10.0])),
    st.tuples(st.just("field"), st.sampled_from(NAMES)),
)
str_leaf = st.one_of(
    st.tuples(st.just("str"), st.sampled_from(["", "a", "it's", "red", "x_y"])),
    st.tuples(st.just("field"), st.sampled_from(NAMES)),
)
nums = st.recursive(
    num_leaf,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["+", "-", "*", "/"]), inner, inner),
        st.tuples(st.just("neg"), inner),
    ),
    max_leaves=4,
)
comparisons = st.one_of(
    st.tuples(st.just("cmp"), st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), nums, nums),
    st.tuples(st.just("cmp"), st.sampled_from(["=", "<>"]), str_leaf, str_leaf),
    st.tuples(st.just("between"), st.booleans(), nums, nums, nums),
    st.tuples(st.just("like"), st.booleans(), str_leaf, st.sampled_from(["a%", "%", "_", "x!_y", "!%%"])),
    st.tuples(
        st.just("in"), st.booleans(), str_leaf, st.lists(st.sampled_from(["a", "red", ""]), min_size=1)
    ),
    st.tuples(st.just("null"), st.booleans(), st.sampled_from(NAMES)),
    st.tuples(st.just("bool"), st.booleans()),
)
conditions = st.recursive(
    comparisons,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["AND", "OR"]), inner, inner),
        st.tuples(st.just("NOT"), inner),
    ),
    max_leaves=6,
)


def render(node: Any, draw_case: bool) -> str:
    def kw(word: str) -> str:
        return word.lower() if draw_case else word  # keywords: any case

    tag = node[0]
    if tag == "int":
        return str(node[1])
    if tag == "float":
        return repr(node[1])
    if tag == "field":
        return str(node[1])
    if tag == "str":
        return "'" + str(node[1]).replace("'", "''") + "'"
    if tag in ("+", "-", "*", "/"):
        return f"({render(node[1], draw_case)} {tag} {render(node[2], draw_case)})"
    if tag == "neg":
        return f"-({render(node[1], draw_case)})"
    if tag == "cmp":
        return f"({render(node[2], draw_case)} {node[1]} {render(node[3], draw_case)})"
    not_ = kw("NOT ") if tag in ("between", "like", "in", "null") and node[1] else ""
    if tag == "between":
        low, high = render(node[3], draw_case), render(node[4], draw_case)
        return f"({render(node[2], draw_case)} {not_}{kw('BETWEEN')} {low} {kw('AND')} {high})"
    if tag == "like":
        return f"({render(node[2], draw_case)} {not_}{kw('LIKE')} '{node[3]}' {kw('ESCAPE')} '!')"
    if tag == "in":
        values = ", ".join(f"'{v}'" for v in node[3])
        return f"({render(node[2], draw_case)} {not_}{kw('IN')} ({values}))"
    if tag == "null":
        return f"({node[2]} {kw('IS')} {not_}{kw('NULL')})"
    if tag == "bool":
        return kw("TRUE") if node[1] else kw("FALSE")
    if tag in ("AND", "OR"):
        return f"({render(node[1], draw_case)} {kw(tag)} {render(node[2], draw_case)})"
    return f"({kw('NOT')} {render(node[1], draw_case)})"


def ref_number(value: Any) -> Any:
    if type(value) in (int, float):
        return value
    if isinstance(value, Text):
        try:
            number = float(value)
        except ValueError:
            return None
        return None if math.isnan(number) else number
    return None


def ref(node: Any, f: dict[str, Any]) -> Any:
    """The reference: SQL's three values with None for UNKNOWN, written plainly."""
    tag = node[0]
    if tag in ("int", "float", "str"):
        return node[1]
    if tag == "field":
        return f.get(node[1])
    if tag in ("+", "-", "*", "/"):
        a, b = ref_number(ref(node[1], f)), ref_number(ref(node[2], f))
        if a is None or b is None or (tag == "/" and b == 0):
            return None
        return {"+": a + b, "-": a - b, "*": a * b}[tag] if tag != "/" else a / b
    if tag == "neg":
        a = ref_number(ref(node[1], f))
        return None if a is None else -a
    if tag == "cmp":
        return ref_compare(node[1], ref(node[2], f), ref(node[3], f))
    if tag == "between":
        v = ref(node[2], f)
        result = ref_and(ref_compare(">=", v, ref(node[3], f)), ref_compare("<=", v, ref(node[4], f)))
        return ref_not(result) if node[1] else result
    if tag == "like":
        v = ref(node[2], f)
        if not isinstance(v, str):
            return None
        pattern = "".join(
            re.escape(p[1]) if p.startswith("!") else ".*" if p == "%" else "." if p == "_" else re.escape(p)
            for p in re.findall(r"!.|.", node[3], re.DOTALL)
        )
        result = re.fullmatch(pattern, v, re.DOTALL) is not None
        return not result if node[1] else result
    if tag == "in":
        v = ref(node[2], f)
        if not isinstance(v, str):
            return None
        return (v not in node[3]) if node[1] else (v in node[3])
    if tag == "null":
        return (f.get(node[2]) is not None) if node[1] else (f.get(node[2]) is None)
    if tag == "bool":
        return node[1]
    if tag == "AND":
        return ref_and(ref_bool(ref(node[1], f)), ref_bool(ref(node[2], f)))
    if tag == "OR":
        return ref_not(ref_and(ref_not(ref_bool(ref(node[1], f))), ref_not(ref_bool(ref(node[2], f)))))
    return ref_not(ref_bool(ref(node[1], f)))


def ref_bool(v: Any) -> Any:
    return v if isinstance(v, bool) else None


def ref_not(v: Any) -> Any:
    return None if v is None else not v


def ref_and(a: Any, b: Any) -> Any:
    if a is False or b is False:
        return False
    return None if a is None or b is None else True


def ref_compare(op: str, a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    na, nb = ref_number(a), ref_number(b)
    if na is not None and nb is not None:
        return {"=": na == nb, "<>": na != nb, "<": na < nb, "<=": na <= nb, ">": na > nb, ">=": na >= nb}[op]
    like = (type(a) is bool and type(b) is bool) or (isinstance(a, str) and isinstance(b, str))
    if like and op in ("=", "<>"):
        return (a == b) == (op == "=")
    return None


@settings(max_examples=400, deadline=None)
@given(conditions, st.booleans(), st.lists(fields_st, min_size=1, max_size=4))
def test_printed_and_parsed_again(node: Any, lower: bool, messages: list[dict[str, Any]]) -> None:
    selector = compile_selector(render(node, lower))
    for fields in messages:
        assert selector(fields) is (ref(node, fields) is True), fields


SELECTOR_ALPHABET = st.sampled_from(
    [*"abcxyzJMS_$019.eEfLx'%()=<>+-*/, \t\n!", "AND", "OR", "NOT", "LIKE", "IN", "IS", "NULL", "BETWEEN"]
)


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.lists(SELECTOR_ALPHABET, max_size=30).map(" ".join),
        st.lists(SELECTOR_ALPHABET, max_size=30).map("".join),
    ),
    fields_st,
)
def test_random_text_raises_only_selector_error(text: str, fields: dict[str, Any]) -> None:
    try:
        selector = compile_selector(text)
    except SelectorError as exc:
        assert 0 <= exc.position <= len(text)
        return
    assert selector(fields) in (True, False)


@settings(max_examples=200, deadline=None)
@given(conditions, st.data())
def test_cut_selectors(node: Any, data: st.DataObject) -> None:
    text = render(node, False)
    cut = data.draw(st.integers(0, len(text)))
    try:
        compile_selector(text[:cut])
    except SelectorError as exc:
        assert 0 <= exc.position <= cut
