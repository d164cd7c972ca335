package idem

import (
	"context"
	"errors"
	"time"
)

// MessageHeader is the message header that carries an idemd key from the request that
// published a message to its consumers: the lease's Key, as LeaseFrom gives it inside
// a request handled by Middleware (or Do). The name and the value are the same in
// every idemd client.
const MessageHeader = "idemd-key"

// StepKey derives the key of one step of the work that key started: a consumer of a
// message whose MessageHeader is key runs step "charge" under StepKey(key, "charge").
// One request can so fan out to several steps, or several consumers, without their
// keys colliding with each other or with the request's own.
func StepKey(key, step string) string { return MessageKey("step", key, step) }

// Action is what a consumer does with the delivery of a message.
type Action int

const (
	// Ack removes the message: it was handled now or by an earlier delivery.
	Ack Action = iota + 1
	// Requeue leaves the message to be delivered again after the verdict's Delay: it
	// was not handled (another consumer holds its key, the work failed for now, or
	// idemd could not be asked). The message is never dropped.
	Requeue
	// DeadLetter removes the message, to the broker's dead-letter queue where it has
	// one: its work failed for good, and the failure is stored.
	DeadLetter
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Requeue:
		return "requeue"
	case DeadLetter:
		return "dead-letter"
	}
	return "unknown"
}

// Verdict is what Consume decided for one delivery.
type Verdict struct {
	Action Action
	// Delay is how long to wait before the message is delivered again, for Requeue.
	Delay time.Duration
	// Ran says that the function ran for this delivery.
	Ran bool
	// Err is why the message was not acknowledged, or nil.
	Err error
}

// requeueDelay is the Delay of a requeue whose cause does not say when to try again.
const requeueDelay = time.Second

// Consume runs fn at most once for a message's key and says what to do with the
// delivery, by the same rules in every idemd client:
//
//   - fn ran and its result is stored, or an earlier delivery ran it: Ack.
//   - Another consumer holds the key: Requeue, after the time its lease has left (or
//     wait for it with DoOptions.Wait); never drop the message.
//   - fn failed: the key is released and the message requeued.
//   - fn returned a PermanentError: the failure is stored and the message dead-lettered;
//     a later delivery of it is dead-lettered without running fn.
//   - idemd could not be asked, or did not store the outcome: Requeue. fn does not run
//     without a lease.
//   - The stored result, or the recovery point fn would start from, does not open
//     (WithSealing): Requeue, with the error matching ErrUnsealable; fn does not run.
//     The message is not acknowledged, so that a consumer whose ring holds the key
//     can take it, and the error shows that one is needed.
//
// fn finds its lease, with its attempt and whether it recovered the key from a
// consumer that died holding it, with LeaseFrom(ctx); a recovered lease means that
// the work may have been done in part, so fn must fence or reconcile its effects.
func (c *Client) Consume(ctx context.Context, key string, fn func(ctx context.Context) error, opts ...DoOptions) Verdict {
	var ran bool
	var fnErr error
	_, err := c.Do(ctx, key, "", func(ctx context.Context) (Response, error) {
		ran = true
		fnErr = fn(ctx)
		return Response{Status: 200}, fnErr
	}, opts...)
	return verdictOf(err, ran, fnErr)
}

func verdictOf(err error, ran bool, fnErr error) Verdict {
	v := Verdict{Ran: ran, Err: err}
	if err == nil {
		v.Action = Ack
		return v
	}
	if !ran {
		var p *Problem
		switch {
		case errors.Is(err, ErrFailed), errors.Is(err, ErrFingerprintMismatch):
			v.Action = DeadLetter
		case errors.Is(err, ErrInProgress) && errors.As(err, &p) && p.RetryAfter > 0:
			v.Action, v.Delay = Requeue, p.RetryAfter
		default:
			v.Action, v.Delay = Requeue, requeueDelay
		}
		return v
	}
	// fn ran. Do hands fn's own error back only when it finished the key as the error
	// asks (the failure stored, or the key released); anything else means the outcome
	// is not recorded, and the message must come back.
	var perm *PermanentError
	if err == fnErr && errors.As(err, &perm) {
		v.Action = DeadLetter
		return v
	}
	v.Action, v.Delay = Requeue, requeueDelay
	return v
}
