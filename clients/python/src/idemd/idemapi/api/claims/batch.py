from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.batch_request import BatchRequest
from ...models.batch_results import BatchResults
from ...models.problem import Problem
from ...types import Response


def _get_kwargs(
    *,
    body: BatchRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/batch",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> BatchResults | Problem:
    if response.status_code == 200:
        response_200 = BatchResults.from_dict(response.json())

        return response_200

    if response.status_code == 400:
        response_400 = Problem.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = Problem.from_dict(response.json())

        return response_403

    if response.status_code == 413:
        response_413 = Problem.from_dict(response.json())

        return response_413

    if response.status_code == 415:
        response_415 = Problem.from_dict(response.json())

        return response_415

    response_default = Problem.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[BatchResults | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: BatchRequest,
) -> Response[BatchResults | Problem]:
    """Claim, complete, release and extend several keys in one request.

     Each item is one claim, complete, release or extend, answered on its own exactly
    as the single call would answer it: its status, and the single call's answer or
    problem. Items are independent (not one transaction): one item failing changes
    nothing for the others. Items on the same key run in their order in the batch;
    items on different keys may run in any order. Once an item finds the store
    unavailable, the later items on its key answer 503 at once, without being run.
    The answer lists one result per item, in the order of the items.

    A client gathers the calls it would send at the same time into one batch, which
    saves a round trip and an HTTP request per call. A claim in a batch does not
    wait: `wait_ms` above 0 is refused for that item (send a waiting claim alone).
    Each item counts against the tenant's request rate; an item over it answers 429.

    The batch itself answers 200 once it is a valid batch of at most 128 items, from a
    token with the `use` scope; a body over the daemon's limit for one request answers
    413, and a malformed batch 400, naming the member at fault.

    Args:
        body (BatchRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BatchResults | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient | Client,
    body: BatchRequest,
) -> BatchResults | Problem | None:
    """Claim, complete, release and extend several keys in one request.

     Each item is one claim, complete, release or extend, answered on its own exactly
    as the single call would answer it: its status, and the single call's answer or
    problem. Items are independent (not one transaction): one item failing changes
    nothing for the others. Items on the same key run in their order in the batch;
    items on different keys may run in any order. Once an item finds the store
    unavailable, the later items on its key answer 503 at once, without being run.
    The answer lists one result per item, in the order of the items.

    A client gathers the calls it would send at the same time into one batch, which
    saves a round trip and an HTTP request per call. A claim in a batch does not
    wait: `wait_ms` above 0 is refused for that item (send a waiting claim alone).
    Each item counts against the tenant's request rate; an item over it answers 429.

    The batch itself answers 200 once it is a valid batch of at most 128 items, from a
    token with the `use` scope; a body over the daemon's limit for one request answers
    413, and a malformed batch 400, naming the member at fault.

    Args:
        body (BatchRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BatchResults | Problem
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: BatchRequest,
) -> Response[BatchResults | Problem]:
    """Claim, complete, release and extend several keys in one request.

     Each item is one claim, complete, release or extend, answered on its own exactly
    as the single call would answer it: its status, and the single call's answer or
    problem. Items are independent (not one transaction): one item failing changes
    nothing for the others. Items on the same key run in their order in the batch;
    items on different keys may run in any order. Once an item finds the store
    unavailable, the later items on its key answer 503 at once, without being run.
    The answer lists one result per item, in the order of the items.

    A client gathers the calls it would send at the same time into one batch, which
    saves a round trip and an HTTP request per call. A claim in a batch does not
    wait: `wait_ms` above 0 is refused for that item (send a waiting claim alone).
    Each item counts against the tenant's request rate; an item over it answers 429.

    The batch itself answers 200 once it is a valid batch of at most 128 items, from a
    token with the `use` scope; a body over the daemon's limit for one request answers
    413, and a malformed batch 400, naming the member at fault.

    Args:
        body (BatchRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[BatchResults | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    body: BatchRequest,
) -> BatchResults | Problem | None:
    """Claim, complete, release and extend several keys in one request.

     Each item is one claim, complete, release or extend, answered on its own exactly
    as the single call would answer it: its status, and the single call's answer or
    problem. Items are independent (not one transaction): one item failing changes
    nothing for the others. Items on the same key run in their order in the batch;
    items on different keys may run in any order. Once an item finds the store
    unavailable, the later items on its key answer 503 at once, without being run.
    The answer lists one result per item, in the order of the items.

    A client gathers the calls it would send at the same time into one batch, which
    saves a round trip and an HTTP request per call. A claim in a batch does not
    wait: `wait_ms` above 0 is refused for that item (send a waiting claim alone).
    Each item counts against the tenant's request rate; an item over it answers 429.

    The batch itself answers 200 once it is a valid batch of at most 128 items, from a
    token with the `use` scope; a body over the daemon's limit for one request answers
    413, and a malformed batch 400, naming the member at fault.

    Args:
        body (BatchRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        BatchResults | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
