"""The shared vectors in clients/testdata/, which the Go and TypeScript middlewares read
too: the same header gives the same key, the same request the same fingerprint."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from idemd._middleware import InvalidKey, hashed_body, idemd_key, media_type, parse_key
from idemd._middleware import fingerprint as fingerprint_of

TESTDATA = Path(__file__).resolve().parents[2] / "testdata"


def vectors(name: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads((TESTDATA / name).read_text())["vectors"]
    assert found, f"{name} has no vectors"
    return found


def raw(vector: dict[str, Any], field: str) -> bytes:
    if field + "_base64" in vector:
        return base64.b64decode(vector[field + "_base64"])
    text: str = vector[field]
    return text.encode("utf-8", "surrogatepass")


def optional(vector: dict[str, Any], field: str) -> bytes | None:
    return vector[field].encode("latin-1") if field in vector else None


@pytest.mark.parametrize("v", vectors("fingerprint.json"), ids=lambda v: v["name"])
def test_fingerprint(v: dict[str, Any]) -> None:
    body = raw(v, "body")
    content_type = optional(v, "content_type")
    hashed, canonical = hashed_body(media_type(content_type), optional(v, "content_encoding"), body)
    assert canonical == v["canonical_json"]
    assert hashed == raw(v, "hashed_body")
    got = fingerprint_of(
        v["method"],
        v["path"].encode("latin-1"),
        v["query"].encode("latin-1"),
        content_type,
        optional(v, "content_encoding"),
        body,
    )
    assert got == v["fingerprint"]


@pytest.mark.parametrize("v", vectors("idemd_key.json"), ids=lambda v: v["name"])
def test_idemd_key(v: dict[str, Any]) -> None:
    assert idemd_key(v["scope"], v["key"]) == v["idemd_key"]


@pytest.mark.parametrize("v", vectors("idempotency_key_header.json"), ids=lambda v: v["name"])
def test_header(v: dict[str, Any]) -> None:
    lines = [line.encode("latin-1") for line in v["field_lines"]]
    if v.get("error"):
        with pytest.raises(InvalidKey):
            parse_key(lines)
    elif v.get("missing"):
        assert parse_key(lines) is None
    else:
        assert parse_key(lines) == v["key"]


@pytest.mark.parametrize(
    ("environ", "path", "query"),
    [
        ({"REQUEST_URI": "/orders/%61?b=1&a=2"}, b"/orders/%61", b"b=1&a=2"),
        ({"RAW_URI": "/orders"}, b"/orders", b""),
        ({"REQUEST_URI": "http://host:8080/orders?x"}, b"/orders", b"x"),
        (
            {"SCRIPT_NAME": "/api", "PATH_INFO": "/orders/\u00c3\u00a9 x", "QUERY_STRING": "q=%20"},
            b"/api/orders/%C3%A9%20x",
            b"q=%20",
        ),
    ],
)
def test_wsgi_request_target(environ: dict[str, str], path: bytes, query: bytes) -> None:
    """The path and the query as sent, from what a WSGI server offers (docs/middleware.md,
    The fingerprint: REQUEST_URI, else SCRIPT_NAME and PATH_INFO encoded again)."""
    from idemd.wsgi import _target

    assert _target(environ) == (path, query)
