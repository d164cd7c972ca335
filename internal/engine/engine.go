// Package engine is idemd's state machine: the records, their transitions, the errors
// callers branch on, and the Store interface that every storage backend implements.
//
// A record moves through these states:
//
//	(absent) --claim--> pending --complete--> completed
//	                    pending --release(fail)--> failed
//	                    pending --release(retry)--> released --claim--> pending (attempt+1)
//	                    pending (lease expired) --claim--> pending (attempt+1, recovered)
//
// Only the holder of the current lease token may complete, release or extend; a token
// stays valid after its lease runs out until another claim takes the key over, so
// fencing is by token, not by wall clock.
//
// rules.go holds every transition as a pure function of a record and a time; the
// stores run those functions (or, in Redis, lua/*.lua, held to the same table by
// enginetest) and decide nothing themselves.
package engine

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"
)

// State is where a record stands in its life cycle.
type State string

// The record states.
const (
	StatePending   State = "pending"
	StateReleased  State = "released"
	StateCompleted State = "completed"
	StateFailed    State = "failed"
)

// The marker states: a live move to another store (docs/moving.md, "Moving to
// another store while serving") leaves one of them in the old store in place of each
// record it hands over, moving while the handover runs and moved once the new store
// holds the record. No transition of this release reads a marker as a record, nor
// as an absent one: every transition refuses it with ErrStoreMoved and changes
// nothing, and so does a state this release does not know, which a later release
// may write.
const (
	StateMoving State = "moving"
	StateMoved  State = "moved"
)

// Known says whether s is a state of a record (pending, released, completed or
// failed): a marker, or a state of a later release, is not.
func (s State) Known() bool {
	switch s {
	case StatePending, StateReleased, StateCompleted, StateFailed:
		return true
	}
	return false
}

// Outcome is what a claim produced.
type Outcome string

// The claim outcomes. A claim that finds a live lease held by someone else returns an
// *InProgressError instead of an outcome.
const (
	OutcomeAcquired  Outcome = "acquired"
	OutcomeCompleted Outcome = "completed"
	OutcomeFailed    Outcome = "failed"
)

// ReleaseMode says what a release does with the key.
type ReleaseMode string

// The release modes.
const (
	ReleaseRetry ReleaseMode = "retry"
	ReleaseFail  ReleaseMode = "fail"
)

// Limits of the contract. The HTTP layer validates against them before anything reaches
// a store, and the stores rely on that.
const (
	MaxKeyBytes         = 255
	MaxFingerprintBytes = 256
	MaxOwnerBytes       = 256
	MinSecretBytes      = 22
	MaxSecretBytes      = 256
	MaxLeaseTokenBytes  = 256
	MaxPointNameBytes   = 128
	MinLease            = 100 * time.Millisecond
	MaxLease            = time.Hour
	DefaultLease        = 30 * time.Second
	MaxWait             = 30 * time.Second
	MinRetention        = time.Millisecond
	MaxRetention        = 30 * 24 * time.Hour
	DefaultRetention    = 24 * time.Hour
	DefaultTenant       = "default"
)

// DefaultMaxPointBytes bounds a recovery point's data unless the daemon says otherwise:
// enough for a few ids and a state, small enough that a pending record stays small.
const DefaultMaxPointBytes = 4096

// ID names a record: a key within a tenant's key space.
type ID struct {
	Tenant string
	Key    string
}

// Response is the stored result of an operation, replayed byte for byte.
type Response struct {
	Status  int
	Headers map[string][]string
	Body    []byte
}

// SealedHeader is the header under which a store keeps the mark of a sealed response:
// a response whose only header is this one, with the value "1", holds in its body the
// envelope a client sealed its headers and body in. The HTTP layer answers it as the
// contract's `sealed` member and refuses the name in a plain response.
const SealedHeader = "Idemd-Sealed"

// Sealed is the envelope of a sealed response, or nil for a plain one.
func (r *Response) Sealed() []byte {
	if r == nil || len(r.Headers) != 1 {
		return nil
	}
	if v := r.Headers[SealedHeader]; len(v) == 1 && v[0] == "1" {
		return r.Body
	}
	return nil
}

// Size is what the response counts against the stored-response limit.
func (r *Response) Size() int {
	if r == nil {
		return 0
	}
	n := len(r.Body)
	for k, vs := range r.Headers {
		n += len(k)
		for _, v := range vs {
			n += len(v)
		}
	}
	return n
}

// Record is everything a store knows about a key.
type Record struct {
	ID          ID
	State       State
	Fingerprint string
	// Owner is the label the claim gave; it grants nothing.
	Owner          string
	Attempt        int64
	LeaseToken     string
	LeaseExpiresAt time.Time
	// Recovered is true when the current lease was taken over from a holder whose lease
	// had expired.
	Recovered bool
	CreatedAt time.Time
	UpdatedAt time.Time
	// ExpiresAt is when the store forgets the record.
	ExpiresAt time.Time
	// Response is set on completed and failed records when the operation asked for it.
	Response *Response
	// RecoveryPoint is the last point a holder recorded. It outlives the lease that
	// recorded it, so that the next holder resumes from it, and goes when the key is
	// finished.
	RecoveryPoint *RecoveryPoint
}

// RecoveryPoint is how far a holder of a key got: a name and what the next holder
// needs to resume.
type RecoveryPoint struct {
	Name string
	Data []byte
	// Attempt is the attempt whose holder recorded it.
	Attempt    int64
	RecordedAt time.Time
}

// Mark records a recovery point under a held lease.
type Mark struct {
	ID         ID
	LeaseToken string
	Name       string
	Data       []byte
	// Caps are the tenant's, applied by the service before the store runs.
	Caps Caps
}

// Caps are what a tenant may store, below the daemon's own limits; a zero field means
// no cap of the tenant's own. The Service applies them; stores ignore them.
type Caps struct {
	// MaxResponseBytes bounds a stored response (Response.Size).
	MaxResponseBytes int
	// MaxRetention bounds how long a record is kept. An explicit retention over it is
	// refused, so that a client never believes a result is kept longer than it is; the
	// default retention is clamped to it.
	MaxRetention time.Duration
	// MaxStoredBytes and MaxRecords are the tenant's quota on what the store keeps of
	// it (see Usage): at either, new acquisitions are refused with a *QuotaError.
	MaxStoredBytes int64
	MaxRecords     int64
}

// HasQuota says whether the caps set a quota on what the tenant keeps.
func (c Caps) HasQuota() bool { return c.MaxStoredBytes > 0 || c.MaxRecords > 0 }

// Usage is what the store keeps of one tenant: its records and their bytes as the
// store counts them (the key, the record with its response and recovery point). A store
// counts a record until it has left, by retention, purge or sweep; a store whose
// records leave silently (Redis) counts one until a little after (docs/operations.md,
// "Quotas").
type Usage struct {
	Records int64
	Bytes   int64
	// NextDrop is when some of what is counted will stop counting (the earliest expiry
	// the store knows of), or zero when it does not know.
	NextDrop time.Time
}

// UsageReader is a Store that counts what each tenant keeps. Every store of this
// repository is one; the Service enforces quotas only over one.
type UsageReader interface {
	// Usage returns the tenant's usage now.
	Usage(ctx context.Context, tenant string) (Usage, error)
}

// QuotaError refuses a new acquisition to a tenant that holds its quota, or more.
type QuotaError struct {
	Tenant string
	Usage  Usage
	// Limit is the quota the tenant reached: Field says which ("max_stored_bytes" or
	// "max_records"), Used and Limit its figures.
	Field       string
	Used, Limit int64
	// RetryAfter is how long until usage falls as records expire; zero when unknown.
	RetryAfter time.Duration
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("tenant %s keeps %d of %s %d in the store; new keys are refused until records expire or are purged",
		e.Tenant, e.Used, e.Field, e.Limit)
}

// overQuota returns the *QuotaError for a tenant whose usage u, with need added, would
// pass caps' quota at now, or nil. A need of no records is not held to max_records.
func overQuota(tenant string, u, need Usage, caps Caps, now time.Time) *QuotaError {
	e := &QuotaError{Tenant: tenant, Usage: u}
	switch {
	case caps.MaxRecords > 0 && need.Records > 0 && u.Records+need.Records > caps.MaxRecords:
		e.Field, e.Used, e.Limit = "max_records", u.Records, caps.MaxRecords
	case caps.MaxStoredBytes > 0 && u.Bytes+need.Bytes > caps.MaxStoredBytes:
		e.Field, e.Used, e.Limit = "max_stored_bytes", u.Bytes, caps.MaxStoredBytes
	default:
		return nil
	}
	if !u.NextDrop.IsZero() {
		e.RetryAfter = max(u.NextDrop.Sub(now), time.Millisecond)
	}
	return e
}

// CapError reports a request over its tenant's caps, naming the member at fault.
type CapError struct {
	Tenant string
	// Field is "response" or "retention_ms".
	Field        string
	Value, Limit int64
}

func (e *CapError) Error() string {
	if e.Field == "response" {
		return fmt.Sprintf("response is %d bytes (body and headers), over tenant %s's limit of %d", e.Value, e.Tenant, e.Limit)
	}
	return fmt.Sprintf("%s is %d, over tenant %s's limit of %d", e.Field, e.Value, e.Tenant, e.Limit)
}

// ClaimRequest asks for the lease on a key.
type ClaimRequest struct {
	ID          ID
	Fingerprint string
	Owner       string
	// Secret is the caller's claim secret as sent; the service keeps only its hash.
	Secret string
	Lease  time.Duration
	// Wait is how long to wait for a live holder to finish before reporting in progress.
	Wait time.Duration
	// Retention is how long a pending record is kept when its holder never comes back;
	// zero means the service's default.
	Retention time.Duration
	// Caps are the tenant's; the service clamps the default retention to them.
	Caps Caps
}

// Claim is a ClaimRequest as a store sees it: with the token the new lease will carry
// and the retention of a pending record. The token is chosen before the store runs, so
// that a store operation repeated after a lost reply acquires with the same token
// instead of locking its own caller out.
type Claim struct {
	ID          ID
	Fingerprint string
	Owner       string
	// Secret is the hash of the claim secret (HashSecret), or empty. A claim with the
	// live lease's secret gets that lease back; stores keep it and never answer it.
	Secret    string
	Lease     time.Duration
	Retention time.Duration
	Token     string
	// Waiting is true when the caller waits for a live holder to finish: a store whose
	// change notifications cost something (Redis Pub/Sub) sends them only for records
	// that a waiting claim has seen.
	Waiting bool
}

// ClaimResult is a claim's outcome and the record as the claim left it.
type ClaimResult struct {
	Outcome Outcome
	Record  Record
}

// Completion stores the result of a held key.
type Completion struct {
	ID         ID
	LeaseToken string
	Response   Response
	Retention  time.Duration
	// Caps are the tenant's, applied by the service before the store runs.
	Caps Caps
	// Body, when set, is the response's body as a stream of BodySize bytes, in place
	// of Response.Body: a result large enough for the blob store goes there as it
	// arrives, never held whole; a smaller one is read whole first. The service reads
	// it only while the key is held, and hands the store a Completion without it.
	Body     io.Reader
	BodySize int64
}

// Release gives a held key back.
type Release struct {
	ID         ID
	LeaseToken string
	Mode       ReleaseMode
	// Response is the failure to replay when Mode is ReleaseFail; it may be nil.
	Response  *Response
	Retention time.Duration
	// Caps are the tenant's, applied by the service before the store runs.
	Caps Caps
}

// Extension renews a held lease.
type Extension struct {
	ID         ID
	LeaseToken string
	Lease      time.Duration
}

// AbandonedQuery asks for a tenant's abandoned keys: pending, under a lease that ran
// out at or before Before, and beginning with Prefix.
type AbandonedQuery struct {
	Tenant string
	Prefix string
	Before time.Time
	// Cursor is where the previous page stopped (its Next), "" for the first page. It
	// is the store's own and opaque above it.
	Cursor string
	// Limit bounds the keys of a page, at most MaxAbandonedLimit.
	Limit int
}

// AbandonedKey is an abandoned key as the feed shows it.
type AbandonedKey struct {
	Key     string
	Attempt int64
	// Fingerprint is what a claim must carry to acquire the key.
	Fingerprint    string
	Owner          string
	LeaseExpiredAt time.Time
	// Point is the name of the last recovery point, "" for none.
	Point string
}

// AbandonedPage is one page of the feed: Next is the cursor of the next page, "" at
// the end. A page may hold fewer than Limit keys (even none) and still have a Next:
// a store bounds the pending keys it reads for one page.
type AbandonedPage struct {
	Keys []AbandonedKey
	Next string
}

// Limits of the abandoned-keys feed.
const (
	DefaultAbandonedLimit = 100
	MaxAbandonedLimit     = 1000
)

// Errors that callers branch on with errors.Is.
var (
	ErrNotFound            = errors.New("no record for this key")
	ErrLeaseLost           = errors.New("the lease token is not the key's current lease")
	ErrFingerprintMismatch = errors.New("the key was used with a different fingerprint")
	ErrInProgress          = errors.New("another caller holds a live lease on the key")
	ErrUnavailable         = errors.New("the store is unavailable")
	ErrNotReplicated       = errors.New("the write was not confirmed by enough replicas in time")
	ErrBadCursor           = errors.New("the cursor is not one the feed gave")
	// ErrStoreMoved answers a transition on a key whose record this store handed over
	// to another one (a marker, see StateMoving), or holds in a state this release
	// does not know. Nothing was acquired or changed: the key is not free, and the
	// daemon that serves it from the new store answers it.
	ErrStoreMoved = errors.New("the key's record has moved to another store")
)

// InProgressError reports a live lease held by someone else, and when it runs out.
type InProgressError struct {
	RetryAfter time.Duration
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("%s (lease runs out in %s)", ErrInProgress, e.RetryAfter)
}

// Is makes errors.Is(err, ErrInProgress) true.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// StoreTimeoutError reports a store call that got no answer within the service's
// deadline. Whether a write it carried took effect is unknown. It is ErrUnavailable.
type StoreTimeoutError struct {
	Timeout time.Duration
	cause   error
}

func (e *StoreTimeoutError) Error() string {
	return fmt.Sprintf("the store did not answer within %s: %v", e.Timeout, e.cause)
}

// Is makes errors.Is(err, ErrUnavailable) true. The cause, the deadline's context
// error, is not unwrapped: it is the service's deadline, not the caller's.
func (e *StoreTimeoutError) Is(target error) bool { return target == ErrUnavailable }

// Unavailable wraps a store failure so that errors.Is(err, ErrUnavailable) holds while
// the cause stays visible in logs.
func Unavailable(cause error) error {
	return &unavailableError{cause: cause}
}

type unavailableError struct{ cause error }

func (e *unavailableError) Error() string        { return "store unavailable: " + e.cause.Error() }
func (e *unavailableError) Unwrap() []error      { return []error{ErrUnavailable, e.cause} }
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

// HashSecret returns what stores keep of a claim secret: its SHA-256, hex-encoded.
// The empty secret stays empty, so that it matches nothing.
func HashSecret(secret string) string {
	if secret == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// NewLeaseToken returns 128 random bits, hex-encoded.
func NewLeaseToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never returns an error.
	return hex.EncodeToString(b[:])
}
