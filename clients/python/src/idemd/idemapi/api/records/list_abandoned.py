from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.abandoned_keys import AbandonedKeys
from ...models.problem import Problem
from ...types import UNSET, Response, Unset


def _get_kwargs(
    *,
    prefix: str | Unset = UNSET,
    older_than_ms: int | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> dict[str, Any]:

    params: dict[str, Any] = {}

    params["prefix"] = prefix

    params["older_than_ms"] = older_than_ms

    params["limit"] = limit

    params["cursor"] = cursor

    params = {k: v for k, v in params.items() if v is not UNSET and v is not None}

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/abandoned",
        "params": params,
    }

    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> AbandonedKeys | Problem:
    if response.status_code == 200:
        response_200 = AbandonedKeys.from_dict(response.json())

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
) -> Response[AbandonedKeys | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    prefix: str | Unset = UNSET,
    older_than_ms: int | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> Response[AbandonedKeys | Problem]:
    """List the keys whose holder left them pending.

     A key is abandoned when it is pending and its lease ran out (more than
    `older_than_ms` ago): its holder died or was cut off, and nobody has claimed it
    since. A completer lists them, claims each (the claim decides who finishes it:
    a lease may have been renewed or taken over since the page was read, and the
    claim answers in_progress then), and finishes the work from the recovery
    point. The keys of the caller's tenant only, in an order the cursor continues;
    a page may hold fewer than `limit` keys, even none, and still have a
    `next_cursor`: read until there is none.

    Args:
        prefix (str | Unset):
        older_than_ms (int | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[AbandonedKeys | Problem]
    """

    kwargs = _get_kwargs(
        prefix=prefix,
        older_than_ms=older_than_ms,
        limit=limit,
        cursor=cursor,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient | Client,
    prefix: str | Unset = UNSET,
    older_than_ms: int | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> AbandonedKeys | Problem | None:
    """List the keys whose holder left them pending.

     A key is abandoned when it is pending and its lease ran out (more than
    `older_than_ms` ago): its holder died or was cut off, and nobody has claimed it
    since. A completer lists them, claims each (the claim decides who finishes it:
    a lease may have been renewed or taken over since the page was read, and the
    claim answers in_progress then), and finishes the work from the recovery
    point. The keys of the caller's tenant only, in an order the cursor continues;
    a page may hold fewer than `limit` keys, even none, and still have a
    `next_cursor`: read until there is none.

    Args:
        prefix (str | Unset):
        older_than_ms (int | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        AbandonedKeys | Problem
    """

    return sync_detailed(
        client=client,
        prefix=prefix,
        older_than_ms=older_than_ms,
        limit=limit,
        cursor=cursor,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    prefix: str | Unset = UNSET,
    older_than_ms: int | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> Response[AbandonedKeys | Problem]:
    """List the keys whose holder left them pending.

     A key is abandoned when it is pending and its lease ran out (more than
    `older_than_ms` ago): its holder died or was cut off, and nobody has claimed it
    since. A completer lists them, claims each (the claim decides who finishes it:
    a lease may have been renewed or taken over since the page was read, and the
    claim answers in_progress then), and finishes the work from the recovery
    point. The keys of the caller's tenant only, in an order the cursor continues;
    a page may hold fewer than `limit` keys, even none, and still have a
    `next_cursor`: read until there is none.

    Args:
        prefix (str | Unset):
        older_than_ms (int | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[AbandonedKeys | Problem]
    """

    kwargs = _get_kwargs(
        prefix=prefix,
        older_than_ms=older_than_ms,
        limit=limit,
        cursor=cursor,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    prefix: str | Unset = UNSET,
    older_than_ms: int | Unset = UNSET,
    limit: int | Unset = UNSET,
    cursor: str | Unset = UNSET,
) -> AbandonedKeys | Problem | None:
    """List the keys whose holder left them pending.

     A key is abandoned when it is pending and its lease ran out (more than
    `older_than_ms` ago): its holder died or was cut off, and nobody has claimed it
    since. A completer lists them, claims each (the claim decides who finishes it:
    a lease may have been renewed or taken over since the page was read, and the
    claim answers in_progress then), and finishes the work from the recovery
    point. The keys of the caller's tenant only, in an order the cursor continues;
    a page may hold fewer than `limit` keys, even none, and still have a
    `next_cursor`: read until there is none.

    Args:
        prefix (str | Unset):
        older_than_ms (int | Unset):
        limit (int | Unset):
        cursor (str | Unset):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        AbandonedKeys | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            prefix=prefix,
            older_than_ms=older_than_ms,
            limit=limit,
            cursor=cursor,
        )
    ).parsed
