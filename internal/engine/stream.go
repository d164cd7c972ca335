package engine

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// This file is the store-neutral record stream: what every store exports and imports,
// record by record, so that records move between stores and into and out of files.
// docs/operations.md ("The record stream") describes the format for users.

// Exported is one record as it leaves or enters a store: the rules' Entry (the Record
// with every time absolute, and the claim secret's hash), the SHA-256 of the client's
// key, which names the record in every store, and the client's key itself where the
// store keeps it: Redis's lean layout keeps only the digest, so Entry.ID.Key may be "".
type Exported struct {
	Entry
	KeyDigest [32]byte
}

// KeyDigest is the SHA-256 of a client's key, which every store names records by.
func KeyDigest(key string) [32]byte { return sha256.Sum256([]byte(key)) }

// ImportOutcome is what an import did with one record.
type ImportOutcome string

// The import outcomes. Only ImportWritten changes the target.
const (
	// ImportWritten: the target held no live record of the key and now holds this one.
	ImportWritten ImportOutcome = "written"
	// ImportSame: the target already holds this record (the same state, attempt and
	// last update): an import repeated after an interruption.
	ImportSame ImportOutcome = "same"
	// ImportKept: the target holds another record of the key, newer or different, and
	// keeps it.
	ImportKept ImportOutcome = "kept"
	// ImportExpired: the record's retention had run out: there is nothing to keep.
	ImportExpired ImportOutcome = "expired"
)

// Porter is what a store offers to move its records: every store implements it.
type Porter interface {
	// Export calls fn for every live record, one at a time, in an order of the store's
	// choosing, while the store keeps serving. Each record is read whole in one atomic
	// read; records written while Export runs may or may not be seen. Its memory is
	// bounded whatever the number of records, and its cost grows with the records it
	// reads. An error from fn ends it and is returned.
	Export(ctx context.Context, fn func(Exported) error) error
	// Import writes the record where the target holds no live record of its key, with
	// its times as they are (a retention or lease is never renewed by moving), and says
	// what it did. A record without a lease token (a stream keeps only the token's hash)
	// gets a new random one, which no caller holds: its holder gets the lease back by
	// claiming with its claim secret, or the lease runs out and is taken over.
	Import(ctx context.Context, e Exported) (ImportOutcome, error)
}

// SameRecord says whether the target's record a is the record b of the stream: an import
// repeated after an interruption finds what it wrote.
func SameRecord(a, b Record) bool {
	return a.State == b.State && a.Attempt == b.Attempt && a.Fingerprint == b.Fingerprint &&
		a.UpdatedAt.Equal(b.UpdatedAt) && a.CreatedAt.Equal(b.CreatedAt)
}

// The stream's format: JSON Lines, a header line first, then one line per record, then
// a trailer that counts them, without which the stream was cut short.
const (
	StreamFormat  = "idemd-records"
	StreamVersion = 1
)

// StreamHeader is the stream's first line.
type StreamHeader struct {
	Format     string    `json:"format"`
	Version    int       `json:"version"`
	ExportedAt time.Time `json:"exported_at"`
	// Store names the kind of store the records came from: "bolt" or "redis".
	Store string `json:"store,omitempty"`
}

// streamTrailer is the stream's last line.
type streamTrailer struct {
	End     bool  `json:"end"`
	Records int64 `json:"records"`
}

// streamRecord is a record's line. Times are Unix milliseconds, as both stores keep
// them; bytes are base64 (encoding/json's []byte).
type streamRecord struct {
	Tenant      string `json:"tenant"`
	KeySHA256   string `json:"key_sha256"`
	Key         string `json:"key,omitempty"`
	State       State  `json:"state"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Owner       string `json:"owner,omitempty"`
	Attempt     int64  `json:"attempt"`
	// LeaseTokenSHA256 is the hash of the current (or last) lease token: a stream never
	// carries a token that would let its reader complete someone's lease.
	LeaseTokenSHA256 string `json:"lease_token_sha256,omitempty"`
	LeaseExpiresAt   int64  `json:"lease_expires_at_ms,omitempty"`
	Recovered        bool   `json:"recovered,omitempty"`
	// ClaimSecretSHA256 is what the store keeps of the lease's claim secret.
	ClaimSecretSHA256 string          `json:"claim_secret_sha256,omitempty"`
	CreatedAt         int64           `json:"created_at_ms"`
	UpdatedAt         int64           `json:"updated_at_ms"`
	ExpiresAt         int64           `json:"expires_at_ms"`
	Response          *streamResponse `json:"response,omitempty"`
	RecoveryPoint     *streamPoint    `json:"recovery_point,omitempty"`
}

// streamResponse is a stored response exactly as stored: a sealed one keeps its
// Idemd-Sealed header and its envelope as body.
type streamResponse struct {
	Status  int                 `json:"status"`
	Headers map[string][]string `json:"headers,omitempty"`
	Body    []byte              `json:"body,omitempty"`
}

type streamPoint struct {
	Name       string `json:"name"`
	Data       []byte `json:"data,omitempty"`
	Attempt    int64  `json:"attempt"`
	RecordedAt int64  `json:"recorded_at_ms"`
}

// StreamWriter writes a record stream.
type StreamWriter struct {
	w   *bufio.Writer
	enc *json.Encoder
	n   int64
}

// NewStreamWriter writes the header to w and returns the writer of the records.
func NewStreamWriter(w io.Writer, store string, now time.Time) (*StreamWriter, error) {
	bw := bufio.NewWriterSize(w, 64<<10)
	sw := &StreamWriter{w: bw, enc: json.NewEncoder(bw)}
	sw.enc.SetEscapeHTML(false)
	if err := sw.enc.Encode(StreamHeader{Format: StreamFormat, Version: StreamVersion, ExportedAt: now.UTC(), Store: store}); err != nil {
		return nil, err
	}
	return sw, nil
}

// Write writes one record.
func (sw *StreamWriter) Write(e Exported) error {
	r := streamRecord{
		Tenant: e.ID.Tenant, KeySHA256: hex.EncodeToString(e.KeyDigest[:]), Key: e.ID.Key,
		State: e.State, Fingerprint: e.Fingerprint, Owner: e.Owner, Attempt: e.Attempt,
		LeaseExpiresAt: unixMs(e.LeaseExpiresAt), Recovered: e.Recovered, ClaimSecretSHA256: e.Secret,
		CreatedAt: unixMs(e.CreatedAt), UpdatedAt: unixMs(e.UpdatedAt), ExpiresAt: unixMs(e.ExpiresAt),
	}
	if e.LeaseToken != "" {
		sum := sha256.Sum256([]byte(e.LeaseToken))
		r.LeaseTokenSHA256 = hex.EncodeToString(sum[:])
	}
	if resp := e.Response; resp != nil {
		r.Response = &streamResponse{Status: resp.Status, Headers: resp.Headers, Body: resp.Body}
	}
	if p := e.RecoveryPoint; p != nil {
		r.RecoveryPoint = &streamPoint{Name: p.Name, Data: p.Data, Attempt: p.Attempt, RecordedAt: unixMs(p.RecordedAt)}
	}
	sw.n++
	return sw.enc.Encode(r)
}

// Close writes the trailer and flushes; a stream without it reads as cut short.
func (sw *StreamWriter) Close() error {
	if err := sw.enc.Encode(streamTrailer{End: true, Records: sw.n}); err != nil {
		return err
	}
	return sw.w.Flush()
}

// MaxStreamLine bounds one line of a stream: a record with the largest response the
// daemon may be configured to keep inline, or a result of DefaultMaxBlobBytes that an
// export read back from the blob store, base64-encoded, and room for the rest.
const MaxStreamLine = DefaultMaxBlobBytes*4/3 + 8<<20

// StreamReader reads a record stream.
type StreamReader struct {
	sc     *bufio.Scanner
	line   int
	n      int64
	max    int
	ended  bool
	Header StreamHeader
}

// ErrStream says that a stream is not one this release reads.
var ErrStream = errors.New("not a record stream")

// NewStreamReader reads and checks the header. maxLine bounds a line (and so the
// reader's memory); 0 is MaxStreamLine.
func NewStreamReader(r io.Reader, maxLine int) (*StreamReader, error) {
	if maxLine <= 0 {
		maxLine = MaxStreamLine
	}
	sc := bufio.NewScanner(r)
	// The scanner grows its buffer up to the larger of maxLine and the first buffer.
	sc.Buffer(make([]byte, 0, min(64<<10, maxLine)), maxLine)
	sr := &StreamReader{sc: sc, max: maxLine}
	if !sc.Scan() {
		if err := sc.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("%w: it is empty", ErrStream)
	}
	sr.line = 1
	if err := json.Unmarshal(sc.Bytes(), &sr.Header); err != nil || sr.Header.Format != StreamFormat {
		return nil, fmt.Errorf("%w: line 1 is no header naming the format %q", ErrStream, StreamFormat)
	}
	if sr.Header.Version != StreamVersion {
		return nil, fmt.Errorf("%w: version %d, where this release reads version %d", ErrStream, sr.Header.Version, StreamVersion)
	}
	return sr, nil
}

// Next returns the next record, or io.EOF after the trailer. A malformed line, and a
// stream that ends without its trailer, are errors naming the line and the member.
func (sr *StreamReader) Next() (Exported, error) {
	if sr.ended {
		return Exported{}, io.EOF
	}
	if !sr.sc.Scan() {
		if err := sr.sc.Err(); err != nil {
			if errors.Is(err, bufio.ErrTooLong) {
				return Exported{}, fmt.Errorf("%w: line %d is longer than %d bytes", ErrStream, sr.line+1, sr.max)
			}
			return Exported{}, err
		}
		return Exported{}, fmt.Errorf("%w: it ends after line %d without its trailer: cut short", ErrStream, sr.line)
	}
	sr.line++
	var r struct {
		streamRecord
		streamTrailer
	}
	if err := json.Unmarshal(sr.sc.Bytes(), &r); err != nil {
		return Exported{}, fmt.Errorf("%w: line %d: %v", ErrStream, sr.line, err)
	}
	if r.End {
		if r.Records != sr.n {
			return Exported{}, fmt.Errorf("%w: the trailer counts %d records, the stream holds %d", ErrStream, r.Records, sr.n)
		}
		sr.ended = true
		return Exported{}, io.EOF
	}
	sr.n++
	e, err := r.streamRecord.exported()
	if err != nil {
		return Exported{}, fmt.Errorf("%w: line %d: %v", ErrStream, sr.line, err)
	}
	return e, nil
}

// Line is the number of the line Next read last.
func (sr *StreamReader) Line() int { return sr.line }

func (r *streamRecord) exported() (Exported, error) {
	var e Exported
	digest, err := hex.DecodeString(r.KeySHA256)
	switch {
	case err != nil || len(digest) != sha256.Size:
		return e, errors.New("key_sha256 is not 64 hex digits")
	case r.Key != "" && KeyDigest(r.Key) != [32]byte(digest):
		return e, errors.New("key_sha256 is not the SHA-256 of key")
	case r.Tenant == "":
		return e, errors.New("tenant is empty")
	case len(r.Key) > MaxKeyBytes:
		return e, errors.New("key is too long")
	case r.State != StatePending && r.State != StateReleased && r.State != StateCompleted && r.State != StateFailed:
		return e, fmt.Errorf("state %q is none of pending, released, completed, failed", r.State)
	case r.Attempt < 1:
		return e, errors.New("attempt is below 1")
	case r.ExpiresAt <= 0 || r.CreatedAt <= 0 || r.UpdatedAt <= 0:
		return e, errors.New("created_at_ms, updated_at_ms and expires_at_ms must be set")
	case r.State == StatePending && r.LeaseExpiresAt <= 0:
		return e, errors.New("lease_expires_at_ms must be set on a pending record")
	}
	e.KeyDigest = [32]byte(digest)
	e.ID = ID{Tenant: r.Tenant, Key: r.Key}
	e.State, e.Fingerprint, e.Owner, e.Attempt = r.State, r.Fingerprint, r.Owner, r.Attempt
	e.Recovered, e.Secret = r.Recovered, r.ClaimSecretSHA256
	e.CreatedAt, e.UpdatedAt, e.ExpiresAt = msTime(r.CreatedAt), msTime(r.UpdatedAt), msTime(r.ExpiresAt)
	if r.State == StatePending {
		e.LeaseExpiresAt = msTime(r.LeaseExpiresAt)
	}
	if resp := r.Response; resp != nil {
		e.Response = &Response{Status: resp.Status, Headers: resp.Headers, Body: resp.Body}
	}
	if p := r.RecoveryPoint; p != nil {
		e.RecoveryPoint = &RecoveryPoint{Name: p.Name, Data: p.Data, Attempt: p.Attempt, RecordedAt: msTime(p.RecordedAt)}
	}
	return e, nil
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
