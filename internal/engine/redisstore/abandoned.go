package redisstore

import (
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// The abandoned-keys feed reads the pending indexes (indexKey) of a tenant slot by
// slot, each in the order of its lease expiries, and looks up the records whose lease
// ran out. It reads only the slots the tenant's due index (due.go) says may hold such
// a lease, in pipelines of indexBatch: a page costs what it reads of pending keys,
// never what the other records, the live leases or the empty slots would.
const (
	slots      = 16384
	indexBatch = 2048
	// maxPendingScan bounds the index entries one page reads, so that a tenant with
	// many abandoned keys under other prefixes answers in bounded time; the page then
	// ends early with a cursor.
	maxPendingScan = 10000
)

// feedPos is where a page of the feed starts: a slot and, within it, the entry after
// (score, member) when after is set. A cursor is its text form.
type feedPos struct {
	slot   int
	after  bool
	score  int64
	member string
}

func (p feedPos) cursor() string {
	if !p.after {
		return strconv.Itoa(p.slot)
	}
	return strconv.Itoa(p.slot) + ":" + strconv.FormatInt(p.score, 10) + ":" +
		base64.RawURLEncoding.EncodeToString([]byte(p.member))
}

func parseFeedPos(cursor string) (feedPos, error) {
	if cursor == "" {
		return feedPos{}, nil
	}
	parts := strings.Split(cursor, ":")
	slot, err := strconv.Atoi(parts[0])
	if err != nil || slot < 0 || slot >= slots || (len(parts) != 1 && len(parts) != 3) {
		return feedPos{}, engine.ErrBadCursor
	}
	if len(parts) == 1 {
		return feedPos{slot: slot}, nil
	}
	score, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return feedPos{}, engine.ErrBadCursor
	}
	member, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(member) > engine.MaxKeyBytes {
		return feedPos{}, engine.ErrBadCursor
	}
	return feedPos{slot: slot, after: true, score: score, member: string(member)}, nil
}

// candidate is an index entry whose lease ran out, at its position.
type candidate struct {
	pos feedPos
}

// Abandoned implements engine.Store. It reads only the slots that the tenant's due index
// (due.go) scores up to q.Before, in the order of their numbers, as the cursor says.
func (s *Store) Abandoned(ctx context.Context, q engine.AbandonedQuery) (engine.AbandonedPage, error) {
	pos, err := parseFeedPos(q.Cursor)
	if err != nil {
		return engine.AbandonedPage{}, err
	}
	before := q.Before.UnixMilli()
	due, err := s.dueSlots(ctx, q.Tenant, before)
	if err != nil {
		return engine.AbandonedPage{}, err
	}
	slices.Sort(due)
	var stale []uint16
	page, err := s.readDueSlots(ctx, q, pos, before, due, &stale)
	// Raised whether the page ends or fails: what the page read holds.
	s.raiseDue(ctx, q.Tenant, stale)
	return page, err
}

// readDueSlots reads the page from pos on, in the slots of due, and adds to stale the
// slots it found holding no entry up to before.
func (s *Store) readDueSlots(ctx context.Context, q engine.AbandonedQuery, pos feedPos, before int64, due []uint16, stale *[]uint16) (engine.AbandonedPage, error) {
	var page engine.AbandonedPage
	scanned := 0
	for {
		i, _ := slices.BinarySearch(due, uint16(min(pos.slot, slots-1)))
		if pos.slot >= slots || i == len(due) {
			return page, nil
		}
		if int(due[i]) != pos.slot {
			// The slot of the cursor no longer holds a lease that ran out.
			pos = feedPos{slot: int(due[i])}
		}
		if scanned >= maxPendingScan {
			page.Next = pos.cursor()
			return page, nil
		}
		cands, next, n, empty, err := s.readIndexes(ctx, q, pos, due[i:min(i+indexBatch, len(due))], before)
		*stale = append(*stale, empty...)
		if err != nil {
			return engine.AbandonedPage{}, err
		}
		scanned += n
		// Looked up a page's worth at a time, so that a page costs lookups of about the
		// keys it answers.
		for len(cands) > 0 {
			chunk := cands[:min(len(cands), q.Limit-len(page.Keys))]
			cands = cands[len(chunk):]
			keys, err := s.confirm(ctx, q, chunk, before)
			if err != nil {
				return engine.AbandonedPage{}, err
			}
			for i, k := range keys {
				if k == nil {
					continue
				}
				page.Keys = append(page.Keys, *k)
				if len(page.Keys) == q.Limit {
					page.Next = chunk[i].pos.cursor()
					return page, nil
				}
			}
		}
		pos = next
	}
}

// readIndexes reads the indexes of batch (slots in order, the first pos's), in one
// pipeline, and returns the entries under the query's prefix whose lease ran out, in
// feed order; where the next read starts; how many entries it read; and the slots it
// read whole that hold no entry up to before. It stops after a slot whose index may
// hold more than it read, so that the next read goes on inside that slot.
func (s *Store) readIndexes(ctx context.Context, q engine.AbandonedQuery, pos feedPos, batch []uint16, before int64) ([]candidate, feedPos, int, []uint16, error) {
	fetch := int64(q.Limit) + 64
	p := s.client.Pipeline()
	cmds := make([]*redis.ZSliceCmd, len(batch))
	for i, slot := range batch {
		start := "-inf"
		if i == 0 && pos.after {
			start = strconv.FormatInt(pos.score, 10)
		}
		cmds[i] = p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: indexKey(q.Tenant, slot),
			Start: start, Stop: strconv.FormatInt(before, 10), ByScore: true, Count: fetch})
	}
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, pos, 0, nil, s.failed(ctx, err)
	}
	var cands []candidate
	var empty []uint16
	read := 0
	for i, cmd := range cmds {
		slot := int(batch[i])
		entries := cmd.Val()
		last := feedPos{slot: slot}
		if i == 0 && pos.after {
			last = pos
		} else if len(entries) == 0 {
			empty = append(empty, batch[i])
		}
		for _, z := range entries {
			member, _ := z.Member.(string)
			score := int64(z.Score)
			if i == 0 && pos.after && (score < pos.score || score == pos.score && member <= pos.member) {
				continue
			}
			read++
			last = feedPos{slot: slot, after: true, score: score, member: member}
			if strings.HasPrefix(member, q.Prefix) {
				cands = append(cands, candidate{pos: last})
			}
		}
		if int64(len(entries)) == fetch {
			// The slot may hold more: the next read goes on from its last entry. A run of
			// fetch entries that all tie with the cursor cannot be read past this way;
			// the next read then moves on to the next slot rather than loop.
			if last == pos {
				return cands, feedPos{slot: slot + 1}, read, empty, nil
			}
			return cands, last, read, empty, nil
		}
	}
	return cands, feedPos{slot: int(batch[len(batch)-1]) + 1}, read, empty, nil
}

// confirm looks up the candidates' records, all at once through the pipelines, and
// answers each as an abandoned key, or nil when its record is no longer pending under
// a lease that ran out. It drops the index entries of records that are gone.
func (s *Store) confirm(ctx context.Context, q engine.AbandonedQuery, cands []candidate, before int64) ([]*engine.AbandonedKey, error) {
	keys := make([]*engine.AbandonedKey, len(cands))
	errs := make([]error, len(cands))
	gone := make([]bool, len(cands))
	var wg sync.WaitGroup
	for i, c := range cands {
		wg.Go(func() {
			rec, err := s.Lookup(ctx, engine.ID{Tenant: q.Tenant, Key: c.pos.member})
			switch {
			case errors.Is(err, engine.ErrNotFound), errors.Is(err, engine.ErrStoreMoved):
				// Gone, or handed over to another store by a live move: not pending
				// here, whatever the entry says.
				gone[i] = true
			case err != nil:
				errs[i] = err
			case rec.State == engine.StatePending && rec.LeaseExpiresAt.UnixMilli() <= before:
				k := &engine.AbandonedKey{Key: c.pos.member, Attempt: rec.Attempt, Fingerprint: rec.Fingerprint, Owner: rec.Owner,
					LeaseExpiredAt: rec.LeaseExpiresAt}
				if rec.RecoveryPoint != nil {
					k.Point = rec.RecoveryPoint.Name
				}
				keys[i] = k
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	p := s.client.Pipeline()
	drop := 0
	for i, c := range cands {
		if gone[i] {
			p.ZRem(ctx, indexKey(q.Tenant, uint16(c.pos.slot)), c.pos.member)
			drop++
		}
	}
	if drop > 0 {
		// An entry left behind costs memory, not correctness: a failure here waits for
		// the next page.
		_, _ = p.Exec(ctx)
	}
	return keys, nil
}

// failed translates a failure of a call the store made outside the scripts.
func (s *Store) failed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	s.reloadOnNetworkError(err)
	return engine.Unavailable(err)
}
