// Command charger consumes the payments queue and charges each payment once: the
// message's idemd-key header names the request that published it, and the charge runs
// under idem.StepKey(key, "charge") through Client.Consume, which says whether to
// acknowledge, requeue or dead-letter the delivery.
//
// Settings come from the environment: IDEMD_URL, DATABASE_URL, AMQP_URL; IDEMD_SEAL_KEYS
// and IDEMD_SEAL_TENANT seal what it stores (see the package); CHARGER names
// this charger in the deliveries table; LEASE_MS is the lease on a charge (default
// 2000); PAUSE_MS is a pause inside each charge, before it writes, that widens the
// window in which a crash leaves a charge half done.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/examples/effects"
	"github.com/idemd/idemd/examples/payments"
)

// maxRequeueDelay bounds how long a delivery is held before it is requeued: a key
// another charger holds is retried at least this often.
const maxRequeueDelay = 500 * time.Millisecond

type charger struct {
	name   string
	client *idem.Client
	db     *pgxpool.Pool
	lease  time.Duration
	pause  time.Duration
}

type payment struct {
	Account string `json:"account"`
	Cents   int64  `json:"cents"`
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func setting(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("%s is not set", name)
	}
	return v, nil
}

func millis(name string, def time.Duration) time.Duration {
	n, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return def
	}
	return time.Duration(n) * time.Millisecond
}

func run() error {
	ctx := context.Background()
	var urls [3]string
	for i, name := range []string{"IDEMD_URL", "DATABASE_URL", "AMQP_URL"} {
		v, err := setting(name)
		if err != nil {
			return err
		}
		urls[i] = v
	}
	sealing, err := payments.Sealing()
	if err != nil {
		return err
	}
	client, err := idem.New(urls[0], sealing...)
	if err != nil {
		return err
	}
	db, err := pgxpool.New(ctx, urls[1])
	if err != nil {
		return err
	}
	defer db.Close()
	conn, err := amqp.Dial(urls[2])
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	if err := declare(ch); err != nil {
		return err
	}
	if err := ch.Qos(1, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(payments.Queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	c := &charger{
		name:   os.Getenv("CHARGER"),
		client: client,
		db:     db,
		lease:  millis("LEASE_MS", 2*time.Second),
		pause:  millis("PAUSE_MS", 0),
	}
	for d := range deliveries {
		if err := c.handle(ctx, d); err != nil {
			return err
		}
	}
	return errors.New("the broker closed the channel")
}

// declare makes the queues as the API does: the payments queue dead-letters to
// payments.dead.
func declare(ch *amqp.Channel) error {
	if _, err := ch.QueueDeclare(payments.DeadLetters, true, false, false, false, nil); err != nil {
		return err
	}
	_, err := ch.QueueDeclare(payments.Queue, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange":    "",
		"x-dead-letter-routing-key": payments.DeadLetters,
	})
	return err
}

// handle charges one delivery's payment and acknowledges the delivery as the verdict
// says. An error is the broker's: the charger exits, and its unacknowledged delivery
// goes back to the queue.
func (c *charger) handle(ctx context.Context, d amqp.Delivery) error {
	key, _ := d.Headers[idem.MessageHeader].(string)
	var p payment
	if key == "" || json.Unmarshal(d.Body, &p) != nil {
		// Not a message this charger can ever handle: to the dead letters, not dropped.
		return d.Nack(false, false)
	}
	step := idem.StepKey(key, payments.Step)
	if _, err := c.db.Exec(ctx, `INSERT INTO deliveries (key, charger, redelivered) VALUES ($1, $2, $3)`,
		step, c.name, d.Redelivered); err != nil {
		return d.Nack(false, true)
	}
	v := c.client.Consume(ctx, step, func(ctx context.Context) error {
		lease, _ := idem.LeaseFrom(ctx)
		time.Sleep(c.pause)
		// A recovered lease means a charger died holding the key: Charge's fence and its
		// look-up inside the same transaction make a second charge impossible.
		_, err := effects.Charge(ctx, c.db, lease, p.Account, p.Cents)
		return err
	}, idem.DoOptions{Lease: c.lease})
	switch v.Action {
	case idem.Ack:
		return d.Ack(false)
	case idem.DeadLetter:
		log.Printf("charger %s: %s to the dead letters: %v", c.name, step, v.Err)
		return d.Nack(false, false)
	default:
		time.Sleep(min(v.Delay, maxRequeueDelay))
		return d.Nack(false, true)
	}
}
