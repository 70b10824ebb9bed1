"""Render the Helm chart in deploy/helm/trimaran without the helm binary (not available here).

Only the part of Go's template language the chart uses: ``{{ .Values.x.y }}``, ``.Release.Name``,
``.Chart.AppVersion``, string literals, ``eq``, ``toYaml`` and ``toJson``, the pipes ``quote``,
``toJson``, ``indent N`` and ``nindent N``, ``if``/``else``/``end``, and ``{{-``/``-}}`` trimming. A
construct outside that subset raises, so the chart cannot drift into something this does not check.

``python -m tests.support.helm`` prints the manifests for the default values (release ``trimaran``):
deploy/kubernetes/trimaran.yaml, checked in for ``kubectl apply`` and compared by tests/test_deploy.py.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "trimaran"
TOKEN = re.compile(r"\{\{(-?)\s*(.*?)\s*(-?)\}\}", re.S)


class TemplateError(Exception):
    pass


def values(overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    base = yaml.safe_load((CHART / "values.yaml").read_text())
    return _merge(base, overrides or {})


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = (
            _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
        )
    return out


def render_chart(overrides: dict[str, Any] | None = None, release: str = "trimaran") -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    scope = {
        "Values": values(overrides),
        "Release": {"Name": release, "Namespace": "default"},
        "Chart": {"Name": chart["name"], "Version": chart["version"], "AppVersion": chart["appVersion"]},
    }
    documents = []
    for template in sorted((CHART / "templates").glob("*.yaml")):
        text = render(template.read_text(), scope).strip("\n")
        if text.strip():
            documents.append(f"# Source: trimaran/templates/{template.name}\n{text}\n")
    return "---\n".join(documents)


def render(text: str, scope: dict[str, Any]) -> str:
    pieces: list[tuple[str, str]] = []  # ("text", s) or ("action", expr)
    position = 0
    for match in TOKEN.finditer(text):
        before = text[position : match.start()]
        if match.group(1):
            before = before.rstrip()
        pieces.append(("text", before))
        pieces.append(("action", match.group(2)))
        position = match.end()
        if match.group(3):
            rest = text[position:]
            position += len(rest) - len(rest.lstrip())
    pieces.append(("text", text[position:]))
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (this branch on, enclosing on)
    for kind, piece in pieces:
        on = all(branch for branch, _ in stack)
        if kind == "text":
            if on:
                out.append(piece)
            continue
        word = piece.split(None, 1)[0] if piece else ""
        if word == "if":
            stack.append((on and _truthy(_evaluate(piece[2:].strip(), scope)) if on else False, on))
        elif word == "else":
            branch, outer = stack.pop()
            stack.append((outer and not branch, outer))
        elif word == "end":
            stack.pop()
        elif on:
            out.append(_show(_evaluate(piece, scope)))
    if stack:
        raise TemplateError("an if without its end")
    return "".join(out)


def _evaluate(expression: str, scope: dict[str, Any]) -> Any:
    stages = [stage.strip() for stage in expression.split("|")]
    value = _call(shlex.split(stages[0], posix=False), scope)
    for stage in stages[1:]:
        value = _call(shlex.split(stage, posix=False), scope, piped=value)
    return value


def _call(words: list[str], scope: dict[str, Any], piped: Any = ...) -> Any:
    name, *args = words
    values = [_term(a, scope) for a in args] + ([] if piped is ... else [piped])
    if name.startswith(".") or name.startswith('"'):
        if values:
            raise TemplateError(f"{name} takes no arguments")
        return _term(name, scope)
    functions = {
        "quote": lambda v: json.dumps(_show(v)),
        "toJson": lambda v: json.dumps(v, separators=(",", ":")),
        "toYaml": lambda v: yaml.safe_dump(v, default_flow_style=False, sort_keys=False).rstrip("\n"),
        "eq": lambda a, b: a == b,
        "not": lambda v: not _truthy(v),
        "indent": lambda n, v: "\n".join(" " * int(n) + line for line in str(v).splitlines()),
        "nindent": lambda n, v: "\n" + "\n".join(" " * int(n) + line for line in str(v).splitlines()),
    }
    if name not in functions:
        raise TemplateError(f"function {name} is not in the chart's subset")
    return functions[name](*values)


def _term(word: str, scope: dict[str, Any]) -> Any:
    if word.startswith('"'):
        return json.loads(word)
    if word.isdigit():
        return int(word)
    if not word.startswith("."):
        raise TemplateError(f"cannot read {word!r}")
    value: Any = scope
    for part in word[1:].split("."):
        if not isinstance(value, dict) or part not in value:
            raise TemplateError(f"{word} is not defined")
        value = value[part]
    return value


def _truthy(value: Any) -> bool:
    return bool(value)


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


if __name__ == "__main__":
    sys.stdout.write(
        "# Kubernetes manifests rendered from deploy/helm/trimaran with its default values (release\n"
        "# 'trimaran'): a StatefulSet on SQLite. Regenerate: python -m tests.support.helm\n" + render_chart()
    )
