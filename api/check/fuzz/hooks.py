"""What Schemathesis needs to know of idemd's contract beyond OpenAPI 3.0's words.

- Links that fill members of the next request's body give them under
  `x-request-body` (OpenAPI 3.0 tools read a link's `requestBody` only as one
  expression): they become the `requestBody` Schemathesis reads, so that the stateful
  phase chains a claim's lease into complete, release, extend and recovery points.
- A schema-valid request may still be refused for a reason the contract documents and
  JSON Schema cannot say (docs/contract-fuzzing.md lists them): those refusals do not
  fail the run. Every other refusal of a schema-valid request does.
"""

from __future__ import annotations

import json
import re
from typing import Any

import schemathesis
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.openapi.checks import RejectedPositiveData

# Refusals that depend on the state of the key, the daemon's limits or the tenant:
# (status, problem code).
STATE_REFUSALS = {
    (404, "not_found"),
    (409, "in_progress"),
    (409, "lease_lost"),
    (413, "payload_too_large"),
    (422, "fingerprint_mismatch"),
    (429, "rate_limited"),
}

# 400 invalid_request for rules of the contract that JSON Schema cannot express,
# recognised by the detail, which names the member.
RULE_REFUSALS = [
    # Lengths are in bytes of UTF-8; maxLength counts characters.
    re.compile(r"is \d+ bytes, over the limit of \d+$"),
    re.compile(r"^lease_token is \d+ bytes; lease tokens are short$"),
    re.compile(r"^prefix is \d+ bytes, over the limit of \d+$"),
    # A stored response: header names are RFC 9110 tokens, values hold no control
    # characters, hop-by-hop and framing headers and the sealed mark are refused.
    re.compile(r"^response\.headers\[.*\]: "),
    re.compile(r"^response\.headers has an empty header name$"),
    re.compile(r"^response\.headers\[.*\]\[\d+\]: a header value may not hold"),
    # A 204 or 304 has no body; only a release with mode fail stores a response.
    re.compile(r"^response\.body: a \d+ response has no body"),
    re.compile(r"^response: only a release with mode fail stores a response$"),
    # sealed is an envelope (docs/sealing.md), which random bytes are not.
    re.compile(r"^response\.sealed: "),
    # The raw result's stored headers are a JSON object inside a header's string,
    # whose grammar a header parameter's schema cannot say.
    re.compile(r"^Idemd-Result-Headers(\[.*\])?: "),
    # A cursor is one the feed gave.
    re.compile(r"^cursor is not a next_cursor of this feed"),
    # An import's body is a record stream (docs/moving.md), which random bytes are not.
    re.compile(r"^body: not a record stream: "),
    # format: byte is a format, which JSON Schema validators need not enforce: the
    # fuzzer now and then sends a string that is not base64.
    re.compile(r"^(data|response\.body): not valid base64 "),
]


# The record stream (GET and POST /v1/admin/records) is lines of JSON, which
# Schemathesis sends as it sends any binary body.
schemathesis.serializer.alias("application/x-ndjson", "application/octet-stream")


@schemathesis.hook
def before_load_schema(context: Any, raw_schema: dict[str, Any]) -> None:
    def body_links(links: dict[str, Any]) -> None:
        for link in links.values():
            if isinstance(link, dict) and "x-request-body" in link:
                link["requestBody"] = link.pop("x-request-body")

    body_links(raw_schema.get("components", {}).get("links", {}))
    for item in raw_schema.get("paths", {}).values():
        for operation in item.values():
            if not isinstance(operation, dict):
                continue
            for response in operation.get("responses", {}).values():
                if isinstance(response, dict):
                    body_links(response.get("links", {}))


def documented_refusal(response: Any) -> bool:
    try:
        problem = json.loads(response.content)
    except ValueError:
        return False
    if not isinstance(problem, dict):
        return False
    code, detail = problem.get("code"), problem.get("detail", "")
    if (response.status_code, code) in STATE_REFUSALS:
        return True
    if (
        response.status_code == 400
        and code == "invalid_request"
        and isinstance(detail, str)
    ):
        return any(rule.search(detail) for rule in RULE_REFUSALS)
    return False


def item_refused(response: Any) -> bool:
    """A batch answers 200 and refuses each invalid item on its own, with a 400 problem."""
    try:
        results = json.loads(response.content).get("results", [])
    except (ValueError, AttributeError):
        return False
    return any(
        isinstance(r, dict)
        and r.get("status") == 400
        and r.get("problem", {}).get("code") == "invalid_request"
        for r in results
    )


def secret_long_enough_in_bytes(failure: Any, case: Any) -> bool:
    """claim_secret's minLength is 22 bytes: fewer characters than that may hold as many bytes."""
    body = case.body if isinstance(case.body, dict) else {}
    secret = body.get("claim_secret")
    return (
        "minLength" in failure.message
        and "claim_secret" in failure.message
        and isinstance(secret, str)
        and 22 <= len(secret.encode("utf-8", "surrogatepass")) <= 256
    )


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    if isinstance(failure, RejectedPositiveData) and documented_refusal(response):
        return False
    if isinstance(failure, AcceptedNegativeData):
        if (
            case.operation.path == "/v1/batch"
            and response.status_code == 200
            and item_refused(response)
        ):
            return False
        if case.operation.path == "/v1/claim" and secret_long_enough_in_bytes(
            failure, case
        ):
            return False
    return True
