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
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// fence moves the key's fence up to the lease's attempt, in the transaction of the
// effect, and refuses the transaction when the fence is already there or above it.
const fence = `
INSERT INTO fences AS f (key, attempt) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET attempt = EXCLUDED.attempt WHERE f.attempt < EXCLUDED.attempt`

// Charge debits account by cents under lease, once: in one transaction it moves the
// key's fence to the lease's attempt and writes the charge, so a holder whose lease
// was taken over and who wakes up after the new holder wrote gets ErrFenced and
// changes nothing.
func Charge(ctx context.Context, db DB, lease idem.Lease, account string, cents int64) error {
	return inTx(ctx, db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, fence, lease.Key, lease.Attempt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrFenced
		}
		return debit(ctx, tx, lease, account, cents)
	})
}

// ChargeUnfenced is Charge without the fence: what a service that trusts the lease
// alone does. A holder that wakes up after its lease was taken over charges again.
func ChargeUnfenced(ctx context.Context, db DB, lease idem.Lease, account string, cents int64) error {
	return inTx(ctx, db, func(tx pgx.Tx) error { return debit(ctx, tx, lease, account, cents) })
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

// Charged tells whether a charge for key has been written, by any holder: what a
// holder that recovered the key looks up before charging again.
func Charged(ctx context.Context, db DB, key string) (bool, error) {
	var attempt int64
	err := db.QueryRow(ctx, `SELECT attempt FROM fences WHERE key = $1`, key).Scan(&attempt)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func inTx(ctx context.Context, db DB, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// ChargeOnce is the whole pattern: it charges account by cents at most once for key,
// through idemd, and exactly once in the database. Under the lease it reconciles first
// when the lease was recovered (the previous holder may have charged and died before
// storing its result), then charges behind the fence. The stored result answers every
// later call for key.
func ChargeOnce(ctx context.Context, client *idem.Client, db DB, key, account string, cents int64, opts ...idem.DoOptions) (idem.Result, error) {
	return client.Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
		lease, _ := idem.LeaseFrom(ctx)
		return ChargeWithLease(ctx, db, lease, account, cents)
	}, opts...)
}

// ChargeWithLease is the work ChargeOnce runs under the lease: reconcile when the lease
// was recovered, then the fenced charge.
func ChargeWithLease(ctx context.Context, db DB, lease idem.Lease, account string, cents int64) (idem.Response, error) {
	if lease.Recovered {
		done, err := Charged(ctx, db, lease.Key)
		if err != nil {
			return idem.Response{}, err
		}
		if done {
			return idem.Response{Status: 200, Body: []byte("charged by an earlier holder")}, nil
		}
	}
	if err := Charge(ctx, db, lease, account, cents); err != nil {
		return idem.Response{}, err
	}
	return idem.Response{Status: 201, Body: []byte("charged")}, nil
}
