from http import HTTPStatus
from typing import Any

import httpx

from ...client import AuthenticatedClient, Client
from ...models.claim_acquired import ClaimAcquired
from ...models.claim_finished import ClaimFinished
from ...models.claim_request import ClaimRequest
from ...models.problem import Problem
from ...types import Response


def _get_kwargs(
    *,
    body: ClaimRequest,
) -> dict[str, Any]:
    headers: dict[str, Any] = {}

    _kwargs: dict[str, Any] = {
        "method": "post",
        "url": "/v1/claim",
    }

    _kwargs["json"] = body.to_dict()

    headers["Content-Type"] = "application/json"

    _kwargs["headers"] = headers
    return _kwargs


def _parse_response(
    *, client: AuthenticatedClient | Client, response: httpx.Response
) -> ClaimAcquired | ClaimFinished | Problem:
    if response.status_code == 200:

        def _parse_response_200(data: object) -> ClaimAcquired | ClaimFinished:
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                componentsschemas_claim_answer_type_0 = ClaimAcquired.from_dict(data)

                return componentsschemas_claim_answer_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            componentsschemas_claim_answer_type_1 = ClaimFinished.from_dict(data)

            return componentsschemas_claim_answer_type_1

        response_200 = _parse_response_200(response.json())

        return response_200

    if response.status_code == 201:

        def _parse_response_201(data: object) -> ClaimAcquired | ClaimFinished:
            try:
                if not isinstance(data, dict):
                    raise TypeError()
                componentsschemas_claim_answer_type_0 = ClaimAcquired.from_dict(data)

                return componentsschemas_claim_answer_type_0
            except (TypeError, ValueError, AttributeError, KeyError):
                pass
            if not isinstance(data, dict):
                raise TypeError()
            componentsschemas_claim_answer_type_1 = ClaimFinished.from_dict(data)

            return componentsschemas_claim_answer_type_1

        response_201 = _parse_response_201(response.json())

        return response_201

    if response.status_code == 400:
        response_400 = Problem.from_dict(response.json())

        return response_400

    if response.status_code == 401:
        response_401 = Problem.from_dict(response.json())

        return response_401

    if response.status_code == 403:
        response_403 = Problem.from_dict(response.json())

        return response_403

    if response.status_code == 409:
        response_409 = Problem.from_dict(response.json())

        return response_409

    if response.status_code == 413:
        response_413 = Problem.from_dict(response.json())

        return response_413

    if response.status_code == 415:
        response_415 = Problem.from_dict(response.json())

        return response_415

    if response.status_code == 422:
        response_422 = Problem.from_dict(response.json())

        return response_422

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
) -> Response[ClaimAcquired | ClaimFinished | Problem]:
    return Response(
        status_code=HTTPStatus(response.status_code),
        content=response.content,
        headers=response.headers,
        parsed=_parse_response(client=client, response=response),
    )


def sync_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: ClaimRequest,
) -> Response[ClaimAcquired | ClaimFinished | Problem]:
    """Claim an idempotency key.

     Acquires a lease on the key (201), replays the stored result of a finished key (200),
    or reports that another caller holds it (409 in_progress). With `wait_ms` the call
    waits for the holder to finish instead of answering 409 at once.

    Args:
        body (ClaimRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ClaimAcquired | ClaimFinished | Problem]
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
    body: ClaimRequest,
) -> ClaimAcquired | ClaimFinished | Problem | None:
    """Claim an idempotency key.

     Acquires a lease on the key (201), replays the stored result of a finished key (200),
    or reports that another caller holds it (409 in_progress). With `wait_ms` the call
    waits for the holder to finish instead of answering 409 at once.

    Args:
        body (ClaimRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ClaimAcquired | ClaimFinished | Problem
    """

    return sync_detailed(
        client=client,
        body=body,
    ).parsed


async def asyncio_detailed(
    *,
    client: AuthenticatedClient | Client,
    body: ClaimRequest,
) -> Response[ClaimAcquired | ClaimFinished | Problem]:
    """Claim an idempotency key.

     Acquires a lease on the key (201), replays the stored result of a finished key (200),
    or reports that another caller holds it (409 in_progress). With `wait_ms` the call
    waits for the holder to finish instead of answering 409 at once.

    Args:
        body (ClaimRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        Response[ClaimAcquired | ClaimFinished | Problem]
    """

    kwargs = _get_kwargs(
        body=body,
    )

    response = await client.get_async_httpx_client().request(**kwargs)

    return _build_response(client=client, response=response)


async def asyncio(
    *,
    client: AuthenticatedClient | Client,
    body: ClaimRequest,
) -> ClaimAcquired | ClaimFinished | Problem | None:
    """Claim an idempotency key.

     Acquires a lease on the key (201), replays the stored result of a finished key (200),
    or reports that another caller holds it (409 in_progress). With `wait_ms` the call
    waits for the holder to finish instead of answering 409 at once.

    Args:
        body (ClaimRequest):

    Raises:
        errors.UnexpectedStatus: If the server returns an undocumented status code and Client.raise_on_unexpected_status is True.
        httpx.TimeoutException: If the request takes longer than Client.timeout.

    Returns:
        ClaimAcquired | ClaimFinished | Problem
    """

    return (
        await asyncio_detailed(
            client=client,
            body=body,
        )
    ).parsed
