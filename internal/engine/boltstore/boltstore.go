// Package boltstore keeps idemd's records in an embedded bbolt database, so that one
// idemd process runs durably with nothing else installed.
//
// One process owns the file, so leases and retention run on that process's clock.
// Every transition is committed and synced before it returns. One loop owns the writes
// and commits groups without a timer: a transition that arrives while no commit runs is
// committed at once, and those that arrive during a commit's fsync share the next one.
// Records past their retention count as absent at once and are removed later by a
// sweeper that walks an index ordered by expiry.
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
	// SweepInterval is how often expired records are removed; SweepBatch bounds the
	// deletions of one sweeping transaction.
	SweepInterval time.Duration
	SweepBatch    int
	// Now is the store's clock.
	Now func() time.Time
	// MaxSize is the size the store guard measures the database against (Fill); zero
	// measures it against the disk's free space.
	MaxSize int64
	// NoSync commits without waiting for the disk: a crash may lose or tear what the
	// last commits wrote. Only for filling a store that can be thrown away, as the
	// benchmarks at size do; Close writes the file out.
	NoSync bool
}

// Store is the bbolt-backed engine.Store.
type Store struct {
	db      *bolt.DB
	now     func() time.Time
	opts    Options
	watches watchers
	counts  stateCounts
	usage   tenantUsage
	metrics *collector
	commits *committer

	stop     chan struct{}
	stopOnce sync.Once
	swept    sync.WaitGroup

	// path is the database's file; closeMu and closed keep Fill, which reads the file
	// and bbolt's statistics outside any transaction, off a store that Close closed.
	path    string
	closeMu sync.RWMutex
	closed  bool
}

// Open opens or creates the database at path, creating its directory, and starts the
// sweeper. A database held by another process is reported after opts.LockTimeout.
func Open(path string, opts Options) (*Store, error) {
	if opts.LockTimeout <= 0 {
		opts.LockTimeout = 3 * time.Second
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
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.LockTimeout, NoSync: opts.NoSync})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("database %s is locked by another process (is another idemd running on it?)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	s := &Store{db: db, now: opts.Now, opts: opts, stop: make(chan struct{}), path: path}
	s.watches.init()
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRecords, bucketExpiry, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		if err := indexPending(tx); err != nil {
			return err
		}
		if err := s.usage.load(tx); err != nil {
			return err
		}
		return s.counts.load(tx)
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("database %s: %w", path, err)
	}
	s.metrics = newCollector(s)
	s.commits = newCommitter(db)
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
	// The recovery point: pt (when it was recorded) is set whenever there is one.
	PointName    string `json:"pn,omitempty"`
	PointData    []byte `json:"pd,omitempty"`
	PointAttempt int64  `json:"pa,omitempty"`
	PointAt      int64  `json:"pt,omitempty"`
	// A moving marker (move.go) keeps the record it stands for: its state and expiry
	// are these two.
	Held        engine.State `json:"ms,omitempty"`
	HeldExpires int64        `json:"mx,omitempty"`
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
	if r.PointAt != 0 {
		rec.RecoveryPoint = &engine.RecoveryPoint{Name: r.PointName, Data: r.PointData, Attempt: r.PointAttempt, RecordedAt: msTime(r.PointAt)}
	}
	return rec
}

// entry is the record as the rules see it; nil stays nil (absent).
func (r *stored) entry() *engine.Entry {
	if r == nil {
		return nil
	}
	return &engine.Entry{Record: r.record(true), Secret: r.Secret}
}

// encode is the inverse of entry.
func encode(e engine.Entry) *stored {
	r := &stored{
		Key: e.ID.Key, Tenant: e.ID.Tenant, State: e.State, Fingerprint: e.Fingerprint, Owner: e.Owner,
		Secret: e.Secret, Attempt: e.Attempt, Token: e.LeaseToken, LeaseExpiry: unixMs(e.LeaseExpiresAt),
		Recovered: e.Recovered, Created: unixMs(e.CreatedAt), Updated: unixMs(e.UpdatedAt), Expires: unixMs(e.ExpiresAt),
	}
	if resp := e.Response; resp != nil {
		r.HasResponse = true
		r.Status, r.Headers, r.Body = resp.Status, resp.Headers, resp.Body
	}
	if p := e.RecoveryPoint; p != nil {
		r.PointName, r.PointData, r.PointAttempt, r.PointAt = p.Name, p.Data, p.Attempt, unixMs(p.RecordedAt)
	}
	return r
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// txn is one transition inside a write transaction. It may run more than once (a group
// that a neighbour's failure rolled back runs again without it), so it only records its
// effects in its own fields, which are reset at each run and read after the commit.
type txn struct {
	tx  *bolt.Tx
	now int64
	// from and to are the states before and after, for the record counts; notify says
	// whether waiters on the record are woken after the commit.
	from, to engine.State
	notify   bool
	// tenant's usage moves by records and bytes.
	tenant         string
	records, bytes int64
	// answer is the transition's refusal, if any.
	answer error
}

// get reads the live record; an expired one counts as absent and is removed.
func (t *txn) get(rk []byte) (*stored, error) {
	r, err := readRecord(t.tx, rk)
	if err != nil || r == nil {
		return nil, err
	}
	if engine.Expired(msTime(r.Expires), msTime(t.now)) {
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
	t.tenant = r.Tenant
	if before := t.tx.Bucket(bucketRecords).Get(rk); before != nil {
		t.bytes += recordSize(rk, v) - recordSize(rk, before)
	} else {
		t.records++
		t.bytes += recordSize(rk, v)
	}
	if err := t.tx.Bucket(bucketRecords).Put(rk, v); err != nil {
		return err
	}
	if err := t.index(r); err != nil {
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
	if v := t.tx.Bucket(bucketRecords).Get(rk); v != nil {
		t.tenant = r.Tenant
		t.records--
		t.bytes -= recordSize(rk, v)
	}
	if err := t.tx.Bucket(bucketRecords).Delete(rk); err != nil {
		return err
	}
	if err := t.tx.Bucket(bucketPending).Delete(pendingKey(r.Tenant, r.Key)); err != nil {
		return err
	}
	if t.from == "" {
		t.from = r.State
	}
	return t.tx.Bucket(bucketExpiry).Delete(expiryKey(r.Expires, rk))
}

// update runs fn as one transition in a shared, synced commit; once it is committed the
// commit loop updates the counts and wakes waiters, whether or not the caller still
// waits. fn returns an answerErr for an answer such as not found: that is not a
// failure, and the transaction still commits (it may have removed an expired record on
// the way). A ctx that ends returns its own error at once: before the transition's
// group starts, the transition is not applied; while it commits, it may be.
func (s *Store) update(ctx context.Context, id engine.ID, fn func(t *txn, rk []byte) error) error {
	return s.updateKey(ctx, recordKey(id), fn)
}

// updateKey is update on the record key rk.
func (s *Store) updateKey(ctx context.Context, rk []byte, fn func(t *txn, rk []byte) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var t txn
	err := s.commits.run(ctx, func(tx *bolt.Tx) error {
		t = txn{tx: tx, now: s.now().UnixMilli()}
		err := fn(&t, rk)
		var answer answerErr
		if errors.As(err, &answer) {
			t.answer = answer.err
			return nil
		}
		return err
	}, func() {
		s.counts.move(t.from, t.to)
		s.usage.add(t.tenant, t.records, t.bytes)
		if t.notify {
			s.watches.signal(string(rk))
		}
	})
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, ctxErr) {
		return err
	}
	if err != nil {
		return engine.Unavailable(err)
	}
	return t.answer
}

// updateKeys is updateKey on every record key of rks at once, committed together:
// fn runs for each (i its index in rks), and each one's answer or error comes back
// in rks's order.
func (s *Store) updateKeys(ctx context.Context, rks [][]byte, fn func(i int, t *txn, rk []byte) error) []error {
	ts := make([]txn, len(rks))
	fns := make([]func(*bolt.Tx) error, len(rks))
	afters := make([]func(), len(rks))
	for i, rk := range rks {
		t := &ts[i]
		fns[i] = func(tx *bolt.Tx) error {
			*t = txn{tx: tx, now: s.now().UnixMilli()}
			err := fn(i, t, rk)
			var answer answerErr
			if errors.As(err, &answer) {
				t.answer = answer.err
				return nil
			}
			return err
		}
		afters[i] = func() {
			s.counts.move(t.from, t.to)
			s.usage.add(t.tenant, t.records, t.bytes)
			if t.notify {
				s.watches.signal(string(rk))
			}
		}
	}
	var errs []error
	if err := ctx.Err(); err != nil {
		errs = make([]error, len(rks))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	errs = s.commits.runAll(ctx, fns, afters)
	for i, err := range errs {
		switch ctxErr := ctx.Err(); {
		case ctxErr != nil && errors.Is(err, ctxErr):
		case err != nil:
			errs[i] = engine.Unavailable(err)
		default:
			errs[i] = ts[i].answer
		}
	}
	return errs
}

// answerErr carries a transition's answer (not found, lease lost, ...) out of fn.
type answerErr struct{ err error }

func (a answerErr) Error() string { return a.err.Error() }

// Claim implements engine.Store. A claim that changes nothing (a replay, in progress,
// a mismatch, a resent or re-entrant claim) is answered from a read transaction, so
// duplicates cost no commit; the others run as a write transaction.
func (s *Store) Claim(ctx context.Context, c engine.Claim) (engine.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return engine.ClaimResult{}, err
	}
	rule := func(cur *engine.Entry, now time.Time) engine.Step { return engine.ClaimStep(cur, c, now) }
	var step engine.Step
	err := s.db.View(func(tx *bolt.Tx) error {
		r, err := readRecord(tx, recordKey(c.ID))
		step = rule(r.entry(), msTime(s.now().UnixMilli()))
		return err
	})
	if err != nil {
		return engine.ClaimResult{}, engine.Unavailable(err)
	}
	if step.Write {
		if step, err = s.transition(ctx, c.ID, rule); err != nil {
			return engine.ClaimResult{}, err
		}
	}
	return step.ClaimResult()
}

// transition runs rule on the record of id in a write transaction and stores what it
// decides.
func (s *Store) transition(ctx context.Context, id engine.ID, rule func(*engine.Entry, time.Time) engine.Step) (engine.Step, error) {
	var step engine.Step
	err := s.update(ctx, id, func(t *txn, rk []byte) error {
		r, err := t.get(rk)
		if err != nil {
			return err
		}
		if r != nil && r.Key == "" {
			// Imported from a store that kept only the key's digest: the key is learnt
			// from the first transition that names it.
			r.Key = id.Key
		}
		step = rule(r.entry(), msTime(t.now))
		if !step.Write {
			return nil
		}
		old := int64(0)
		if r != nil {
			old, t.from = r.Expires, r.State
		}
		// Waiters wait for a lease to end, so only a write that ends one wakes them.
		t.to, t.notify = step.Next.State, step.Next.State != engine.StatePending
		return t.put(rk, encode(step.Next), old)
	})
	if err != nil {
		// A call whose deadline ended may still be committed later, writing step
		// meanwhile: it is read only once the commit has answered.
		return engine.Step{}, err
	}
	return step, nil
}

// readLive reads a record in any transaction; an expired one is absent.
func readLive(tx *bolt.Tx, rk []byte, now int64) (*stored, error) {
	r, err := readRecord(tx, rk)
	if err != nil || r == nil || engine.Expired(msTime(r.Expires), msTime(now)) {
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

// Complete implements engine.Store.
func (s *Store) Complete(ctx context.Context, c engine.Completion) (engine.Record, error) {
	step, err := s.transition(ctx, c.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.CompleteStep(cur, c, now) })
	if err != nil {
		return engine.Record{}, err
	}
	return step.Result()
}

// Release implements engine.Store.
func (s *Store) Release(ctx context.Context, rel engine.Release) (engine.Record, error) {
	step, err := s.transition(ctx, rel.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.ReleaseStep(cur, rel, now) })
	if err != nil {
		return engine.Record{}, err
	}
	return step.Result()
}

// Extend implements engine.Store.
func (s *Store) Extend(ctx context.Context, e engine.Extension) (engine.Record, error) {
	step, err := s.transition(ctx, e.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.ExtendStep(cur, e, now) })
	if err != nil {
		return engine.Record{}, err
	}
	return step.Result()
}

// Mark implements engine.Store.
func (s *Store) Mark(ctx context.Context, m engine.Mark) (engine.Record, error) {
	step, err := s.transition(ctx, m.ID, func(cur *engine.Entry, now time.Time) engine.Step { return engine.MarkStep(cur, m, now) })
	if err != nil {
		return engine.Record{}, err
	}
	return step.Result()
}

// Lookup implements engine.Store. It reads without writing, so an expired record is
// reported absent and left for the sweeper.
func (s *Store) Lookup(ctx context.Context, id engine.ID) (engine.Record, error) {
	if err := ctx.Err(); err != nil {
		return engine.Record{}, err
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
		if !r.State.Known() {
			// A marker: the key is not free, and its record is not here to answer.
			return answerErr{engine.ErrStoreMoved}
		}
		rec = r.record(true)
		rec.ID = id
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
		if !r.State.Known() {
			return answerErr{engine.ErrStoreMoved}
		}
		t.notify = true
		return t.remove(rk, r)
	})
}

// Watch implements engine.Store: waiters live in this process, as does every writer.
func (s *Store) Watch(ctx context.Context, id engine.ID) (engine.Watch, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return s.watches.add(string(recordKey(id))), nil
}

// Ping implements engine.Store with a small synced write, so that a database that
// cannot be written (a full or read-only disk) reports unavailable.
func (s *Store) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
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

// Close stops the sweeper, commits the transitions already waiting for a commit,
// refuses later ones as unavailable, and closes the database.
func (s *Store) Close() error {
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
	s.swept.Wait()
	s.commits.close()
	if s.opts.NoSync {
		if err := s.db.Sync(); err != nil {
			_ = s.db.Close()
			return err
		}
	}
	return s.db.Close()
}
