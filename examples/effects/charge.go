// Package effects shows how a service makes an effect happen exactly once with idemd:
// a charge written to PostgreSQL, fenced by the lease's attempt, reconciled when the
// lease was recovered from a holder whose lease ran out. docs/effects.md explains it;
// the tests prove it on a real PostgreSQL, and stress/ measures it under takeovers.
package effects

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	idem "github.com/idemd/idemd/clients/go"
)

// Schema is the service's own tables: the accounts it charges, the highest attempt that
// wrote for each key (the fence), and a ledger of the charges made.
const Schema = `
CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance_cents bigint NOT NULL);
CREATE TABLE IF NOT EXISTS fences   (key text PRIMARY KEY, attempt bigint NOT NULL);
CREATE TABLE IF NOT EXISTS ledger   (id bigserial PRIMARY KEY, key text NOT NULL, attempt bigint NOT NULL,
                                     account text NOT NULL, cents bigint NOT NULL);
`

// ErrFenced is a charge refused because a holder of the key with this attempt or a
// later one has already written: this holder's lease ran out and was taken over.
var ErrFenced = errors.New("effects: refused by the fence: a later holder of the key has written")

// DB is what a charge needs of the database: *pgx.Conn and *pgxpool.Pool both fit.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// fence moves the key's fence up to the lease's attempt, in the transaction of the
// effect, and refuses the transaction when the fence is already there or above it.
const fence = `
INSERT INTO fences AS f (key, attempt) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET attempt = EXCLUDED.attempt WHERE f.attempt < EXCLUDED.attempt`

// Charge debits account by cents under lease, once for the lease's key, whichever of
// the key's holders gets there first. In one transaction it moves the key's fence up to
// the lease's attempt, looks for a charge already made for the key, and makes it only
// if there is none. It reports false when an earlier holder had charged (one whose
// lease ran out before it stored its result), and ErrFenced when a later holder has
// written: this holder's lease was taken over, and it changes nothing.
//
// The look-up belongs in the transaction, after the fence: the fence's row lock orders
// it after any holder's charge that committed, so a stalled holder that wakes between
// a look-up and a charge cannot slip a second charge in.
func Charge(ctx context.Context, db DB, lease idem.Lease, account string, cents int64) (charged bool, err error) {
	err = inTx(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, fence, lease.Key, lease.Attempt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrFenced
		}
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM ledger WHERE key = $1)`, lease.Key).Scan(&charged); err != nil {
			return err
		}
		if charged {
			charged = false
			return nil // the fence moved up: the earlier holder can write no more
		}
		charged = true
		return debit(ctx, tx, lease, account, cents)
	})
	return charged && err == nil, err
}

// ChargeUnfenced is Charge without the fence and the look-up: what a service that
// trusts the lease alone does. A holder that wakes up after its lease was taken over
// charges again.
func ChargeUnfenced(ctx context.Context, db DB, lease idem.Lease, account string, cents int64) (charged bool, err error) {
	err = inTx(ctx, db, func(tx pgx.Tx) error { return debit(ctx, tx, lease, account, cents) })
	return err == nil, err
}

func debit(ctx context.Context, tx pgx.Tx, lease idem.Lease, account string, cents int64) error {
	if _, err := tx.Exec(ctx, `INSERT INTO ledger (key, attempt, account, cents) VALUES ($1, $2, $3, $4)`,
		lease.Key, lease.Attempt, account, cents); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, `UPDATE accounts SET balance_cents = balance_cents - $2 WHERE id = $1`, account, cents)
	if err == nil && tag.RowsAffected() != 1 {
		err = fmt.Errorf("effects: no account %q", account)
	}
	return err
}

func inTx(ctx context.Context, db DB, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	// After Commit, Rollback does nothing; before it, its error adds nothing to fn's.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// ChargeOnce is the whole pattern: it charges account by cents at most once for key
// through idemd, and exactly once in the database, with the fenced charge under the
// lease. The stored result answers every later call for key.
func ChargeOnce(ctx context.Context, client *idem.Client, db DB, key, account string, cents int64, opts ...idem.DoOptions) (idem.Result, error) {
	return client.Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
		lease, _ := idem.LeaseFrom(ctx)
		return ChargeWithLease(ctx, db, lease, account, cents)
	}, opts...)
}

// ChargeWithLease is the work ChargeOnce runs under the lease: the fenced charge, and
// its answer. A lease recovered from a holder whose lease ran out may find that holder's
// charge made: the answer then says so, and nothing is charged again.
func ChargeWithLease(ctx context.Context, db DB, lease idem.Lease, account string, cents int64) (idem.Response, error) {
	charged, err := Charge(ctx, db, lease, account, cents)
	switch {
	case err != nil:
		return idem.Response{}, err
	case !charged:
		return idem.Response{Status: 200, Body: []byte("charged by an earlier holder")}, nil
	}
	return idem.Response{Status: 201, Body: []byte("charged")}, nil
}
