"""The payments example's Python charger: it consumes the payments queue and charges each
payment once, as the Go charger does. The message's idemd-key header names the request
that published it, and the charge runs under ``idemd.step_key(key, "charge")`` through
``Client.consume``, whose verdict says whether to acknowledge, requeue or dead-letter the
delivery.

Settings come from the environment: IDEMD_URL, DATABASE_URL, AMQP_URL; IDEMD_SEAL_KEYS and
IDEMD_SEAL_TENANT seal what it stores, as the other programs do; CHARGER names this
charger in the deliveries table; LEASE_MS is the lease on a charge (default 2000);
PAUSE_MS is a pause inside each charge, before it writes. It needs the Python client,
pika and psycopg (the client's dev requirements), and the fenced charge of
clients/python/examples/effects.py.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pika
import psycopg
from pika.adapters.blocking_connection import BlockingChannel
from pika.spec import Basic, BasicProperties

import idemd

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python" / "examples"))
from effects import charge

QUEUE, DEAD_LETTERS, STEP = "payments", "payments.dead", "charge"
#: How long a delivery is held at most before it is requeued, in seconds.
MAX_REQUEUE_DELAY = 0.5


def main() -> None:
    name = os.environ.get("CHARGER", "python")
    lease = int(os.environ.get("LEASE_MS", "2000")) / 1000
    pause = int(os.environ.get("PAUSE_MS", "0")) / 1000
    keys = os.environ.get("IDEMD_SEAL_KEYS")
    sealing = (
        idemd.Sealing(os.environ.get("IDEMD_SEAL_TENANT") or "payments", idemd.KeyRing.parse(keys))
        if keys
        else None
    )
    client = idemd.Client(os.environ["IDEMD_URL"], sealing=sealing)
    db = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
    connection = pika.BlockingConnection(pika.URLParameters(os.environ["AMQP_URL"]))
    channel = connection.channel()
    channel.queue_declare(DEAD_LETTERS, durable=True)
    channel.queue_declare(
        QUEUE,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": DEAD_LETTERS},
    )
    channel.basic_qos(prefetch_count=1)

    def handle(ch: BlockingChannel, method: Basic.Deliver, props: BasicProperties, body: bytes) -> None:
        tag = method.delivery_tag
        key = (props.headers or {}).get(idemd.MESSAGE_HEADER)
        try:
            payment = json.loads(body)
            account, cents = str(payment["account"]), int(payment["cents"])
        except (ValueError, KeyError, TypeError):
            key = None
        if not isinstance(key, str) or not key:
            ch.basic_nack(tag, requeue=False)  # never handled: to the dead letters, not dropped
            return
        step = idemd.step_key(key, STEP)
        db.execute(
            "INSERT INTO deliveries (key, charger, redelivered) VALUES (%s, %s, %s)",
            (step, name, bool(method.redelivered)),
        )

        def work(held: idemd.Lease) -> None:
            time.sleep(pause)
            # A recovered lease means a charger died holding the key: the fence and the
            # look-up inside charge's transaction make a second charge impossible.
            charge(db, held, account, cents)

        verdict = client.consume(step, work, lease=lease)
        if verdict.action == "ack":
            ch.basic_ack(tag)
        elif verdict.action == "dead-letter":
            print(f"charger {name}: {step} to the dead letters: {verdict.error}", file=sys.stderr)
            ch.basic_nack(tag, requeue=False)
        else:
            time.sleep(min(verdict.delay, MAX_REQUEUE_DELAY))
            ch.basic_nack(tag, requeue=True)

    channel.basic_consume(QUEUE, handle)
    channel.start_consuming()


if __name__ == "__main__":
    main()
