package redisstore

import (
	"context"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// The abandoned-keys feed reads the pending indexes (indexKey) of a tenant slot by
// slot, each in the order of its lease expiries, and looks up the records whose lease
// ran out. Slots whose index is absent cost one empty ZRANGE each, sent in pipelines of
// indexBatch: a page costs that constant, plus what it reads of pending keys, never
// what the other records would.
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

// Abandoned implements engine.Store.
func (s *Store) Abandoned(ctx context.Context, q engine.AbandonedQuery) (engine.AbandonedPage, error) {
	pos, err := parseFeedPos(q.Cursor)
	if err != nil {
		return engine.AbandonedPage{}, err
	}
	before := q.Before.UnixMilli()
	var page engine.AbandonedPage
	scanned := 0
	for pos.slot < slots {
		if scanned >= maxPendingScan {
			page.Next = pos.cursor()
			return page, nil
		}
		cands, next, n, err := s.readIndexes(ctx, q, pos, before)
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
	return page, nil
}

// readIndexes reads the indexes from pos on, in one pipeline, and returns the entries
// under the query's prefix whose lease ran out, in feed order; where the next read
// starts; and how many entries it read. It stops after a slot whose index may hold
// more than it read, so that the next read goes on inside that slot.
func (s *Store) readIndexes(ctx context.Context, q engine.AbandonedQuery, pos feedPos, before int64) ([]candidate, feedPos, int, error) {
	fetch := int64(q.Limit) + 64
	n := min(indexBatch, slots-pos.slot)
	p := s.client.Pipeline()
	cmds := make([]*redis.ZSliceCmd, n)
	for i := range n {
		start := "-inf"
		if i == 0 && pos.after {
			start = strconv.FormatInt(pos.score, 10)
		}
		cmds[i] = p.ZRangeArgsWithScores(ctx, redis.ZRangeArgs{Key: indexKey(q.Tenant, uint16(pos.slot+i)),
			Start: start, Stop: strconv.FormatInt(before, 10), ByScore: true, Count: fetch})
	}
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, pos, 0, s.failed(ctx, err)
	}
	var cands []candidate
	read := 0
	for i, cmd := range cmds {
		slot := pos.slot + i
		entries := cmd.Val()
		last := feedPos{slot: slot}
		if i == 0 && pos.after {
			last = pos
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
				return cands, feedPos{slot: slot + 1}, read, nil
			}
			return cands, last, read, nil
		}
	}
	return cands, feedPos{slot: pos.slot + n}, read, nil
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
