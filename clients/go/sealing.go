package idem

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// WithSealing seals what the client stores in idemd, with ring's first key, and opens
// what comes back with any of its keys (docs/sealing.md): the headers and body of
// every result it stores (Complete, Release in mode Fail, and through them Do, Once,
// Consume, Middleware and Completer), and the data of every recovery point it records
// (RecordRecoveryPoint, Lease.Checkpoint). idemd keeps the envelopes without being able
// to read them; the status of a result and the name of a point stay readable.
//
// tenant names the key space the client works in, its token's tenant ("default"
// without auth): it is bound into every envelope, so every client of one tenant must
// give the same name. New refuses an empty tenant or a nil ring.
//
// Answers are opened before any caller sees them: a claim that replays, the recovery
// point a lease starts from, Lookup. What does not open is a *SealError matching
// ErrUnsealable: sealed with a key the ring does not hold (SealUnknownKey), changed or
// moved in the store (SealInvalid), or plain under a ring that requires sealing
// (SealMissing, see KeyRing.RequireSealed). A plain result or point, stored before
// sealing was turned on, is passed through otherwise. A client without WithSealing
// that meets a sealed result gets SealUnknownKey naming the envelope's key; it hands a
// recovery point's data on as it is, since a point has no mark of its own.
//
// A sealed result takes 47 bytes more than its headers and body, plus the key id and
// the headers' lengths; a sealed recovery point 47 bytes plus the key id, which count
// against the daemon's --max-recovery-point-bytes.
func WithSealing(tenant string, ring *KeyRing) Option {
	return func(s *settings) { s.sealTenant, s.sealRing, s.sealing = tenant, ring, true }
}

// checkSealing refuses a WithSealing that could not seal.
func checkSealing(s *settings) error {
	switch {
	case !s.sealing:
		return nil
	case s.sealRing == nil:
		return errors.New("idem: WithSealing needs a key ring (ParseKeyRing or NewKeyRing)")
	case s.sealTenant == "":
		return errors.New(`idem: WithSealing needs the tenant's name, bound into every envelope ("default" without auth)`)
	case len(s.sealTenant) > 0xffff:
		return errors.New("idem: WithSealing: the tenant's name is over 65535 bytes")
	}
	return nil
}

// storedResponse is r as the client sends it for key: sealed when the client has a
// ring.
func (c *Client) storedResponse(key string, r Response) (idemapi.StoredResponse, error) {
	if c.ring == nil {
		return toStored(r), nil
	}
	env, err := c.ring.sealResponse(c.tenant, key, r, cryptoRandom)
	if err != nil {
		return idemapi.StoredResponse{}, fmt.Errorf("idem: sealing the result of %q: %w", key, err)
	}
	return idemapi.StoredResponse{Status: r.Status, Sealed: &env}, nil
}

// openResponse is the stored response of key as callers see it: opened when sealed.
func (c *Client) openResponse(key string, s *idemapi.StoredResponse) (*Response, error) {
	var err error
	switch {
	case s == nil:
		return nil, nil
	case s.Sealed != nil && c.ring == nil:
		err = unknownKey(*s.Sealed)
	case s.Sealed != nil:
		var h http.Header
		var body []byte
		if h, body, err = c.ring.openResponse(c.tenant, key, s.Status, *s.Sealed); err == nil {
			return &Response{Status: s.Status, Header: h, Body: body}, nil
		}
	case c.ring != nil && c.ring.requireSealed:
		err = &SealError{Reason: SealMissing}
	default:
		return fromStored(s), nil
	}
	return nil, fmt.Errorf("idem: the stored result of %q: %w", key, err)
}

// pointData is a recovery point's data as the client records it for key: sealed when
// the client has a ring, even when empty, so that a ring requiring sealing reads it.
func (c *Client) pointData(key, name string, data []byte) ([]byte, error) {
	if c.ring == nil {
		return data, nil
	}
	env, err := c.ring.sealPoint(c.tenant, key, name, data, cryptoRandom)
	if err != nil {
		return nil, fmt.Errorf("idem: sealing the recovery point %q of %q: %w", name, key, err)
	}
	return env, nil
}

// openPoint is the recovery point of key as callers see it: its data opened when
// sealed. Data that does not start with the envelope's marker is plain. A client
// without a ring passes every point through as it is: recovery points have no mark of
// their own, and plain data may start with any byte.
func (c *Client) openPoint(key string, p *idemapi.RecoveryPoint) (*RecoveryPoint, error) {
	rp := fromPoint(p)
	if rp == nil || c.ring == nil {
		return rp, nil
	}
	data, err := c.ring.openPoint(c.tenant, key, rp.Name, rp.Data)
	if err != nil {
		return nil, fmt.Errorf("idem: the recovery point %q of %q: %w", rp.Name, key, err)
	}
	if len(data) == 0 {
		data = nil
	}
	rp.Data = data
	return rp, nil
}
