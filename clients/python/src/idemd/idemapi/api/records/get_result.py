from http import HTTPStatus
from io import BytesIO
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...types import File, Response


def _get_kwargs(
    key: str,
) -> dict[str, Any]:

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/keys/{key}/result".format(
            key=quote(str(key), safe=""),
        ),
    }

    return _kwargs


def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> File | Problem:
    if response.status_code == 200:
        response_200 = File(payload=BytesIO(response.content))

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

    if response.status_code == 404:
        response_404 = Problem.from_dict(response.json())

        return response_404

    if response.status_code == 429:
        response_429 = Problem.from_dict(response.json())

        return response_429

    if response.status_code == 502:
        response_502 = Problem.from_dict(response.json())

        return response_502

    if response.status_code == 503:
        response_503 = Problem.from_dict(response.json())

        return response_503

    response_default = Problem.from_dict(response.json())

    return response_default


def _build_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> Response[File | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    key: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[File | Problem]:
    """The stored result of a finished key as raw bytes.

     The body (or sealed envelope) of the key's stored response, byte for byte, as
    the raw answer body, with its status and headers in the answer's headers; 404
    when the key has no record or no stored response. A result kept in the blob
    store streams from it, checked against its size and SHA-256 as it goes: one
    missing or of another size answers 502 result_unavailable before any byte is
    sent; one found altered once the answer has begun has its connection cut short
    of the Content-Length, so that no client takes it for the result.

    Args:
        key (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[File | Problem]
    """

    kwargs = _get_kwargs(
        key=key,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    key: str,
    *,
    client: AuthenticatedClient | Client,
) -> File | Problem | None:
    """The stored result of a finished key as raw bytes.

     The body (or sealed envelope) of the key's stored response, byte for byte, as
    the raw answer body, with its status and headers in the answer's headers; 404
    when the key has no record or no stored response. A result kept in the blob
    store streams from it, checked against its size and SHA-256 as it goes: one
    missing or of another size answers 502 result_unavailable before any byte is
    sent; one found altered once the answer has begun has its connection cut short
    of the Content-Length, so that no client takes it for the result.

    Args:
        key (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        File | Problem
    """

    return sync_detailed(
        key=key,
        client=client,
    ).parsed


async def asyncio_detailed(
    key: str,
    *,
    client: AuthenticatedClient | Client,
) -> Response[File | Problem]:
    """The stored result of a finished key as raw bytes.

     The body (or sealed envelope) of the key's stored response, byte for byte, as
    the raw answer body, with its status and headers in the answer's headers; 404
    when the key has no record or no stored response. A result kept in the blob
    store streams from it, checked against its size and SHA-256 as it goes: one
    missing or of another size answers 502 result_unavailable before any byte is
    sent; one found altered once the answer has begun has its connection cut short
    of the Content-Length, so that no client takes it for the result.

    Args:
        key (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[File | Problem]
    """

    kwargs = _get_kwargs(
        key=key,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    key: str,
    *,
    client: AuthenticatedClient | Client,
) -> File | Problem | None:
    """The stored result of a finished key as raw bytes.

     The body (or sealed envelope) of the key's stored response, byte for byte, as
    the raw answer body, with its status and headers in the answer's headers; 404
    when the key has no record or no stored response. A result kept in the blob
    store streams from it, checked against its size and SHA-256 as it goes: one
    missing or of another size answers 502 result_unavailable before any byte is
    sent; one found altered once the answer has begun has its connection cut short
    of the Content-Length, so that no client takes it for the result.

    Args:
        key (str):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        File | Problem
    """

    return (
        await asyncio_detailed(
            key=key,
            client=client,
        )
    ).parsed
