package idem

import (
	"errors"
	"fmt"

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
// A failure released without a response is stored sealed all the same, as an
// envelope that holds nothing under status 500, and read back as a failure without a
// response.
//
// Answers are opened before any caller sees them: a claim that replays, the recovery
// point a lease starts from, Lookup. What does not open is a *SealError matching
// ErrUnsealable: sealed with a key the ring does not hold (SealUnknownKey), changed or
// moved in the store, or moved between a completed and a failed record (SealInvalid),
// or plain, or finished without a result, under a ring that requires sealing
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

// storedResponse is r as the client sends it for key, a result of outcome (Completed
// or Failed): sealed when the client has a ring. A ring seals a failure without a
// response as well (r nil), so that every result a sealing client stores is sealed;
// without a ring, that failure is stored without a response.
func (c *Client) storedResponse(key string, outcome Outcome, r *Response) (*idemapi.StoredResponse, error) {
	if c.ring == nil {
		if r == nil {
			return nil, nil
		}
		s := toStored(*r)
		return &s, nil
	}
	var env []byte
	var err error
	status := noResponseStatus
	if r == nil {
		env, err = c.ring.sealNoResponse(c.tenant, key, cryptoRandom)
	} else {
		status = r.Status
		env, err = c.ring.sealResponse(c.tenant, key, outcome, *r, cryptoRandom)
	}
	if err != nil {
		return nil, fmt.Errorf("idem: sealing the result of %q: %w", key, err)
	}
	return &idemapi.StoredResponse{Status: status, Sealed: &env}, nil
}

// openResponse is the stored response of key, a record in state (completed, failed,
// or one not finished), as callers see it: opened when sealed. Under a ring that
// requires sealing, a finished record must carry an envelope: a sealing client stores
// one even for a failure without a response.
func (c *Client) openResponse(key, state string, s *idemapi.StoredResponse) (*Response, error) {
	var err error
	finished := state == string(Completed) || state == string(Failed)
	switch {
	case s == nil && finished && c.ring != nil && c.ring.requireSealed:
		err = &SealError{Reason: SealMissing}
	case s == nil:
		return nil, nil
	case s.Sealed != nil && c.ring == nil:
		err = unknownKey(*s.Sealed)
	case s.Sealed != nil:
		var r *Response
		if r, err = c.ring.openResponse(c.tenant, key, Outcome(state), s.Status, *s.Sealed); err == nil {
			return r, nil
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
