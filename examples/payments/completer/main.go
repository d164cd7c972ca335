// Command completer finishes the payments whose API process died mid-request and
// whose callers never came back: it reads idemd's abandoned-keys feed under the API's
// key prefix, takes each key over (idem.Completer), and finishes the request from the
// recovery point the API recorded. A payment recorded in PostgreSQL ("recorded") is
// published to the payments queue, as the API would have done, and the key completes
// with the API's own answer, so that a caller who does come back gets it. A payment
// never recorded is stored as failed: nothing was done, and the caller must send it
// again with a new key.
//
// Settings come from the environment: IDEMD_URL, DATABASE_URL, AMQP_URL; IDEMD_SEAL_KEYS
// and IDEMD_SEAL_TENANT seal what it stores and open what the API sealed (see the
// package); KEY_PREFIX is
// the API's middleware key prefix (default "payments/"); POLL_MS is the wait between
// passes that found nothing (default 5000); LEASE_MS the lease of each key's work
// (default 10000).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/examples/payments"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func setting(name, def string) (string, error) {
	if v := os.Getenv(name); v != "" {
		return v, nil
	}
	if def == "" {
		return "", fmt.Errorf("%s is not set", name)
	}
	return def, nil
}

func millis(name string, def time.Duration) time.Duration {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return time.Duration(n) * time.Millisecond
	}
	return def
}

func run(ctx context.Context) error {
	var s [4]string
	for i, name := range []string{"IDEMD_URL", "DATABASE_URL", "AMQP_URL", "KEY_PREFIX"} {
		v, err := setting(name, map[string]string{"KEY_PREFIX": payments.KeyPrefix}[name])
		if err != nil {
			return err
		}
		s[i] = v
	}
	sealing, err := payments.Sealing()
	if err != nil {
		return err
	}
	client, err := idem.New(s[0], sealing...)
	if err != nil {
		return err
	}
	db, err := pgxpool.New(ctx, s[1])
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := amqp.Dial(s[2])
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := ch.Confirm(false); err != nil {
		return err
	}
	f := &finisher{db: db, ch: ch}
	completer, err := idem.NewCompleter(client, idem.CompleterOptions{
		Prefix:       s[3],
		Lease:        millis("LEASE_MS", 10*time.Second),
		PollInterval: millis("POLL_MS", 5*time.Second),
		Handler:      f.finish,
		OnError: func(key string, err error) {
			log.Printf("completer: %q: %v", key, err)
		},
	})
	if err != nil {
		return err
	}
	return completer.Run(ctx)
}

// finisher finishes one abandoned payment request.
type finisher struct {
	db *pgxpool.Pool
	ch *amqp.Channel
}

// notRecorded is the answer stored for a request that died before it recorded its
// payment: nothing happened, and the same key will never make it happen.
var notRecorded = idem.Response{
	Status: 409,
	Header: map[string][]string{"Content-Type": {"application/problem+json"}},
	Body: []byte(`{"title":"Payment not made","status":409,"detail":"the request ended before the payment was recorded; ` +
		`send it again with a new Idempotency-Key"}`),
}

func (f *finisher) finish(ctx context.Context) (idem.Response, error) {
	lease, _ := idem.LeaseFrom(ctx)
	// The recovery point says how far the API got; the database is the truth, since
	// the API may have died between its insert and its checkpoint.
	if p := lease.RecoveryPoint; p == nil || p.Name != payments.PointRecorded {
		log.Printf("completer: %q has no recovery point %q (%v): looking the payment up", lease.Key, payments.PointRecorded, p)
	}
	var pay struct {
		Account string `json:"account"`
		Cents   int64  `json:"cents"`
	}
	err := f.db.QueryRow(ctx, `SELECT account, cents FROM payments WHERE key = $1`, lease.Key).Scan(&pay.Account, &pay.Cents)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Response{}, idem.Permanent(errors.New("the payment was never recorded"), notRecorded)
	}
	if err != nil {
		return idem.Response{}, err
	}
	body, _ := json.Marshal(pay)
	// The same message the API publishes: the chargers deduplicate by the key, so a
	// message the API did publish before it died is charged once all the same.
	confirm, err := f.ch.PublishWithDeferredConfirmWithContext(ctx, "", payments.Queue, false, false, amqp.Publishing{
		DeliveryMode: amqp.Persistent,
		MessageId:    lease.Key,
		Headers:      amqp.Table{idem.MessageHeader: lease.Key},
		ContentType:  "application/json",
		Body:         body,
	})
	if err != nil {
		return idem.Response{}, err
	}
	if ok, err := confirm.WaitContext(ctx); err != nil || !ok {
		return idem.Response{}, fmt.Errorf("the broker did not take the message (%w)", err)
	}
	answer, _ := json.Marshal(map[string]string{"payment": lease.Key})
	return idem.Response{Status: 202, Header: map[string][]string{"Content-Type": {"application/json; charset=utf-8"}}, Body: answer}, nil
}
