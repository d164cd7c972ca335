// Package payments is an end-to-end system built on idemd: an API (api/, TypeScript on
// Express) takes POST /payments with an Idempotency-Key, records the payment and
// publishes a message carrying the request's idemd key; chargers in Go (charger/) and
// Python (charger.py) consume the messages from RabbitMQ and charge PostgreSQL once per
// payment, with the fenced charge of examples/effects, acknowledging each delivery by
// the table in docs/queues.md; a completer (completer/, Go) finishes the requests whose
// API process died after recording a payment and before publishing it, when their
// callers never retry. payments_test.go runs it all with retrying callers and chargers
// killed mid-message, and with an API killed mid-request and callers that never retry.
//
// Every program seals what it stores in idemd when IDEMD_SEAL_KEYS holds a key ring
// (docs/sealing.md), under the tenant name IDEMD_SEAL_TENANT (default "payments"): the
// API (TypeScript) seals a request's answer and recovery point, the completer (Go) opens
// that point and seals the answer it stores, and the API replays what the completer
// stored.
package payments

import (
	"os"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/examples/effects"
)

// Sealing is the client option that seals with the ring of IDEMD_SEAL_KEYS, or none when
// it is not set.
func Sealing() ([]idem.Option, error) {
	keys := os.Getenv("IDEMD_SEAL_KEYS")
	if keys == "" {
		return nil, nil
	}
	ring, err := idem.ParseKeyRing(keys)
	if err != nil {
		return nil, err
	}
	tenant := os.Getenv("IDEMD_SEAL_TENANT")
	if tenant == "" {
		tenant = "payments"
	}
	return []idem.Option{idem.WithSealing(tenant, ring)}, nil
}

// Queue is the queue of payments to charge; DeadLetters takes the ones whose charge
// failed for good.
const (
	Queue       = "payments"
	DeadLetters = "payments.dead"
	// Step is the step of a payment's work that the chargers run.
	Step = "charge"
	// KeyPrefix begins every idemd key of the API's POST /payments (the middleware's
	// key prefix), so that the completer finds that route's abandoned keys.
	KeyPrefix = "payments/"
	// PointRecorded is the recovery point the API records once the payment is in
	// the database, before it publishes the message.
	PointRecorded = "recorded"
)

// Schema is the system's tables: effects.Schema (accounts, fences, the ledger), the
// payments the API accepted, and every delivery a charger received.
const Schema = effects.Schema + `
CREATE TABLE IF NOT EXISTS payments   (key text PRIMARY KEY, account text NOT NULL, cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS deliveries (id bigserial PRIMARY KEY, key text NOT NULL, charger text NOT NULL,
                                       redelivered boolean NOT NULL);
`
