from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.import_summary import ImportSummary
from ...models.problem import Problem
from ...types import File, Response


def _get_kwargs(
    *,
    body: File,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/admin/records",
    }

    _kwargs["content"] = body.payload
    headers["Content-Type"] = "application/x-ndjson"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ImportSummary | Problem:
    if response.status_code == 200:
        response_200 = ImportSummary.from_dict(response.json())

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

    if response.status_code == 429:
        response_429 = Problem.from_dict(response.json())

        return response_429

    if response.status_code == 503:
        response_503 = Problem.from_dict(response.json())

        return response_503

    response_default = Problem.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[ImportSummary | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: File,
) -> Response[ImportSummary | Problem]:
    """Import a record stream (an operator's tool).

     Writes each record of a record stream where the store holds no live record of
    its key, with its times as they are; a record the store holds already, newer or
    different, is kept and the answer names it. Records of another tenant than the
    caller's need the `platform` scope. A record imported from a stream has a new
    lease token no caller holds: its holder gets the lease back by claiming with
    its claim secret, or the lease runs out and is taken over. Records of another
    tenant than the caller's are imported with the `platform` scope only, and
    otherwise counted in `other_tenant` and left out. Importing a stream again is
    safe. A malformed line is refused (400, naming the line and the member); the
    records before it are imported (`idemctl import` checks the whole stream
    before it sends any).

    Args:
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ImportSummary | Problem]
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
    body: File,
) -> ImportSummary | Problem | None:
    """Import a record stream (an operator's tool).

     Writes each record of a record stream where the store holds no live record of
    its key, with its times as they are; a record the store holds already, newer or
    different, is kept and the answer names it. Records of another tenant than the
    caller's need the `platform` scope. A record imported from a stream has a new
    lease token no caller holds: its holder gets the lease back by claiming with
    its claim secret, or the lease runs out and is taken over. Records of another
    tenant than the caller's are imported with the `platform` scope only, and
    otherwise counted in `other_tenant` and left out. Importing a stream again is
    safe. A malformed line is refused (400, naming the line and the member); the
    records before it are imported (`idemctl import` checks the whole stream
    before it sends any).

    Args:
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ImportSummary | Problem
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: File,
) -> Response[ImportSummary | Problem]:
    """Import a record stream (an operator's tool).

     Writes each record of a record stream where the store holds no live record of
    its key, with its times as they are; a record the store holds already, newer or
    different, is kept and the answer names it. Records of another tenant than the
    caller's need the `platform` scope. A record imported from a stream has a new
    lease token no caller holds: its holder gets the lease back by claiming with
    its claim secret, or the lease runs out and is taken over. Records of another
    tenant than the caller's are imported with the `platform` scope only, and
    otherwise counted in `other_tenant` and left out. Importing a stream again is
    safe. A malformed line is refused (400, naming the line and the member); the
    records before it are imported (`idemctl import` checks the whole stream
    before it sends any).

    Args:
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ImportSummary | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    body: File,
) -> ImportSummary | Problem | None:
    """Import a record stream (an operator's tool).

     Writes each record of a record stream where the store holds no live record of
    its key, with its times as they are; a record the store holds already, newer or
    different, is kept and the answer names it. Records of another tenant than the
    caller's need the `platform` scope. A record imported from a stream has a new
    lease token no caller holds: its holder gets the lease back by claiming with
    its claim secret, or the lease runs out and is taken over. Records of another
    tenant than the caller's are imported with the `platform` scope only, and
    otherwise counted in `other_tenant` and left out. Importing a stream again is
    safe. A malformed line is refused (400, naming the line and the member); the
    records before it are imported (`idemctl import` checks the whole stream
    before it sends any).

    Args:
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ImportSummary | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
