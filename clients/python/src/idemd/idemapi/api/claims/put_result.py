from http import HTTPStatus
from typing import Any
from urllib.parse import quote

import httpx

from ...client import AuthenticatedClient, Client
from ...models.key_record import KeyRecord
from ...models.problem import Problem
from ...models.put_result_idemd_sealed import PutResultIdemdSealed
from ...types import UNSET, File, Response, Unset


def _get_kwargs(
    key: str,
    *,
    body: File,
    idemd_lease_token: str,
    idemd_attempt: int | Unset = UNSET,
    idemd_status: int,
    idemd_result_headers: str | Unset = UNSET,
    idemd_sealed: PutResultIdemdSealed | Unset = UNSET,
    idemd_retention_ms: int | Unset = UNSET,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}
    headers["Idemd-Lease-Token"] = idemd_lease_token

    if not isinstance(idemd_attempt, Unset):
        headers["Idemd-Attempt"] = str(idemd_attempt)

    headers["Idemd-Status"] = str(idemd_status)

    if not isinstance(idemd_result_headers, Unset):
        headers["Idemd-Result-Headers"] = idemd_result_headers

    if not isinstance(idemd_sealed, Unset):
        headers["Idemd-Sealed"] = str(idemd_sealed)

    if not isinstance(idemd_retention_ms, Unset):
        headers["Idemd-Retention-Ms"] = str(idemd_retention_ms)

    _kwargs: dict[str, Any] = {
        "method": "put",
        "url": "/v1/keys/{key}/result".format(
            key=quote(str(key), safe=""),
        ),
    }

    _kwargs["content"] = body.payload
    headers["Content-Type"] = "application/octet-stream"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> KeyRecord | Problem:
    if response.status_code == 200:
        response_200 = KeyRecord.from_dict(response.json())

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

    if response.status_code == 409:
        response_409 = Problem.from_dict(response.json())

        return response_409

    if response.status_code == 413:
        response_413 = Problem.from_dict(response.json())

        return response_413

    if response.status_code == 415:
        response_415 = Problem.from_dict(response.json())

        return response_415

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
) -> Response[KeyRecord | Problem]:
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
    body: File,
    idemd_lease_token: str,
    idemd_attempt: int | Unset = UNSET,
    idemd_status: int,
    idemd_result_headers: str | Unset = UNSET,
    idemd_sealed: PutResultIdemdSealed | Unset = UNSET,
    idemd_retention_ms: int | Unset = UNSET,
) -> Response[KeyRecord | Problem]:
    """Store the result of a claimed key as raw bytes.

     The same transition as `POST /v1/complete`, with the stored response's body (or,
    with `Idemd-Sealed: 1`, its sealed envelope) as the raw request body instead of
    base64 in JSON, and the rest in headers. A result up to `--max-response-bytes`
    is stored as `/v1/complete` stores it; a daemon with a blob store takes one up
    to its `--max-blob-bytes` and keeps it there by reference (413 over).

    Args:
        key (str):
        idemd_lease_token (str):
        idemd_attempt (int | Unset):
        idemd_status (int):
        idemd_result_headers (str | Unset):
        idemd_sealed (PutResultIdemdSealed | Unset):
        idemd_retention_ms (int | Unset):
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[KeyRecord | Problem]
    """

    kwargs = _get_kwargs(
        key=key,
        body=body,
        idemd_lease_token=idemd_lease_token,
        idemd_attempt=idemd_attempt,
        idemd_status=idemd_status,
        idemd_result_headers=idemd_result_headers,
        idemd_sealed=idemd_sealed,
        idemd_retention_ms=idemd_retention_ms,
    )

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    key: str,
    *,
    client: AuthenticatedClient | Client,
    body: File,
    idemd_lease_token: str,
    idemd_attempt: int | Unset = UNSET,
    idemd_status: int,
    idemd_result_headers: str | Unset = UNSET,
    idemd_sealed: PutResultIdemdSealed | Unset = UNSET,
    idemd_retention_ms: int | Unset = UNSET,
) -> KeyRecord | Problem | None:
    """Store the result of a claimed key as raw bytes.

     The same transition as `POST /v1/complete`, with the stored response's body (or,
    with `Idemd-Sealed: 1`, its sealed envelope) as the raw request body instead of
    base64 in JSON, and the rest in headers. A result up to `--max-response-bytes`
    is stored as `/v1/complete` stores it; a daemon with a blob store takes one up
    to its `--max-blob-bytes` and keeps it there by reference (413 over).

    Args:
        key (str):
        idemd_lease_token (str):
        idemd_attempt (int | Unset):
        idemd_status (int):
        idemd_result_headers (str | Unset):
        idemd_sealed (PutResultIdemdSealed | Unset):
        idemd_retention_ms (int | Unset):
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        KeyRecord | Problem
    """

    return sync_detailed(
        key=key,
        client=client,
        body=body,
        idemd_lease_token=idemd_lease_token,
        idemd_attempt=idemd_attempt,
        idemd_status=idemd_status,
        idemd_result_headers=idemd_result_headers,
        idemd_sealed=idemd_sealed,
        idemd_retention_ms=idemd_retention_ms,
    ).parsed


async def asyncio_detailed(
    key: str,
    *,
    client: AuthenticatedClient | Client,
    body: File,
    idemd_lease_token: str,
    idemd_attempt: int | Unset = UNSET,
    idemd_status: int,
    idemd_result_headers: str | Unset = UNSET,
    idemd_sealed: PutResultIdemdSealed | Unset = UNSET,
    idemd_retention_ms: int | Unset = UNSET,
) -> Response[KeyRecord | Problem]:
    """Store the result of a claimed key as raw bytes.

     The same transition as `POST /v1/complete`, with the stored response's body (or,
    with `Idemd-Sealed: 1`, its sealed envelope) as the raw request body instead of
    base64 in JSON, and the rest in headers. A result up to `--max-response-bytes`
    is stored as `/v1/complete` stores it; a daemon with a blob store takes one up
    to its `--max-blob-bytes` and keeps it there by reference (413 over).

    Args:
        key (str):
        idemd_lease_token (str):
        idemd_attempt (int | Unset):
        idemd_status (int):
        idemd_result_headers (str | Unset):
        idemd_sealed (PutResultIdemdSealed | Unset):
        idemd_retention_ms (int | Unset):
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[KeyRecord | Problem]
    """

    kwargs = _get_kwargs(
        key=key,
        body=body,
        idemd_lease_token=idemd_lease_token,
        idemd_attempt=idemd_attempt,
        idemd_status=idemd_status,
        idemd_result_headers=idemd_result_headers,
        idemd_sealed=idemd_sealed,
        idemd_retention_ms=idemd_retention_ms,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    key: str,
    *,
    client: AuthenticatedClient | Client,
    body: File,
    idemd_lease_token: str,
    idemd_attempt: int | Unset = UNSET,
    idemd_status: int,
    idemd_result_headers: str | Unset = UNSET,
    idemd_sealed: PutResultIdemdSealed | Unset = UNSET,
    idemd_retention_ms: int | Unset = UNSET,
) -> KeyRecord | Problem | None:
    """Store the result of a claimed key as raw bytes.

     The same transition as `POST /v1/complete`, with the stored response's body (or,
    with `Idemd-Sealed: 1`, its sealed envelope) as the raw request body instead of
    base64 in JSON, and the rest in headers. A result up to `--max-response-bytes`
    is stored as `/v1/complete` stores it; a daemon with a blob store takes one up
    to its `--max-blob-bytes` and keeps it there by reference (413 over).

    Args:
        key (str):
        idemd_lease_token (str):
        idemd_attempt (int | Unset):
        idemd_status (int):
        idemd_result_headers (str | Unset):
        idemd_sealed (PutResultIdemdSealed | Unset):
        idemd_retention_ms (int | Unset):
        body (File):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        KeyRecord | Problem
    """

    return (
        await asyncio_detailed(
            key=key,
            client=client,
            body=body,
            idemd_lease_token=idemd_lease_token,
            idemd_attempt=idemd_attempt,
            idemd_status=idemd_status,
            idemd_result_headers=idemd_result_headers,
            idemd_sealed=idemd_sealed,
            idemd_retention_ms=idemd_retention_ms,
        )
    ).parsed
