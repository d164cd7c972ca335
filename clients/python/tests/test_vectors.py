"""The shared vectors in clients/testdata/, which the Go and TypeScript clients read too:
the same header gives the same key, the same request the same fingerprint, the same key
and random bytes the same sealed envelope."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

import idemd
from idemd import _seal
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


def sealing_vectors() -> dict[str, Any]:
    found: dict[str, Any] = json.loads((TESTDATA / "sealing.json").read_text())
    assert found["vectors"], "sealing.json has no vectors"
    assert found["refusals"], "sealing.json has no refusals"
    return found


SEALING = sealing_vectors()
RING_KEYS = {k["id"]: base64.b64decode(k["key_base64"]) for k in SEALING["ring"]}


def whole_ring() -> idemd.KeyRing:
    return idemd.KeyRing([idemd.SealKey(k["id"], RING_KEYS[k["id"]]) for k in SEALING["ring"]])


@pytest.mark.parametrize("v", SEALING["vectors"], ids=lambda v: f"v{v['version']} {v['name']}")
def test_sealing(v: dict[str, Any]) -> None:
    """A vector of version 2, sealed with its key and random bytes, is every byte the
    vector's; a vector of either version, opened with the whole ring, is the result (of
    its outcome; of either under version 1, which does not bind it) or the data again."""
    drawn = base64.b64decode(v["random_base64"])
    asked: list[int] = []

    def random(n: int) -> bytes:
        asked.append(n)
        return drawn

    ring = idemd.KeyRing([idemd.SealKey(v["key_id"], RING_KEYS[v["key_id"]])])
    sealing = idemd.Sealing(v["tenant"], ring, random=random)
    version = v["version"]
    head = bytes([_seal.MARKER, version]) + _seal.envelope_head_of(v["key_id"])[2:]
    want = base64.b64decode(v["sealed_base64"])
    assert want[: len(head)] == head
    opener = idemd.Sealing(v["tenant"], whole_ring())
    if v["kind"] == "response":
        outcome: _seal.Outcome = "failed" if v.get("outcome") == "failed" else "completed"
        response: idemd.Response | None = None
        if v.get("no_response"):
            plaintext = b""
            envelope = sealing.seal_no_response(v["key"])
        else:
            response = idemd.Response(v["status"], v.get("headers", {}), base64.b64decode(v["body_base64"]))
            plaintext = _seal.response_plaintext(response.headers, response.body)
            envelope = sealing.seal_response(v["key"], outcome, response)
        aad = head + _seal.result_aad(v["tenant"], v["key"], outcome, v["status"], version)
        opened_as_any: list[_seal.Outcome] = ["completed", "failed"]
        for opened_as in opened_as_any if version == _seal.VERSION_1 else [outcome]:
            assert opener.open_response(v["key"], opened_as, v["status"], want) == response
    else:
        data = base64.b64decode(v["data_base64"])
        plaintext = data
        aad = head + _seal.point_aad(v["tenant"], v["key"], v["point"], version)
        envelope = sealing.seal_point(v["key"], v["point"], data)
        assert opener.open_point(v["key"], v["point"], want) == data
    assert asked == [28]
    assert plaintext == base64.b64decode(v["plaintext_base64"])
    assert aad == base64.b64decode(v["aad_base64"])
    if version == _seal.VERSION:
        # Clients write version 2 only; the vectors of version 1 are opened.
        assert envelope == want


@pytest.mark.parametrize("v", SEALING["ring_texts"], ids=lambda v: v["name"])
def test_sealing_ring_text(v: dict[str, Any]) -> None:
    """Each ring text reads into a ring of its key ids, in order, the first sealing, or
    is refused."""
    if v.get("error"):
        with pytest.raises(ValueError, match=r"\S"):
            idemd.KeyRing.parse(v["text"])
        return
    ring = idemd.KeyRing.parse(v["text"])
    assert ring.key_ids == v["key_ids"]
    assert ring.sealing_key_id == v["key_ids"][0]


@pytest.mark.parametrize("v", SEALING["refusals"], ids=lambda v: v["name"])
def test_sealing_refusal(v: dict[str, Any]) -> None:
    """Each refusal fails to open with the whole ring, with its reason and key id."""
    sealing = idemd.Sealing(v["tenant"], whole_ring())
    envelope = base64.b64decode(v["sealed_base64"])
    if v["kind"] == "response":
        with pytest.raises(idemd.Unsealable) as refused:
            sealing.open_response(v["key"], v.get("outcome", "completed"), v["status"], envelope)
    else:
        with pytest.raises(idemd.Unsealable) as refused:
            sealing.open_point(v["key"], v["point"], envelope)
    assert (refused.value.reason, refused.value.key_id) == (v["error"], v.get("key_id", ""))
    assert isinstance(refused.value, idemd.IdemdError)
