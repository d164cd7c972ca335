"""Keys derived from values, for queue consumers and decorated functions."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def message_key(*parts: str) -> str:
    """A key from a message's stable fields: for Kafka the topic, the partition and the
    offset; for RabbitMQ the queue and the publisher's message_id; for Celery the task
    name and ``self.request.id`` (which a redelivery keeps). Never the delivery count or
    the receive time.

    Each part is length-prefixed before hashing, so ``("ab", "c")`` and ``("a", "bc")``
    differ; the key is the same one the Go client's ``MessageKey`` makes.
    """
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return "msg-" + h.hexdigest()


#: The message header that carries an idemd key from the request that published a
#: message to its consumers: the lease's key, as :func:`idemd.current_lease` gives it
#: inside a request handled by the middleware (or ``run``). The same in every idemd client.
MESSAGE_HEADER = "idemd-key"


def step_key(key: str, step: str) -> str:
    """The key of one step of the work that ``key`` started: a consumer of a message whose
    :data:`MESSAGE_HEADER` is ``key`` runs step ``"charge"`` under
    ``step_key(key, "charge")``, so one request can fan out to several steps without
    their keys colliding. The Go client's ``StepKey`` gives the same key."""
    return message_key("step", key, step)


#: How a decorated function's key is made: a template formatted with the call's
#: arguments by name (``"charge:{order_id}"``), or a function of the same arguments.
KeySpec = str | Callable[..., str]


def key_for(
    spec: KeySpec, signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> str:
    if callable(spec):
        return spec(*args, **kwargs)
    bound = signature.bind(*args, **kwargs)
    bound.apply_defaults()
    return spec.format(**bound.arguments)
