package idem

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// RecoveryPoint is how far a holder of a key got, as it recorded it (Lease.Checkpoint,
// Client.RecordRecoveryPoint): the next acquisition of the key receives it, so that
// the work resumes from there instead of starting over.
type RecoveryPoint struct {
	// Name is the point reached, for example "charged".
	Name string
	// Data is what the holder recorded with it, nil when it recorded nothing.
	Data []byte
	// Attempt is the attempt of the holder that recorded it.
	Attempt int64
	// RecordedAt is when idemd recorded it, by idemd's clock.
	RecordedAt time.Time
}

func fromPoint(p *idemapi.RecoveryPoint) *RecoveryPoint {
	if p == nil {
		return nil
	}
	rp := &RecoveryPoint{Name: p.Name, Attempt: p.Attempt, RecordedAt: p.RecordedAt}
	if p.Data != nil && len(*p.Data) > 0 {
		rp.Data = *p.Data
	}
	return rp
}

// RecordRecoveryPoint records a recovery point for key under the lease token: name
// (1 to 128 bytes of UTF-8) and data (at most the daemon's --max-recovery-point-bytes,
// 4096 by default; nil records none). It replaces the point recorded before; the next
// acquisition of the key receives it in Claim.RecoveryPoint. It returns ErrLeaseLost
// when token is no longer the key's lease or the key is not pending, ErrNotFound when
// the key is gone, and a *Problem matching ErrPayloadTooLarge for data over the limit.
// Repeating it is safe. A client with WithSealing seals data (even nil), which makes it
// 47 bytes and the key id longer against the limit. Work run by Do, Consume, Middleware or a Completer records
// through its lease instead (Lease.Checkpoint), which also ends the lease when idemd
// says it is lost.
//
// A recovery point is never part of a batch: the contract has no batch item for it,
// so it always goes as a request of its own.
func (c *Client) RecordRecoveryPoint(ctx context.Context, key, token, name string, data []byte) error {
	data, err := c.pointData(key, name, data)
	if err != nil {
		return err
	}
	ctx, cancel := c.callContext(ctx, 0)
	defer cancel()
	body := idemapi.RecoveryPointRequest{Key: key, LeaseToken: token, Name: name}
	if len(data) > 0 {
		body.Data = &data
	}
	resp, err := c.api.RecordRecoveryPoint(ctx, body, c.authorize)
	if err != nil {
		return transportError(err)
	}
	// The record is read only to know the answer is idemd's: the point is the caller's.
	var rec struct {
		State string `json:"state"`
	}
	if err := decode(resp, &rec, http.StatusOK); err != nil {
		return err
	}
	if rec.State == "" {
		return fmt.Errorf("idem: the recovery point was answered %d without the record; is the base URL idemd's?", resp.StatusCode)
	}
	return nil
}
