// Package boltstore keeps idemd's records in an embedded bbolt database, so that one
// idemd process runs durably with nothing else installed.
//
// One process owns the file, so leases and retention run on that process's clock.
// Every transition is one write transaction, committed and synced before it returns;
// concurrent transitions share commits through DB.Batch. Records past their retention
// count as absent at once and are removed later by a sweeper that walks an index
// ordered by expiry.
package boltstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/idemd/idemd/internal/engine"
)

// The buckets. records maps a record key to its encoded record; expiry holds one empty
// entry per record, keyed by the record's expiry time (milliseconds, big-endian) then
// its record key, so that a cursor walks records in the order they expire; meta holds
// the write probe of Ping.
var (
	bucketRecords = []byte("records")
	bucketExpiry  = []byte("expiry")
	bucketMeta    = []byte("meta")
)

// Options tune a Store. The zero value is the production setting.
type Options struct {
	// LockTimeout bounds how long Open waits for another process to let go of the file.
	LockTimeout time.Duration
	// BatchDelay is how long a transition waits for others to share its commit (one
	// fsync). bbolt's default of 10 ms caps 32 clients at about 1,200 cycles/s here;
	// 1 ms reaches about 5,000 and adds at most 1 ms to a transition.
	BatchDelay time.Duration
	// SweepInterval is how often expired records are removed; SweepBatch bounds the
	// deletions of one sweeping transaction.
	SweepInterval time.Duration
	SweepBatch    int
	// Now is the store's clock.
	Now func() time.Time
}

// Store is the bbolt-backed engine.Store.
type Store struct {
	db      *bolt.DB
	now     func() time.Time
	opts    Options
	watches watchers
	counts  stateCounts
	metrics *collector

	stop     chan struct{}
	stopOnce sync.Once
	swept    sync.WaitGroup
}

// Open opens or creates the database at path, creating its directory, and starts the
// sweeper. A database held by another process is reported after opts.LockTimeout.
func Open(path string, opts Options) (*Store, error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 3 * time.Second
	}
	if opts.BatchDelay <= 0 {
		opts.BatchDelay = time.Millisecond
	}
	if opts.SweepInterval <= 0 {
		opts.SweepInterval = time.Second
	}
	if opts.SweepBatch <= 0 {
		opts.SweepBatch = 500
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dir, err)
	}
	if err := checkWritable(dir); err != nil {
		return nil, err
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("database %s is locked by another process (is another idemd running on it?)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	db.MaxBatchDelay = opts.BatchDelay
	s := &Store{db: db, now: opts.Now, opts: opts, stop: make(chan struct{})}
	s.watches.init()
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRecords, bucketExpiry, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return s.counts.load(tx)
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	s.metrics = newCollector(s)
	s.swept.Add(1)
	go s.sweepLoop()
	return s, nil
}

// checkWritable fails early, with the directory named, when idemd could not write
// there; bbolt's own error would come later and say less.
func checkWritable(dir string) error {
	f, err := os.CreateTemp(dir, ".idemd-probe-*")
	if err != nil {
		return fmt.Errorf("data directory %s is not writable: %w", dir, err)
	}
	name := f.Name()
	_ = f.Close()
	return os.Remove(name)
}

// recordKey is a record's key in the records bucket: the tenant's length and name, then
// the SHA-256 of the client's key, so that two tenants never share a key.
func recordKey(id engine.ID) []byte {
	sum := sha256.Sum256([]byte(id.Key))
	k := make([]byte, 0, 1+len(id.Tenant)+len(sum))
	k = append(k, byte(len(id.Tenant)))
	k = append(k, id.Tenant...)
	return append(k, sum[:]...)
}

func expiryKey(at int64, rk []byte) []byte {
	k := make([]byte, 8, 8+len(rk))
	binary.BigEndian.PutUint64(k, uint64(at))
	return append(k, rk...)
}

// stored is a record as it is kept in the database. Times are Unix milliseconds, as in
// the Redis store, so that both stores round alike.
type stored struct {
	Key         string              `json:"k"`
	Tenant      string              `json:"t"`
	State       engine.State        `json:"st"`
	Fingerprint string              `json:"fp,omitempty"`
	Owner       string              `json:"ow,omitempty"`
	Secret      string              `json:"cs,omitempty"`
	Attempt     int64               `json:"at"`
	Token       string              `json:"tok"`
	LeaseExpiry int64               `json:"lx"`
	Recovered   bool                `json:"rec,omitempty"`
	Created     int64               `json:"ca"`
	Updated     int64               `json:"ua"`
	Expires     int64               `json:"xa"`
	Status      int                 `json:"rs,omitempty"`
	Headers     map[string][]string `json:"rh,omitempty"`
	Body        []byte              `json:"rb,omitempty"`
	HasResponse bool                `json:"r,omitempty"`
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// record converts to the engine's view; withResponse mirrors the Redis store, which
// returns the response only on a replay and a lookup.
func (r *stored) record(withResponse bool) engine.Record {
	rec := engine.Record{
		ID:          engine.ID{Tenant: r.Tenant, Key: r.Key},
		State:       r.State,
		Fingerprint: r.Fingerprint,
		Owner:       r.Owner,
		Attempt:     r.Attempt,
		LeaseToken:  r.Token,
		Recovered:   r.Recovered,
		CreatedAt:   msTime(r.Created),
		UpdatedAt:   msTime(r.Updated),
		ExpiresAt:   msTime(r.Expires),
	}
	if r.State == engine.StatePending {
		rec.LeaseExpiresAt = msTime(r.LeaseExpiry)
	}
	if withResponse && r.HasResponse {
		rec.Response = &engine.Response{Status: r.Status, Headers: r.Headers, Body: r.Body}
	}
	return rec
}

func (r *stored) setResponse(resp *engine.Response) {
	if resp == nil {
		return
	}
	r.HasResponse = true
	r.Status, r.Headers, r.Body = resp.Status, resp.Headers, resp.Body
}

// txn is one transition inside a write transaction. It may run more than once (Batch
// retries a failed batch one function at a time), so it only records its effects in
// its own fields, which are reset at each run and read after the commit.
type txn struct {
	tx  *bolt.Tx
	now int64
	// from and to are the states before and after, for the record counts; notify says
	// whether waiters on the record are woken after the commit.
	from, to engine.State
	notify   bool
	// answer is the transition's refusal, if any.
	answer error
}

// get reads the live record; an expired one counts as absent and is removed.
func (t *txn) get(rk []byte) (*stored, error) {
	r, err := readRecord(t.tx, rk)
	if err != nil || r == nil {
		return nil, err
	}
	if t.now > r.Expires {
		return nil, t.remove(rk, r)
	}
	return r, nil
}

// put writes the record and moves its expiry entry.
func (t *txn) put(rk []byte, r *stored, oldExpires int64) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketRecords).Put(rk, v); err != nil {
		return err
	}
	exp := t.tx.Bucket(bucketExpiry)
	if oldExpires != 0 && oldExpires != r.Expires {
		if err := exp.Delete(expiryKey(oldExpires, rk)); err != nil {
			return err
		}
	}
	return exp.Put(expiryKey(r.Expires, rk), nil)
}

// remove deletes a record and its expiry entry; the counts learn of it after commit.
func (t *txn) remove(rk []byte, r *stored) error {
	if err := t.tx.Bucket(bucketRecords).Delete(rk); err != nil {
		return err
	}
	if t.from == "" {
		t.from = r.State
	}
	return t.tx.Bucket(bucketExpiry).Delete(expiryKey(r.Expires, rk))
}

// update runs fn as one transition in a shared, synced commit, then updates the counts
// and wakes waiters. fn returns an answerErr for an answer such as not found: that is
// not a failure, and the transaction still commits (it may have removed an expired
// record on the way).
func (s *Store) update(ctx context.Context, id engine.ID, fn func(t *txn, rk []byte) error) error {
	if err := ctx.Err(); err != nil {
		return engine.Unavailable(err)
	}
	rk := recordKey(id)
	var t txn
	err := s.db.Batch(func(tx *bolt.Tx) error {
		t = txn{tx: tx, now: s.now().UnixMilli()}
		err := fn(&t, rk)
		var answer answerErr
		if errors.As(err, &answer) {
			t.answer = answer.err
			return nil
		}
		return err
	})
	if err != nil {
		return engine.Unavailable(err)
	}
	s.counts.move(t.from, t.to)
	if t.notify {
		s.watches.signal(string(rk))
	}
	return t.answer
}

// answerErr carries a transition's answer (not found, lease lost, ...) out of fn.
type answerErr struct{ err error }

func (a answerErr) Error() string { return a.err.Error() }

func ms(d time.Duration) int64 { return d.Milliseconds() }

// Claim implements engine.Store. A claim that changes nothing (a replay, in progress,
// a mismatch, a resent or re-entrant claim) is answered from a read transaction, so
// duplicates cost no commit; the others run as a write transaction.
func (s *Store) Claim(ctx context.Context, c engine.Claim) (engine.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return engine.ClaimResult{}, engine.Unavailable(err)
	}
	var d claimDecision
	err := s.db.View(func(tx *bolt.Tx) error {
		now := s.now().UnixMilli()
		r, err := readLive(tx, recordKey(c.ID), now)
		if err != nil || r == nil {
			return err
		}
		d = decideClaim(r, c, now)
		return nil
	})
	if err != nil {
		return engine.ClaimResult{}, engine.Unavailable(err)
	}
	if !d.decided || d.write != nil {
		err = s.update(ctx, c.ID, func(t *txn, rk []byte) error {
			r, err := t.get(rk)
			if err != nil {
				return err
			}
			d = decideClaim(r, c, t.now)
			if d.write == nil {
				return nil
			}
			old := int64(0)
			if r != nil {
				old, t.from = r.Expires, r.State
			}
			t.to = engine.StatePending
			return t.put(rk, d.write, old)
		})
		if err != nil {
			return engine.ClaimResult{}, err
		}
	}
	if errors.Is(d.refusal, engine.ErrFingerprintMismatch) {
		return engine.ClaimResult{}, d.refusal
	}
	return d.res, d.refusal
}

// claimDecision is what a claim does to a record: its answer, and the record to
// write when it acquires a free key (nil when the claim changes nothing).
type claimDecision struct {
	decided bool
	res     engine.ClaimResult
	refusal error
	write   *stored
}

// decideClaim runs the decisions of lua/claim.lua on the live record r (nil when
// absent) at now. It does not modify r.
func decideClaim(r *stored, c engine.Claim, now int64) claimDecision {
	lease := ms(c.Lease)
	acquired := func(w *stored) claimDecision {
		return claimDecision{decided: true, res: engine.ClaimResult{Outcome: engine.OutcomeAcquired, Record: w.record(false)}}
	}
	if r == nil {
		w := &stored{Key: c.ID.Key, Tenant: c.ID.Tenant, State: engine.StatePending, Fingerprint: c.Fingerprint,
			Owner: c.Owner, Secret: c.Secret, Attempt: 1, Token: c.Token, LeaseExpiry: now + lease,
			Created: now, Updated: now, Expires: now + max(ms(c.Retention), lease)}
		d := acquired(w)
		d.write = w
		return d
	}
	switch {
	case r.State == engine.StatePending && r.Token == c.Token:
		// The same claim run again finds its own token and answers as before.
		return acquired(r)
	case r.Fingerprint != c.Fingerprint:
		// Fingerprints compare exactly: no fingerprint is one of its own, not a wildcard.
		return claimDecision{decided: true, refusal: engine.ErrFingerprintMismatch}
	case r.State == engine.StateCompleted:
		return claimDecision{decided: true, res: engine.ClaimResult{Outcome: engine.OutcomeCompleted, Record: r.record(true)}}
	case r.State == engine.StateFailed:
		return claimDecision{decided: true, res: engine.ClaimResult{Outcome: engine.OutcomeFailed, Record: r.record(true)}}
	case r.State == engine.StatePending && r.LeaseExpiry > now:
		if c.Secret != "" && c.Secret == r.Secret {
			return acquired(r)
		}
		return claimDecision{decided: true, res: engine.ClaimResult{Record: r.record(false)},
			refusal: &engine.InProgressError{RetryAfter: time.Duration(r.LeaseExpiry-now) * time.Millisecond}}
	}
	// Released for a retry, or pending under an expired lease: take it.
	w := *r
	w.Recovered = r.State == engine.StatePending
	w.State, w.Owner, w.Secret, w.Attempt, w.Token = engine.StatePending, c.Owner, c.Secret, r.Attempt+1, c.Token
	w.LeaseExpiry, w.Updated = now+lease, now
	w.Expires = max(r.Expires, now+max(ms(c.Retention), lease))
	d := acquired(&w)
	d.write = &w
	return d
}

// readLive reads a record in any transaction; an expired one is absent.
func readLive(tx *bolt.Tx, rk []byte, now int64) (*stored, error) {
	r, err := readRecord(tx, rk)
	if err != nil || r == nil || now > r.Expires {
		return nil, err
	}
	return r, nil
}

// readRecord decodes a stored record, expired or not; nil when there is none.
func readRecord(tx *bolt.Tx, rk []byte) (*stored, error) {
	v := tx.Bucket(bucketRecords).Get(rk)
	if v == nil {
		return nil, nil
	}
	var r stored
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("record is corrupt: %w", err)
	}
	return &r, nil
}

// holder reads the record a transition by token works on: absent is not found, another
// token is lease lost.
func (t *txn) holder(rk []byte, token string) (*stored, error) {
	r, err := t.get(rk)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, answerErr{engine.ErrNotFound}
	}
	if r.Token != token {
		return nil, answerErr{engine.ErrLeaseLost}
	}
	return r, nil
}

// Complete implements engine.Store.
func (s *Store) Complete(ctx context.Context, c engine.Completion) (engine.Record, error) {
	var rec engine.Record
	err := s.update(ctx, c.ID, func(t *txn, rk []byte) error {
		r, err := t.holder(rk, c.LeaseToken)
		if err != nil {
			return err
		}
		switch r.State {
		case engine.StateCompleted:
			rec = r.record(false)
			return nil
		case engine.StatePending:
		default:
			return answerErr{engine.ErrLeaseLost}
		}
		old := r.Expires
		t.from, t.to, t.notify = r.State, engine.StateCompleted, true
		r.State, r.Updated, r.Expires = engine.StateCompleted, t.now, t.now+ms(c.Retention)
		r.setResponse(&c.Response)
		rec = r.record(false)
		return t.put(rk, r, old)
	})
	return rec, err
}

// Release implements engine.Store.
func (s *Store) Release(ctx context.Context, rel engine.Release) (engine.Record, error) {
	var rec engine.Record
	err := s.update(ctx, rel.ID, func(t *txn, rk []byte) error {
		r, err := t.holder(rk, rel.LeaseToken)
		if err != nil {
			return err
		}
		if (r.State == engine.StateReleased && rel.Mode == engine.ReleaseRetry) ||
			(r.State == engine.StateFailed && rel.Mode == engine.ReleaseFail) {
			rec = r.record(false)
			return nil
		}
		if r.State != engine.StatePending {
			return answerErr{engine.ErrLeaseLost}
		}
		old := r.Expires
		r.Updated, r.Expires = t.now, t.now+ms(rel.Retention)
		if rel.Mode == engine.ReleaseRetry {
			r.State, r.LeaseExpiry = engine.StateReleased, 0
		} else {
			r.State = engine.StateFailed
			r.setResponse(rel.Response)
		}
		t.from, t.to, t.notify = engine.StatePending, r.State, true
		rec = r.record(false)
		return t.put(rk, r, old)
	})
	return rec, err
}

// Extend implements engine.Store.
func (s *Store) Extend(ctx context.Context, e engine.Extension) (engine.Record, error) {
	var rec engine.Record
	err := s.update(ctx, e.ID, func(t *txn, rk []byte) error {
		r, err := t.holder(rk, e.LeaseToken)
		if err != nil {
			return err
		}
		if r.State != engine.StatePending {
			return answerErr{engine.ErrLeaseLost}
		}
		old := r.Expires
		r.LeaseExpiry = t.now + ms(e.Lease)
		r.Expires = max(r.Expires, r.LeaseExpiry)
		rec = r.record(false)
		return t.put(rk, r, old)
	})
	return rec, err
}

// Lookup implements engine.Store. It reads without writing, so an expired record is
// reported absent and left for the sweeper.
func (s *Store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	if err := ctx.Err(); err != nil {
		return engine.Record{}, engine.Unavailable(err)
	}
	var rec engine.Record
	err := s.db.View(func(tx *bolt.Tx) error {
		r, err := readLive(tx, recordKey(id), s.now().UnixMilli())
		if err != nil {
			return err
		}
		if r == nil {
			return answerErr{engine.ErrNotFound}
		}
		rec = r.record(true)
		return nil
	})
	var answer answerErr
	if errors.As(err, &answer) {
		return engine.Record{}, answer.err
	}
	if err != nil {
		return engine.Record{}, engine.Unavailable(err)
	}
	return rec, nil
}

// Purge implements engine.Store.
func (s *Store) Purge(ctx context.Context, id engine.ID) error {
	return s.update(ctx, id, func(t *txn, rk []byte) error {
		r, err := t.get(rk)
		if err != nil {
			return err
		}
		if r == nil {
			return answerErr{engine.ErrNotFound}
		}
		t.notify = true
		return t.remove(rk, r)
	})
}

// Watch implements engine.Store: waiters live in this process, as does every writer.
func (s *Store) Watch(ctx context.Context, id engine.ID) (engine.Watch, error) {
	if err := ctx.Err(); err != nil {
		return nil, engine.Unavailable(err)
	}
	return s.watches.add(string(recordKey(id))), nil
}

// Ping implements engine.Store with a small synced write, so that a database that
// cannot be written (a full or read-only disk) reports unavailable.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return engine.Unavailable(err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], uint64(s.now().UnixMilli()))
		return tx.Bucket(bucketMeta).Put([]byte("ping"), b[:])
	})
	if err != nil {
		return engine.Unavailable(err)
	}
	return nil
}

// Close stops the sweeper and closes the database.
func (s *Store) Close() error {
	s.stopOnce.Do(func() { close(s.stop) })
	s.swept.Wait()
	return s.db.Close()
}
