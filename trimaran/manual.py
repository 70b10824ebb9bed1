"""The manual's generated pages: the configuration from the settings model, the admin API from its
OpenAPI document, and the changelog as written.

The pages are committed under ``docs/`` so that a reader of the repository finds them;
:func:`generated_pages` makes them from the code they describe, ``scripts/manual_pages.py`` (``make
manual``) writes them, and both ``tests/test_manual.py`` and the MkDocs hook
(``scripts/mkdocs_hooks.py``) fail while a committed page differs from what the code makes.
:func:`undescribed_keys` is what ``tests/test_manual.py`` holds at zero: a setting without a
description fails the tests.
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, cast, get_args, get_origin

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from trimaran.config import Endpoint, HttpSettings, Settings
from trimaran.config_example import repeated_section, section_type, toml_value

ENV_PREFIX = "TRIMARAN_"


# -- configuration ------------------------------------------------------------------------------------


class Key(typing.NamedTuple):
    path: tuple[str, ...]  # ("limits", "max_connections"); a repeated table's item keys end in "[]"
    info: FieldInfo
    default: Any
    env: str | None  # None for a key inside a repeated table: the whole table is one variable


def settings_keys(model: type[BaseModel] = Settings, path: tuple[str, ...] = ()) -> Iterator[Key]:
    """Every key of the settings model, sections depth first, in declaration order."""
    for name, info in model.model_fields.items():
        if section_type(info.annotation) is not None:
            continue
        in_table = bool(path) and path[-1].endswith("[]")
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        env = None if in_table else ENV_PREFIX + "__".join((*path, name)).upper()
        yield Key((*path, name), info, default, env)
        item = repeated_section(info.annotation)
        if item is not None:
            yield from settings_keys(item, (*path, name + "[]"))
    for name, info in model.model_fields.items():
        section = section_type(info.annotation)
        if section is not None:
            yield from settings_keys(section, (*path, name))


def undescribed_keys() -> list[str]:
    return [".".join(key.path) for key in settings_keys() if not key.info.description]


def configuration_page() -> str:
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from trimaran/config.py by trimaran/manual.py: edit the settings model, "
        "not this page. -->",
        "",
        "One settings model (`trimaran/config.py`) holds every setting. Precedence, lowest first:",
        "",
        "1. the defaults below;",
        "2. a TOML file: `--config FILE`, or `./trimaran.toml` when present;",
        "3. environment variables: `TRIMARAN_` prefix, `__` between nested keys "
        "(`TRIMARAN_STORAGE__URL=postgresql://trimaran@db/trimaran`, `TRIMARAN_LIMITS__MAXIMUM_QOS=1`); "
        "a list or a table is given as JSON (`TRIMARAN_HTTP__TOKENS='[\"s3cret\"]'`);",
        "4. command-line flags (`trimaran serve --mqtt 1884 --http off`).",
        "",
        "`trimaran config example` writes a `trimaran.toml` with every key, its default and its meaning "
        "(`deploy/trimaran.toml` is that output); `trimaran config show` prints the effective settings "
        "as JSON, secrets masked.",
        "",
        "A bad setting stops the start with exit status 2 and a line per problem naming the key "
        "(`trimaran: invalid setting limits.maximum_qos: Input should be less than or equal to 2`). "
        'Unknown keys are errors too, with a "did you mean", so a typo never passes silently.',
        "",
        "```toml",
        "# trimaran.toml",
        "[listeners]",
        'mqtt = "0.0.0.0:1883"',
        'mqtt_tls = "8883"',
        "[listeners.tls]",
        'cert_file = "server.crt"',
        'key_file = "server.key"',
        "",
        "[storage]",
        'url = "postgresql://trimaran@localhost/trimaran"   # default: a SQLite file in data_dir',
        "",
        "[auth]",
        'password_file = "/etc/trimaran/passwords"',
        'acl_file = "/etc/trimaran/acl"',
        "```",
        "",
        "Addresses (`listeners.*`, `http.bind`) take `[HOST:]PORT` or `off`; port 0 picks a free port.",
    ]
    for title, anchor, doc, keys in _config_sections():
        lines += ["", f"## {title} {{#{anchor}}}", ""]
        if doc:
            lines += [doc, ""]
        lines += [
            "| key | type | default | environment variable | description |",
            "|---|---|---|---|---|",
        ]
        for key in keys:
            name = ".".join(key.path).replace("[]", "[n]")
            env = f"`{key.env}`" if key.env else "(in the table's JSON)"
            row = [f"`{name}`", _type_text(key.info), _default_text(key), env, key.info.description or ""]
            lines.append("| " + " | ".join(_cell(cell) for cell in row) + " |")
    return "\n".join(lines) + "\n"


def _config_sections() -> list[tuple[str, str, str, list[Key]]]:
    """The keys grouped under their section, a repeated table's items under a heading of their own."""
    sections: dict[tuple[str, ...], list[Key]] = {}
    for key in settings_keys():
        sections.setdefault(key.path[:-1], []).append(key)
    out = []
    for path, keys in sections.items():
        if not path:
            out.append(("Top level", "top-level", "", keys))
            continue
        model = _model_at(path)
        doc = (model.__doc__ or "").strip().splitlines() if model.__doc__ != BaseModel.__doc__ else []
        if path[-1].endswith("[]"):
            table = ".".join(path)[:-2]
            title = f"`[[{table}]]`"
            first = "A table repeated once per entry; as an environment variable, the whole list as JSON."
        else:
            title = f"`[{'.'.join(path)}]`"
            first = doc[0].replace("``", "`") if doc else ""
        out.append((title, "-".join(path).replace("[]", "").replace("_", "-"), first, keys))
    return out


def _model_at(path: tuple[str, ...]) -> type[BaseModel]:
    model: type[BaseModel] = Settings
    for part in path:
        annotation = model.model_fields[part.removesuffix("[]")].annotation
        found = section_type(annotation) or repeated_section(annotation)
        assert found is not None, part
        model = found
    return model


def _type_text(info: FieldInfo) -> str:
    text = _annotation_text(info.annotation)
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            bound = getattr(meta, attr, None)
            if bound is not None and not isinstance(meta, annotated_types.Len):
                text += f", {sign} {bound:,}" if isinstance(bound, int) else f", {sign} {bound}"
        if isinstance(meta, annotated_types.MinLen) and meta.min_length:
            text += f", at least {meta.min_length}"
    return text


def _annotation_text(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin is typing.Annotated:
        inner = get_args(annotation)[0]
        if Endpoint in _members(inner):
            return "address or `off`"
        return _annotation_text(inner)
    if origin in (typing.Union, types.UnionType):
        if Endpoint in get_args(annotation):
            return "address or `off`"
        members = [m for m in get_args(annotation) if m is not type(None)]
        text = " or ".join(_annotation_text(m) for m in members)
        return text + (", optional" if len(members) < len(get_args(annotation)) else "")
    if origin is Literal:
        return " or ".join(f"`{json.dumps(v)}`" for v in get_args(annotation))
    if origin is list:
        (item,) = get_args(annotation)
        return f"list of {_annotation_text(item)}" if section_type(item) is None else "table, repeated"
    if origin is dict:
        value = get_args(annotation)[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            # A table of tables, one per name: each with the model's keys (limits.vhosts.t1).
            fields = ", ".join(f"`{name}`" for name in value.model_fields)
            return f"table of tables, one per name, each with {fields}"
        return f"table of {_plural(_annotation_text(value))}"
    names: dict[Any, str] = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        Path: "path",
        SecretStr: "secret string",
    }
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _plural(text: str) -> str:
    return {"string": "strings", "integer": "integers", "number": "numbers", "boolean": "booleans"}.get(
        text, text
    )


def _members(annotation: Any) -> list[Any]:
    if get_origin(annotation) in (typing.Union, types.UnionType):
        return list(get_args(annotation))
    return [annotation]


def _default_text(key: Key) -> str:
    if key.info.is_required():
        return "required"
    rendered = toml_value(key.default)
    if rendered is None:
        return "`off`" if Endpoint in _members(_unwrap(key.info.annotation)) else "unset"
    if isinstance(key.default, (int, float)) and not isinstance(key.default, bool) and key.default >= 10_000:
        rendered = f"{key.default:,}".replace(",", "_")  # TOML's digit separator keeps it valid
    return f"`{rendered}`"


def _unwrap(annotation: Any) -> Any:
    return get_args(annotation)[0] if get_origin(annotation) is typing.Annotated else annotation


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- the admin API ------------------------------------------------------------------------------------


def openapi() -> dict[str, Any]:
    """The document ``GET /api/v1/openapi.json`` serves, built from the same route table."""
    from trimaran.admin.api import AdminApi, openapi_document
    from trimaran.admin.telemetry import Telemetry
    from trimaran.admin.view import AdminView

    # The route table only names its handlers; none is called, so no server is needed behind it.
    api = AdminApi(cast(AdminView, None), HttpSettings(), cast(Telemetry, None))
    return openapi_document(api.routes)


def admin_api_page(document: dict[str, Any]) -> str:
    lines = [
        "# Admin API",
        "",
        "<!-- Generated from the server's OpenAPI document by trimaran/manual.py: edit the route table "
        "in trimaran/admin/api.py, not this page. -->",
        "",
        "The HTTP listener (`--http`, default `127.0.0.1:8080`) serves `/healthz`, `/readyz` and "
        "`/metrics` to anyone, and a JSON API under `/api/v1` to holders of a bearer token from "
        "`http.tokens` (`TRIMARAN_HTTP__TOKENS='[\"s3cret\"]'`). With no token configured the API is "
        "locked: every call gets 401 and the server says so once in its log. Errors are "
        '`{"error": {"code": ..., "message": ...}}`; bodies are bounded by `http.max_body_bytes` (413) '
        "and requests by `http.request_timeout_s`.",
        "",
        'Lists take `limit` (1-1000, default 100) and `cursor`, and answer `{"items", "next_cursor", '
        '"next"}`. Names with a `/` (a dead-letter queue, a client id) are percent-encoded in paths: '
        "`/api/v1/queues/%24dlq%2Forders`. A queue, session or client is named as its clients name it, "
        "with `?vhost=` for its vhost (default `/`: `/api/v1/queues/orders?vhost=t1`); the lists show "
        "every vhost, with a `vhost` field beside each name, or one with `?vhost=`. "
        "A running server serves this document at "
        "`/api/v1/openapi.json`; this page is made from the same route table "
        f"([the document itself](openapi.json), OpenAPI {document['openapi']}).",
        "",
        "```sh",
        'curl -H "Authorization: Bearer s3cret" localhost:8080/api/v1/queues?limit=10',
        'curl -H "Authorization: Bearer s3cret" -X POST localhost:8080/api/v1/queues \\',
        '     -d \'{"name": "orders", "max_attempts": 3, "ttl_s": 3600}\'',
        'curl -H "Authorization: Bearer s3cret" -X POST localhost:8080/api/v1/publish \\',
        '     -d \'{"topic": "$queue/orders", "payload": "aGVsbG8=", "encoding": "base64", "qos": 1}\'',
        'curl -H "Authorization: Bearer s3cret" -X POST localhost:8080/api/v1/queues/orders/redrive '
        "-d '{\"limit\": 100}'",
        "curl localhost:8080/metrics",
        "```",
        "",
        "The command line drives the same API: see [Getting started](getting-started.md#commands).",
        "",
        "## Routes",
    ]
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            lines += ["", f"### `{method.upper()} {path}`", "", op["summary"] + ".", ""]
            if op.get("security") == []:
                lines += ["No token needed.", ""]
            params = op.get("parameters", [])
            if params:
                lines += ["| parameter | in | type | description |", "|---|---|---|---|"]
                for param in params:
                    row = [f"`{param['name']}`", param["in"], _schema_text(param["schema"])]
                    lines.append(
                        "| " + " | ".join(_cell(c) for c in [*row, param.get("description", "")]) + " |"
                    )
                lines.append("")
            body = op.get("requestBody")
            if body is not None:
                schema = body["content"]["application/json"]["schema"]
                lines += [f"Body: {_schema_text(schema)}{'' if body['required'] else ' (optional)'}.", ""]
            lines += ["| status | answer |", "|---|---|"]
            for status, response in op["responses"].items():
                content = response.get("content", {})
                what = ", ".join(
                    f"{_schema_text(c['schema'])}" if media == "application/json" else f"`{media}`"
                    for media, c in content.items()
                )
                text = response["description"] + (f": {what}" if what else "")
                lines.append(f"| {status} | {_cell(text)} |")
    lines += ["", "## Schemas"]
    for name, schema in sorted(document["components"]["schemas"].items()):
        lines += ["", f"### {name} {{#{_schema_anchor(name)}}}", ""]
        if schema.get("description"):
            lines += [schema["description"].strip().splitlines()[0], ""]
        properties = schema.get("properties", {})
        if not properties:
            lines.append(_schema_text(schema))
            continue
        required = set(schema.get("required", ()))
        lines += ["| field | type | required | description |", "|---|---|---|---|"]
        for field_name, prop in properties.items():
            row = [
                f"`{field_name}`",
                _schema_text(prop),
                "yes" if field_name in required else "",
                prop.get("description", ""),
            ]
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines) + "\n"


def _schema_anchor(name: str) -> str:
    return "schema-" + name.lower()


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_schema_anchor(name)})"
    if "anyOf" in schema:
        return " or ".join(_schema_text(s) for s in schema["anyOf"])
    if "enum" in schema:
        return " or ".join(f"`{json.dumps(v)}`" for v in schema["enum"])
    if "const" in schema:
        return f"`{json.dumps(schema['const'])}`"
    kind = schema.get("type", "any")
    if kind == "array":
        return f"list of {_schema_text(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        values = schema["additionalProperties"]
        return f"object of {_schema_text(values) if isinstance(values, dict) else 'any'}"
    return str(kind)


# -- all pages ----------------------------------------------------------------------------------------


def stale_pages(root: Path) -> list[str]:
    """The generated pages whose committed copy under ``root / "docs"`` is missing or differs."""
    docs = root / "docs"
    return sorted(
        path
        for path, text in generated_pages(root).items()
        if not (docs / path).is_file() or (docs / path).read_text(encoding="utf-8") != text
    )


def write_pages(root: Path) -> list[str]:
    """Write the generated pages under ``root / "docs"``; the paths that changed."""
    changed = stale_pages(root)
    for path, text in generated_pages(root).items():
        if path in changed:
            (root / "docs" / path).write_text(text, encoding="utf-8")
    return changed


def generated_pages(root: Path) -> dict[str, str]:
    """The generated files of the manual by their path under ``docs/``; ``root`` is the repository."""
    document = openapi()
    changelog = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    return {
        "configuration.md": configuration_page(),
        "admin-api.md": admin_api_page(document),
        "openapi.json": json.dumps(document, indent=2) + "\n",
        "changelog.md": changelog,
    }
