package idem

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
)

// Sealing: the client seals the results it stores and the recovery points it records
// with keys idemd never sees, and opens them when they come back (docs/sealing.md).
//
// An envelope is
//
//	0xC1 | version 2 | len(key id) | key id | salt (16) | nonce (12) | ciphertext | tag (16)
//
// sealed with AES-256-GCM under a key derived for the one message, HKDF-SHA256(ring key,
// salt, "idemd seal v1"), so that random nonces never meet the 2^32-messages-per-key
// limit of GCM with a fixed key. The associated data binds the envelope's head, what
// it seals (a completed result, a failed one, or a recovery point), the tenant, the
// idemd key and, for a result, its readable status or, for a recovery point, its name:
// an envelope moved to another key, tenant, status, outcome or point fails to open.
// Version 1, which clients wrote before, still opens; it does not bind a result's
// outcome, so a failed result's envelope opens as a completed one and back.

const (
	sealMarker   = 0xC1
	sealVersion  = 2
	sealV1       = 1
	sealSaltLen  = 16
	sealNonceLen = 12
	sealTagLen   = 16
	sealKeyLen   = 32
	sealMaxKeyID = 32
	sealInfo     = "idemd seal v1"
)

// ErrUnsealable matches every error of a sealed result or recovery point that cannot
// be opened, and of a plain one that a ring requiring sealing refuses; errors.As gives
// the *SealError with the reason.
var ErrUnsealable = errors.New("idemd: a sealed result cannot be opened")

// The reasons of a SealError.
const (
	// SealUnknownKey: the envelope names a key the ring does not hold.
	SealUnknownKey = "unknown_key"
	// SealInvalid: not an envelope, or one that fails to open: tampered with, moved to
	// another key, tenant, status, outcome or point, or sealed with other bytes under
	// the id.
	SealInvalid = "invalid"
	// SealMissing: the ring requires sealed results (RequireSealed) and this one is
	// plain, or a finished key has no result at all.
	SealMissing = "not_sealed"
)

// SealError says why a sealed result or recovery point could not be opened. The
// operation is not run again for it: the key is done, and its result is unreadable here.
type SealError struct {
	Reason string
	// KeyID is the id the envelope names, when it has one.
	KeyID string
}

func (e *SealError) Error() string {
	switch e.Reason {
	case SealUnknownKey:
		return fmt.Sprintf("idemd: sealed with key %q, which the client's key ring does not hold", e.KeyID)
	case SealMissing:
		return "idemd: not sealed, and the client's key ring requires sealing"
	}
	if e.KeyID != "" {
		return fmt.Sprintf("idemd: sealed with key %q but does not open: changed in the store, moved, or sealed with other key bytes", e.KeyID)
	}
	return "idemd: not a sealed envelope this client can read"
}

// Is makes errors.Is(err, ErrUnsealable) true.
func (e *SealError) Is(target error) bool { return target == ErrUnsealable }

// SealKey is one key of a ring: an id of 1 to 32 letters, digits, '.', '_' or '-',
// and 32 random bytes.
type SealKey struct {
	ID  string
	Key []byte
}

// KeyRing holds the keys that open sealed results, and the one that seals. Rotating is
// making a ring whose first key is new and keeping the old ones in it for as long as
// results sealed with them are retained.
type KeyRing struct {
	sealWith      SealKey
	keys          map[string]cipherKey
	requireSealed bool
}

type cipherKey []byte

// NewKeyRing makes a ring; the first key seals, and every key opens.
func NewKeyRing(keys ...SealKey) (*KeyRing, error) {
	if len(keys) == 0 {
		return nil, errors.New("idemd: a key ring needs at least one key")
	}
	r := &KeyRing{sealWith: keys[0], keys: map[string]cipherKey{}}
	for i, k := range keys {
		if err := validKeyID(k.ID); err != nil {
			return nil, fmt.Errorf("idemd: key ring entry %d: %w", i, err)
		}
		if len(k.Key) != sealKeyLen {
			return nil, fmt.Errorf("idemd: key %q is %d bytes; a sealing key is %d random bytes", k.ID, len(k.Key), sealKeyLen)
		}
		if _, dup := r.keys[k.ID]; dup {
			return nil, fmt.Errorf("idemd: key id %q is in the ring twice", k.ID)
		}
		r.keys[k.ID] = slices.Clone(k.Key)
	}
	r.sealWith.Key = r.keys[keys[0].ID]
	return r, nil
}

// ParseKeyRing reads a ring from its text form, as the IDEMD_SEAL_KEYS variable and
// key files hold it (docs/sealing.md): entries "id=base64 of 32 bytes" separated by
// commas or line feeds, the first of which seals. Spaces, tabs and carriage returns
// around lines, entries, ids and keys are skipped, and so are blank lines and lines
// starting with '#'. A key is standard base64 with its padding and zero pad bits.
func ParseKeyRing(text string) (*KeyRing, error) {
	var keys []SealKey
	for _, line := range strings.Split(text, "\n") {
		line = trimRingSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, entry := range strings.Split(line, ",") {
			entry = trimRingSpace(entry)
			if entry == "" {
				continue
			}
			id, b64, ok := strings.Cut(entry, "=")
			if !ok {
				return nil, fmt.Errorf("idemd: key ring entry %d is not id=base64", len(keys))
			}
			id, b64 = trimRingSpace(id), trimRingSpace(b64)
			// The decoder skips line breaks, which no other client's does.
			key, err := base64.StdEncoding.Strict().DecodeString(b64)
			if err == nil && strings.ContainsAny(b64, "\r\n") {
				err = errors.New("a line break inside the key")
			}
			if err != nil {
				return nil, fmt.Errorf("idemd: key %q: not standard base64: %w", id, err)
			}
			keys = append(keys, SealKey{ID: id, Key: key})
		}
	}
	return NewKeyRing(keys...)
}

// trimRingSpace trims what the ring's text form counts as space: ASCII spaces, tabs
// and carriage returns, so that every client reads a ring alike.
func trimRingSpace(s string) string { return strings.Trim(s, " \t\r") }

// RequireSealed returns a ring that refuses plain results and recovery points with a
// SealError (SealMissing) instead of passing them through. A ring that allows them
// reads what was stored before sealing was turned on; one that requires them also
// stops whoever can write the store from slipping in a plain result of their own.
func (r *KeyRing) RequireSealed() *KeyRing {
	c := *r
	c.requireSealed = true
	return &c
}

// SealingKeyID is the id of the key that seals.
func (r *KeyRing) SealingKeyID() string { return r.sealWith.ID }

func validKeyID(id string) error {
	if id == "" || len(id) > sealMaxKeyID {
		return fmt.Errorf("key id %q: 1 to %d bytes", id, sealMaxKeyID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("key id %q: only letters, digits, '.', '_' and '-'", id)
		}
	}
	return nil
}

// What an envelope seals, bound into its associated data as one byte.
const (
	sealsCompleted = 'C'
	sealsFailed    = 'F'
	sealsPoint     = 'P'
	// sealsResultV1 is version 1's byte for a result, completed or failed alike.
	sealsResultV1 = 'R'
)

// sealContext is what an envelope is bound to besides its head.
type sealContext struct {
	tenant, key string
	// kind is sealsCompleted, sealsFailed or sealsPoint.
	kind byte
	// point is the recovery point's name; empty for a result, whose status binds it.
	point  string
	status int
}

// resultContext is the context of a result whose record is completed or failed.
func resultContext(tenant, key string, outcome Outcome, status int) sealContext {
	kind := byte(sealsCompleted)
	if outcome == Failed {
		kind = sealsFailed
	}
	return sealContext{tenant: tenant, key: key, kind: kind, status: status}
}

func pointContext(tenant, key, name string) sealContext {
	return sealContext{tenant: tenant, key: key, kind: sealsPoint, point: name}
}

// aad is the associated data of an envelope with head; the version in the head says
// how a result's outcome is bound (version 1 does not bind it).
func (c sealContext) aad(head []byte) []byte {
	b := make([]byte, 0, len(head)+9+len(c.tenant)+len(c.key)+len(c.point))
	b = append(b, head...)
	kind := c.kind
	if head[1] == sealV1 && kind != sealsPoint {
		kind = sealsResultV1
	}
	b = append(b, kind)
	b = appendString16(b, c.tenant)
	b = appendString16(b, c.key)
	if c.kind == sealsPoint {
		b = appendString16(b, c.point)
	} else {
		b = binary.BigEndian.AppendUint16(b, uint16(c.status))
	}
	return b
}

func appendString16(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func aeadFor(key cipherKey, salt []byte) (cipher.AEAD, error) {
	sub, err := hkdf.Key(sha256.New, key, salt, sealInfo, sealKeyLen)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(sub)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// seal makes an envelope of plaintext with the ring's sealing key; random gives the
// salt and nonce (crypto/rand outside the shared vectors' tests).
func (r *KeyRing) seal(ctx sealContext, plaintext []byte, random io.Reader) ([]byte, error) {
	return r.sealInPlace(ctx, append(r.envelope(len(plaintext)), plaintext...), random)
}

// envelope begins an envelope for n bytes of plaintext: its head, then room for the
// salt and nonce, with capacity for the plaintext to be appended and its tag.
func (r *KeyRing) envelope(n int) []byte { return r.envelopeOf(sealVersion, n) }

// envelopeOf is envelope in the given version; only the shared vectors' tests write
// version 1.
func (r *KeyRing) envelopeOf(version byte, n int) []byte {
	id := r.sealWith.ID
	head := 3 + len(id)
	env := make([]byte, head+sealSaltLen+sealNonceLen, head+sealSaltLen+sealNonceLen+n+sealTagLen)
	env[0], env[1], env[2] = sealMarker, version, byte(len(id))
	copy(env[3:], id)
	return env
}

// sealInPlace seals an envelope that envelope began and the plaintext was appended
// to: it draws the salt and nonce from random, and encrypts the plaintext where it
// is, so that a large result is not copied once more.
func (r *KeyRing) sealInPlace(ctx sealContext, env []byte, random io.Reader) ([]byte, error) {
	head := 3 + int(env[2])
	start := head + sealSaltLen + sealNonceLen
	if _, err := io.ReadFull(random, env[head:start]); err != nil {
		return nil, err
	}
	salt, nonce := env[head:head+sealSaltLen], env[head+sealSaltLen:start]
	aead, err := aeadFor(r.sealWith.Key, salt)
	if err != nil {
		return nil, err
	}
	// Seal's output overlaps its input exactly, as crypto/cipher allows.
	return aead.Seal(env[:start], nonce, env[start:], ctx.aad(env[:head])), nil
}

// envelopeHead reads an envelope's head: the key id it names, and its length, where
// the salt starts. Anything else (not an envelope, another version, shorter than the
// head, salt, nonce and tag) is SealInvalid, without a key id.
func envelopeHead(env []byte) (id string, head int, err error) {
	if len(env) < 3 || env[0] != sealMarker || env[1] != sealVersion && env[1] != sealV1 {
		return "", 0, &SealError{Reason: SealInvalid}
	}
	n := int(env[2])
	head = 3 + n
	if n == 0 || len(env) < head+sealSaltLen+sealNonceLen+sealTagLen {
		return "", 0, &SealError{Reason: SealInvalid}
	}
	return string(env[3:head]), head, nil
}

// open opens an envelope sealed under ctx with any key of the ring.
func (r *KeyRing) open(ctx sealContext, env []byte) ([]byte, error) {
	id, head, err := envelopeHead(env)
	if err != nil {
		return nil, err
	}
	key, ok := r.keys[id]
	if !ok {
		return nil, &SealError{Reason: SealUnknownKey, KeyID: id}
	}
	salt, nonce := env[head:head+sealSaltLen], env[head+sealSaltLen:head+sealSaltLen+sealNonceLen]
	aead, err := aeadFor(key, salt)
	if err != nil {
		return nil, err
	}
	plain, err := aead.Open(nil, nonce, env[head+sealSaltLen+sealNonceLen:], ctx.aad(env[:head]))
	if err != nil {
		return nil, &SealError{Reason: SealInvalid, KeyID: id}
	}
	return plain, nil
}

// unknownKey is what opening env gives a client without a ring: SealUnknownKey naming
// the envelope's key, or SealInvalid for what is not an envelope.
func unknownKey(env []byte) error {
	id, _, err := envelopeHead(env)
	if err != nil {
		return err
	}
	return &SealError{Reason: SealUnknownKey, KeyID: id}
}

// responsePlaintext is what a result's envelope holds: its headers, names in byte
// order and each name's values in order, then its body.
//
//	u16 names | per name: u16 len, name, u16 values, per value: u32 len, value | body
func responsePlaintext(h http.Header, body []byte) []byte {
	return appendResponsePlaintext(make([]byte, 0, responsePlaintextSize(h, body)), h, body)
}

func responsePlaintextSize(h http.Header, body []byte) int {
	n := 2 + len(body)
	for name, values := range h {
		n += 4 + len(name)
		for _, v := range values {
			n += 4 + len(v)
		}
	}
	return n
}

func appendResponsePlaintext(b []byte, h http.Header, body []byte) []byte {
	var small [8]string
	names := small[:0]
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.BigEndian.AppendUint16(b, uint16(len(names)))
	for _, name := range names {
		b = appendString16(b, name)
		b = binary.BigEndian.AppendUint16(b, uint16(len(h[name])))
		for _, v := range h[name] {
			b = binary.BigEndian.AppendUint32(b, uint32(len(v)))
			b = append(b, v...)
		}
	}
	return append(b, body...)
}

// parseResponsePlaintext reads what responsePlaintext wrote. An envelope that opened
// was sealed by a client, so a layout that does not read is SealInvalid as well. The
// body shares b.
func parseResponsePlaintext(b []byte) (http.Header, []byte, error) {
	invalid := func() (http.Header, []byte, error) { return nil, nil, &SealError{Reason: SealInvalid} }
	take := func(n int) ([]byte, bool) {
		if n > len(b) {
			return nil, false
		}
		s := b[:n]
		b = b[n:]
		return s, true
	}
	u16 := func() (int, bool) {
		s, ok := take(2)
		if !ok {
			return 0, false
		}
		return int(binary.BigEndian.Uint16(s)), true
	}
	names, ok := u16()
	if !ok {
		return invalid()
	}
	h := make(http.Header, names)
	for range names {
		n, ok := u16()
		if !ok {
			return invalid()
		}
		name, ok := take(n)
		if !ok {
			return invalid()
		}
		values, ok := u16()
		if !ok {
			return invalid()
		}
		vs := make([]string, 0, values)
		for range values {
			m, ok := take(4)
			if !ok {
				return invalid()
			}
			v, ok := take(int(binary.BigEndian.Uint32(m)))
			if !ok {
				return invalid()
			}
			vs = append(vs, string(v))
		}
		h[string(name)] = vs
	}
	return h, b, nil
}

// sealResponse seals a result's headers and body, bound to its status and outcome
// (Completed or Failed).
func (r *KeyRing) sealResponse(tenant, key string, outcome Outcome, resp Response, random io.Reader) ([]byte, error) {
	if err := sealable(resp.Header); err != nil {
		return nil, err
	}
	env := r.envelope(responsePlaintextSize(resp.Header, resp.Body))
	env = appendResponsePlaintext(env, resp.Header, resp.Body)
	return r.sealInPlace(resultContext(tenant, key, outcome, resp.Status), env, random)
}

// noResponseStatus is the status under which a failure without a response is stored
// sealed: a failed result whose envelope holds nothing, not even the count of header
// names every response's plaintext starts with.
const noResponseStatus = http.StatusInternalServerError

// sealNoResponse seals the result of a failure released without a response, so that
// a ring requiring sealing can tell it from a failure slipped into the store.
func (r *KeyRing) sealNoResponse(tenant, key string, random io.Reader) ([]byte, error) {
	return r.seal(resultContext(tenant, key, Failed, noResponseStatus), nil, random)
}

// sealable refuses headers the plaintext's lengths cannot count. idemd refuses far
// smaller ones; this keeps a result from being sealed into something else.
func sealable(h http.Header) error {
	if len(h) > math.MaxUint16 {
		return fmt.Errorf("idem: %d header names, over the %d a sealed result holds", len(h), math.MaxUint16)
	}
	for name, values := range h {
		if len(name) > math.MaxUint16 || len(values) > math.MaxUint16 {
			return fmt.Errorf("idem: header %.40q is too large to seal", name)
		}
		for _, v := range values {
			if uint64(len(v)) > math.MaxUint32 {
				return fmt.Errorf("idem: a value of header %.40q is too large to seal", name)
			}
		}
	}
	return nil
}

// openResponse opens the sealed result of a record whose outcome is Completed or
// Failed. It is nil for a failure sealed without a response (sealNoResponse).
func (r *KeyRing) openResponse(tenant, key string, outcome Outcome, status int, env []byte) (*Response, error) {
	plain, err := r.open(resultContext(tenant, key, outcome, status), env)
	if err != nil {
		return nil, err
	}
	if len(plain) == 0 && outcome == Failed && env[1] != sealV1 {
		return nil, nil
	}
	h, body, err := parseResponsePlaintext(plain)
	if err != nil {
		// It opened with the key it names, whose holder sealed something else.
		id, _, _ := envelopeHead(env)
		return nil, &SealError{Reason: SealInvalid, KeyID: id}
	}
	return &Response{Status: status, Header: h, Body: body}, nil
}

// sealPoint seals a recovery point's data, bound to its name.
func (r *KeyRing) sealPoint(tenant, key, name string, data []byte, random io.Reader) ([]byte, error) {
	return r.seal(pointContext(tenant, key, name), data, random)
}

// openPoint opens a recovery point's data. Data that is not an envelope is passed
// through, as recorded before sealing was turned on, unless the ring requires sealing.
func (r *KeyRing) openPoint(tenant, key, name string, data []byte) ([]byte, error) {
	if len(data) == 0 || data[0] != sealMarker {
		if r.requireSealed {
			return nil, &SealError{Reason: SealMissing}
		}
		return data, nil
	}
	return r.open(pointContext(tenant, key, name), data)
}

var cryptoRandom io.Reader = rand.Reader
