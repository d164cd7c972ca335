package idem

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"time"

	"github.com/idemd/idemd/clients/go/idemapi"
)

// AbandonedOptions select a page of the abandoned-keys feed; the zero value asks for
// the first page of every key, 100 keys at most.
type AbandonedOptions struct {
	// Prefix keeps the keys that begin with it (at most 255 bytes); "" keeps all.
	Prefix string
	// OlderThan keeps the keys whose lease ran out at least this long ago.
	OlderThan time.Duration
	// Limit bounds the keys of the page, 1 to 1000; 0 leaves it to idemd (100).
	Limit int
	// Cursor is the Next of the page before, read with the same Prefix; "" for the
	// first page.
	Cursor string
}

// AbandonedKey is a key whose holder left it pending: its lease ran out and nobody has
// claimed it since.
type AbandonedKey struct {
	Key string
	// Attempt is the attempt of the holder that left it; a claim now is the next.
	Attempt int64
	// Fingerprint is the key's fingerprint, which a claim must carry to acquire it;
	// "" when it has none, and a claim must then carry none.
	Fingerprint string
	// Owner is the owner label of that holder's claim.
	Owner string
	// LeaseExpiredAt is when its lease ran out, by idemd's clock.
	LeaseExpiredAt time.Time
	// RecoveryPoint is the name of the last recovery point recorded, "" for none; a
	// claim of the key receives the whole point, its data opened when it is sealed
	// (names are never sealed).
	RecoveryPoint string
}

// AbandonedPage is one page of the feed. Next is the cursor of the next page, "" at
// the end. A page may hold fewer keys than its limit, even none, and still have a
// Next: idemd bounds the work one page costs.
type AbandonedPage struct {
	Keys []AbandonedKey
	Next string
}

// Abandoned reads a page of the abandoned-keys feed: the caller's keys that are
// pending under a lease that ran out, which their holders died or were cut off
// holding. To finish them, claim each with its Fingerprint (the claim decides who
// finishes a key: one renewed or taken over since the page was read answers
// ErrInProgress), or let a Completer do it. Read until Next is "", or range over
// AbandonedKeys.
func (c *Client) Abandoned(ctx context.Context, opts AbandonedOptions) (AbandonedPage, error) {
	ctx, cancel := c.callContext(ctx, 0)
	defer cancel()
	params := idemapi.ListAbandonedParams{Prefix: ptr(opts.Prefix), Limit: ptr(opts.Limit), Cursor: ptr(opts.Cursor)}
	if opts.OlderThan > 0 {
		// Whole milliseconds, rounded up: never a lease that ran out more recently
		// than asked.
		ms := int64((opts.OlderThan + time.Millisecond - 1) / time.Millisecond)
		params.OlderThanMs = &ms
	}
	resp, err := c.api.ListAbandoned(ctx, &params, c.authorize)
	if err != nil {
		return AbandonedPage{}, transportError(err)
	}
	var out idemapi.AbandonedKeys
	if err := decode(resp, &out, http.StatusOK); err != nil {
		return AbandonedPage{}, err
	}
	if out.Keys == nil {
		// Not idemd's answer (a wrong base URL): an empty feed would hide that.
		return AbandonedPage{}, fmt.Errorf("idem: the abandoned-keys feed was answered %d without keys; is the base URL idemd's?", resp.StatusCode)
	}
	page := AbandonedPage{Keys: make([]AbandonedKey, 0, len(out.Keys))}
	for _, k := range out.Keys {
		ak := AbandonedKey{Key: k.Key, Attempt: k.Attempt, LeaseExpiredAt: k.LeaseExpiredAt}
		if k.Fingerprint != nil {
			ak.Fingerprint = *k.Fingerprint
		}
		if k.Owner != nil {
			ak.Owner = *k.Owner
		}
		if k.RecoveryPoint != nil {
			ak.RecoveryPoint = *k.RecoveryPoint
		}
		page.Keys = append(page.Keys, ak)
	}
	if out.NextCursor != nil {
		page.Next = *out.NextCursor
	}
	return page, nil
}

// errCursorLoop is a feed whose next page would be the one just read.
var errCursorLoop = errors.New("idem: the abandoned-keys feed answered the cursor it was given as the next one")

// AbandonedKeys ranges over every page of the abandoned-keys feed from opts.Cursor on,
// reading each page as the range reaches it. A page that cannot be read ends the
// range with its error as the last pair.
func (c *Client) AbandonedKeys(ctx context.Context, opts AbandonedOptions) iter.Seq2[AbandonedKey, error] {
	return func(yield func(AbandonedKey, error) bool) {
		for {
			page, err := c.Abandoned(ctx, opts)
			if err != nil {
				yield(AbandonedKey{}, err)
				return
			}
			for _, k := range page.Keys {
				if !yield(k, nil) {
					return
				}
			}
			switch page.Next {
			case "":
				return
			case opts.Cursor:
				// A feed that never moves on would be read forever.
				yield(AbandonedKey{}, errCursorLoop)
				return
			}
			opts.Cursor = page.Next
		}
	}
}
