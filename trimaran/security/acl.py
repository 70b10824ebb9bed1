"""Permission rules: Mosquitto's ``acl_file`` syntax, one rule set for every protocol.

::

    # before any 'user' line: rules for anonymous clients
    topic read public/#
    user alice
    topic readwrite alice/#
    topic read,configure $queue/alice-jobs
    topic deny $queue/payroll
    pattern readwrite clients/%c/#
    pattern read,write $queue/%u-inbox

- ``topic [ACCESS] FILTER`` applies to the user named by the last ``user NAME`` line (to anonymous
  clients before the first one); ``pattern [ACCESS] FILTER`` applies to every client, with ``%u``
  replaced by its user name and ``%c`` by its client id (a pattern naming ``%u`` never matches an
  anonymous client, nor one whose name or id holds ``/``, ``+`` or ``#``).
- ACCESS is ``read``, ``write``, ``readwrite`` (the default), ``configure``, ``all``, or a comma list of
  them; ``deny`` refuses everything the filter covers.
- A client's rules are its section's ``topic`` lines and every ``pattern`` line, in file order. The
  first rule that matches the topic and names the access (or ``deny``) decides; none: denied.
- Wildcards at the first level never match ``$`` topics: queues (``$queue/<name>``) and ``$SYS`` need
  rules of their own.

Queues are named by their ``$queue/<name>`` topic: read = consume, settle and peek; write = publish;
configure = declare, bind, purge, delete.

A subscription to a topic filter is granted, as Mosquitto grants it, when some topic it can match may
be read (:func:`decide_some`); each delivery is then checked against the reader's rules
(:func:`decide` on the delivered topic). A filter every topic of which may be read (:func:`decide` on
the filter: it lies inside an allowing rule and touches no earlier deny) needs no check per delivery.
Mosquitto 2.0 grants every SUBSCRIBE and only filters deliveries; here a filter no topic of which may
be read is refused (SUBACK 0x80/0x87), as the paho interop suite's ``test_subscribe_failure`` expects.
Trimaran before this refused any filter not wholly readable (``#`` beside a ``deny test/x``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

Access = Literal["read", "write", "configure"]
READ: Final = "read"
WRITE: Final = "write"
CONFIGURE: Final = "configure"
_KEYWORDS: Final[dict[str, frozenset[str]]] = {
    "read": frozenset({READ}),
    "write": frozenset({WRITE}),
    "readwrite": frozenset({READ, WRITE}),
    "configure": frozenset({CONFIGURE}),
    "all": frozenset({READ, WRITE, CONFIGURE}),
}
_UNSAFE: Final = frozenset("/+#")


class AclError(ValueError):
    """A rule file that cannot be used; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class Rule:
    filter: str
    access: frozenset[str]  # empty: deny
    pattern: bool  # %u / %c substituted per client
    line: int

    @property
    def deny(self) -> bool:
        return not self.access


@dataclass(frozen=True, slots=True)
class RuleSet:
    """A parsed rule file: ``anonymous`` rules, rules per user, and the patterns (with their line
    numbers, so a client's rules can be merged in file order)."""

    anonymous: tuple[Rule, ...]
    users: dict[str, tuple[Rule, ...]]
    patterns: tuple[Rule, ...]
    source: str = ""

    def rules_for(self, user: str | None, client_id: str) -> list[Rule]:
        """The rules that apply to one client, in file order, patterns substituted."""
        own = self.anonymous if user is None else self.users.get(user, ())
        merged: list[Rule] = list(own)
        for rule in self.patterns:
            text = rule.filter
            if "%u" in text:
                if user is None or _UNSAFE & set(user) or not user:
                    continue
                text = text.replace("%u", user)
            if "%c" in text:
                if not client_id or _UNSAFE & set(client_id):
                    continue
                text = text.replace("%c", client_id)
            merged.append(Rule(text, rule.access, True, rule.line))
        merged.sort(key=lambda r: r.line)
        return merged


def parse(text: str, source: str = "<rules>") -> RuleSet:
    anonymous: list[Rule] = []
    users: dict[str, list[Rule]] = {}
    patterns: list[Rule] = []
    current: list[Rule] = anonymous
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        rest = rest.strip()
        if word == "user":
            if not rest:
                raise AclError(f"{source}:{number}: 'user' needs a name")
            current = users.setdefault(rest, [])
            continue
        if word not in ("topic", "pattern"):
            raise AclError(f"{source}:{number}: expected 'user', 'topic' or 'pattern', got {word!r}")
        access, topic_filter = _access_and_filter(rest, source, number)
        rule = Rule(topic_filter, access, word == "pattern", number)
        (patterns if word == "pattern" else current).append(rule)
    return RuleSet(tuple(anonymous), {u: tuple(r) for u, r in users.items()}, tuple(patterns), source)


def _access_and_filter(rest: str, source: str, number: int) -> tuple[frozenset[str], str]:
    first, _, remainder = rest.partition(" ")
    words = first.split(",")
    if all(w in _KEYWORDS or w == "deny" for w in words) and remainder.strip():
        if "deny" in words:
            if len(words) > 1:
                raise AclError(f"{source}:{number}: 'deny' cannot be combined with other access")
            access: frozenset[str] = frozenset()
        else:
            access = frozenset().union(*(_KEYWORDS[w] for w in words))
        topic_filter = remainder.strip()
    else:
        access, topic_filter = _KEYWORDS["readwrite"], rest
    if not topic_filter or " " in topic_filter:
        raise AclError(f"{source}:{number}: expected '[ACCESS] FILTER', got {rest!r}")
    _check_filter(topic_filter, source, number)
    return access, topic_filter


def _check_filter(topic_filter: str, source: str, number: int) -> None:
    levels = topic_filter.split("/")
    for index, level in enumerate(levels):
        if "#" in level and (level != "#" or index != len(levels) - 1):
            raise AclError(f"{source}:{number}: '#' must be a whole last level in {topic_filter!r}")
        if "+" in level and level != "+":
            raise AclError(f"{source}:{number}: '+' must be a whole level in {topic_filter!r}")


def load(path: Path) -> RuleSet:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AclError(f"cannot read rule file {path}: {exc.strerror}") from None
    return parse(text, str(path))


# -- matching -------------------------------------------------------------------------------------


def _dollar(level: str) -> bool:
    return level.startswith("$")


def covers(rule: str, topic_filter: str) -> bool:
    """Every topic ``topic_filter`` matches is matched by ``rule`` (a plain topic is a filter that
    matches itself). First-level wildcards of ``rule`` never cover ``$`` topics."""
    r, f = rule.split("/"), topic_filter.split("/")
    for i, level in enumerate(r):
        if level == "#":
            return not (i == 0 and i < len(f) and _dollar(f[0]))
        if i >= len(f):
            return False
        got = f[i]
        if got == "#":
            return False
        if level == "+":
            if i == 0 and _dollar(got):
                return False
            continue
        if level != got:
            return False
    return len(f) == len(r)


def overlaps(rule: str, topic_filter: str) -> bool:
    """Some topic is matched by both filters."""
    r, f = rule.split("/"), topic_filter.split("/")
    for i in range(max(len(r), len(f))):
        a = r[i] if i < len(r) else None
        b = f[i] if i < len(f) else None
        if a == "#" or b == "#":
            other = b if a == "#" else a
            # '#' at the first level matches no '$' topic.
            return not (i == 0 and other is not None and other not in ("+", "#") and _dollar(other))
        if a is None or b is None:
            return False
        if a == "+" or b == "+":
            other = b if a == "+" else a
            if i == 0 and _dollar(other):
                return False
            continue
        if a != b:
            return False
    return True


def decide(rules: list[Rule], access: str, topic_filter: str) -> bool:
    """First match wins: the first rule that names ``access`` (or denies) and touches the filter.
    An allowing rule must cover the whole filter; a deny refuses as soon as it overlaps it."""
    for rule in rules:
        if rule.deny:
            if overlaps(rule.filter, topic_filter):
                return False
            continue
        if access not in rule.access:
            continue
        if covers(rule.filter, topic_filter):
            return True
        if overlaps(rule.filter, topic_filter):
            # Partly allowed: the rest may be allowed by a later rule only if nothing denies it;
            # a subscription must be wholly allowed, so a partial match is not enough.
            continue
    return False


def intersection(a: str, b: str) -> str | None:
    """The filter matching exactly the topics both filters match; None when they share none (the
    ``$`` rule included: a first-level wildcard of one never meets a ``$`` level of the other)."""
    x, y = a.split("/"), b.split("/")
    out: list[str] = []
    for i in range(max(len(x), len(y))):
        p = x[i] if i < len(x) else None
        q = y[i] if i < len(y) else None
        if p == "#" or q == "#":
            rest = y[i:] if p == "#" else x[i:]  # '#' takes what the other still has ('a/#' meets 'a')
            if i == 0 and rest and rest[0] not in ("+", "#") and _dollar(rest[0]):
                return None
            return "/".join(out + (rest or [])) if rest or out else None
        if p is None or q is None:
            return None
        if p == "+" or q == "+":
            other = q if p == "+" else p
            if i == 0 and _dollar(other):
                return None
            out.append(other)
            continue
        if p != q:
            return None
        out.append(p)
    return "/".join(out)


def decide_some(rules: list[Rule], access: str, topic_filter: str) -> bool:
    """Some topic ``topic_filter`` matches is allowed ``access``: an allowing rule meets the filter
    where no earlier deny covers the meeting (a meeting that several denies cover together counts as
    allowed here; each delivery is still decided on its own topic)."""
    for index, rule in enumerate(rules):
        if rule.deny or access not in rule.access:
            continue
        meeting = intersection(rule.filter, topic_filter)
        if meeting is None:
            continue
        if not any(earlier.deny and covers(earlier.filter, meeting) for earlier in rules[:index]):
            return True
    return False
