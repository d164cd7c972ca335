from http import HTTPStatus
from io import BytesIO
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.problem import Problem
from ...types import File, Response


def _get_kwargs() -> dict[str, Any]:

    _kwargs: dict[str, Any] = {
        "method": "get",
        "url": "/v1/admin/backup",
    }

    return _kwargs


def _parse_response(*, client: AuthenticatedClient | Client, response: httpx.Response) -> File | Problem:
    if response.status_code == 200:
        response_200 = File(payload=BytesIO(response.content))

        return response_200

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = Problem.from_dict(response.json())

        return response_403

    if response.status_code == 429:
        response_429 = Problem.from_dict(response.json())

        return response_429

    if response.status_code == 501:
        response_501 = Problem.from_dict(response.json())

        return response_501

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
    *,
    client: AuthenticatedClient | Client,
) -> Response[File | Problem]:
    """A consistent copy of the embedded store's database (an operator's tool).

     Streams a copy of the embedded store's database file, consistent as of one
    moment, while the daemon keeps serving: a file that idemd opens as its data
    directory's `idemd.db` (`idemctl restore`). It holds every tenant's records,
    so it needs the `platform` scope beside `admin` (or an open daemon). The
    header `Idemd-Backup-Bytes` gives its length; the trailer `Idemd-Backup-Sha256`
    its SHA-256 in hex, without which the copy was cut short. A daemon on Redis
    answers 501 (`not_supported`): Redis's persistence is its backup.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[File | Problem]
    """

    kwargs = _get_kwargs()

    response = client.get_httpx_client().request(
        **kwargs,
    )

    return _build_response(client=client, response=response)


def sync(
    *,
    client: AuthenticatedClient | Client,
) -> File | Problem | None:
    """A consistent copy of the embedded store's database (an operator's tool).

     Streams a copy of the embedded store's database file, consistent as of one
    moment, while the daemon keeps serving: a file that idemd opens as its data
    directory's `idemd.db` (`idemctl restore`). It holds every tenant's records,
    so it needs the `platform` scope beside `admin` (or an open daemon). The
    header `Idemd-Backup-Bytes` gives its length; the trailer `Idemd-Backup-Sha256`
    its SHA-256 in hex, without which the copy was cut short. A daemon on Redis
    answers 501 (`not_supported`): Redis's persistence is its backup.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        File | Problem
    """

    return sync_detailed(
        client=client,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
) -> Response[File | Problem]:
    """A consistent copy of the embedded store's database (an operator's tool).

     Streams a copy of the embedded store's database file, consistent as of one
    moment, while the daemon keeps serving: a file that idemd opens as its data
    directory's `idemd.db` (`idemctl restore`). It holds every tenant's records,
    so it needs the `platform` scope beside `admin` (or an open daemon). The
    header `Idemd-Backup-Bytes` gives its length; the trailer `Idemd-Backup-Sha256`
    its SHA-256 in hex, without which the copy was cut short. A daemon on Redis
    answers 501 (`not_supported`): Redis's persistence is its backup.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[File | Problem]
    """

    kwargs = _get_kwargs()

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
) -> File | Problem | None:
    """A consistent copy of the embedded store's database (an operator's tool).

     Streams a copy of the embedded store's database file, consistent as of one
    moment, while the daemon keeps serving: a file that idemd opens as its data
    directory's `idemd.db` (`idemctl restore`). It holds every tenant's records,
    so it needs the `platform` scope beside `admin` (or an open daemon). The
    header `Idemd-Backup-Bytes` gives its length; the trailer `Idemd-Backup-Sha256`
    its SHA-256 in hex, without which the copy was cut short. A daemon on Redis
    answers 501 (`not_supported`): Redis's persistence is its backup.

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        File | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
        )
    ).parsed
