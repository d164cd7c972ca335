from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.key_record import KeyRecord
from ...models.problem import Problem
from ...models.recovery_point_request import RecoveryPointRequest
from ...types import Response


def _get_kwargs(
    *,
    body: RecoveryPointRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/recovery-point",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

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
    *,
    client: AuthenticatedClient | Client,
    body: RecoveryPointRequest,
) -> Response[KeyRecord | Problem]:
    """Record how far the holder of a key got.

     The holder of the lease records a named point of its work and a small payload
    (for example the id of a charge it made), replacing the one recorded before. The
    next acquisition of the key (a takeover with `recovered` true, or a claim after a
    release for a retry) receives the last recovery point in its answer, so that it
    resumes from there instead of starting over. Completing the key or recording a
    terminal failure drops it. A token that is not the key's current lease, or a key
    that is no longer pending, answers 409 lease_lost and records nothing; a payload
    over the daemon's limit (--max-recovery-point-bytes, 4096 by default) answers 413.
    A recovery point is not part of a batch.

    Args:
        body (RecoveryPointRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[KeyRecord | Problem]
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
    body: RecoveryPointRequest,
) -> KeyRecord | Problem | None:
    """Record how far the holder of a key got.

     The holder of the lease records a named point of its work and a small payload
    (for example the id of a charge it made), replacing the one recorded before. The
    next acquisition of the key (a takeover with `recovered` true, or a claim after a
    release for a retry) receives the last recovery point in its answer, so that it
    resumes from there instead of starting over. Completing the key or recording a
    terminal failure drops it. A token that is not the key's current lease, or a key
    that is no longer pending, answers 409 lease_lost and records nothing; a payload
    over the daemon's limit (--max-recovery-point-bytes, 4096 by default) answers 413.
    A recovery point is not part of a batch.

    Args:
        body (RecoveryPointRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        KeyRecord | Problem
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: RecoveryPointRequest,
) -> Response[KeyRecord | Problem]:
    """Record how far the holder of a key got.

     The holder of the lease records a named point of its work and a small payload
    (for example the id of a charge it made), replacing the one recorded before. The
    next acquisition of the key (a takeover with `recovered` true, or a claim after a
    release for a retry) receives the last recovery point in its answer, so that it
    resumes from there instead of starting over. Completing the key or recording a
    terminal failure drops it. A token that is not the key's current lease, or a key
    that is no longer pending, answers 409 lease_lost and records nothing; a payload
    over the daemon's limit (--max-recovery-point-bytes, 4096 by default) answers 413.
    A recovery point is not part of a batch.

    Args:
        body (RecoveryPointRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[KeyRecord | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    body: RecoveryPointRequest,
) -> KeyRecord | Problem | None:
    """Record how far the holder of a key got.

     The holder of the lease records a named point of its work and a small payload
    (for example the id of a charge it made), replacing the one recorded before. The
    next acquisition of the key (a takeover with `recovered` true, or a claim after a
    release for a retry) receives the last recovery point in its answer, so that it
    resumes from there instead of starting over. Completing the key or recording a
    terminal failure drops it. A token that is not the key's current lease, or a key
    that is no longer pending, answers 409 lease_lost and records nothing; a payload
    over the daemon's limit (--max-recovery-point-bytes, 4096 by default) answers 413.
    A recovery point is not part of a batch.

    Args:
        body (RecoveryPointRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        KeyRecord | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
