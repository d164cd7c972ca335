package testrabbit_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemd/idemd/internal/testing/testrabbit"
)

func TestBrokerRedeliversAnUnacknowledgedMessage(t *testing.T) {
	b := testrabbit.New(t)
	conn, err := amqp.Dial(b.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish("", q.Name, false, false, amqp.Publishing{Body: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	first, ok, err := ch.Get(q.Name, false)
	if err != nil || !ok || first.Redelivered {
		t.Fatalf("first get: ok %v, redelivered %v, %v", ok, first.Redelivered, err)
	}
	if err := first.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	again, ok, err := ch.Get(q.Name, false)
	if err != nil || !ok || !again.Redelivered || string(again.Body) != "m" {
		t.Fatalf("after a requeue: ok %v, redelivered %v, body %q, %v", ok, again.Redelivered, again.Body, err)
	}
}
