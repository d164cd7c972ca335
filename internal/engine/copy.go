package engine

import (
	"context"
	"sync"
	"time"
)

// CopyProgress is how far a copy between two stores got.
type CopyProgress struct {
	// Read counts the records read from the source; the others count what the target
	// did with them, as Import says.
	Read, Written, Same, Kept, Expired int64
	// Total is about how many records the source held when the copy began (its
	// Records), 0 when it cannot say.
	Total   int64
	Elapsed time.Duration
	// KeptIDs names the first thousand records the target kept, without their
	// responses: the target held another record of their keys.
	KeptIDs []Exported
}

// Rate is the records imported per second so far.
func (p CopyProgress) Rate() float64 {
	if p.Elapsed <= 0 {
		return 0
	}
	return float64(p.Written+p.Same+p.Kept+p.Expired) / p.Elapsed.Seconds()
}

// Left is about how many records are still to copy.
func (p CopyProgress) Left() int64 {
	return max(p.Total-(p.Written+p.Same+p.Kept+p.Expired), 0)
}

// ToGo is about how long the rest takes at the rate so far; 0 when unknown.
func (p CopyProgress) ToGo() time.Duration {
	rate := p.Rate()
	if rate <= 0 || p.Total == 0 {
		return 0
	}
	return time.Duration(float64(p.Left()) / rate * float64(time.Second))
}

// Counter is a store that says about how many records it holds, cheaply.
type Counter interface {
	Records(ctx context.Context) (int64, error)
}

// A copy imports records in batches, so that a Redis target takes a batch in one
// pipeline (one to each master of a Cluster) and the embedded store in one commit;
// copyWorkers batches are imported at once, so that the export, the target and the
// copier work at the same time. A batch holds at most copyBatch records or about
// copyBatchBytes of them, which with the queue between the export and the workers
// bounds the records in memory.
const (
	copyWorkers    = 4
	copyBatch      = 512
	copyBatchBytes = 4 << 20
)

// Copy imports every live record of from into to, with lease tokens and all, and calls
// progress every so often and at the end. It is for stores that no daemon serves while
// it runs: a record changed in from after Copy read it is not copied again, and a key
// acquired in to while from still holds it would be acquired twice. Run again after an
// interruption, it writes what is missing and finds the rest as it left it (Same).
func Copy(ctx context.Context, from, to Porter, every time.Duration, progress func(CopyProgress)) (CopyProgress, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		p        CopyProgress
		firstErr error
		wg       sync.WaitGroup
	)
	if c, ok := from.(Counter); ok {
		if n, err := c.Records(ctx); err == nil {
			p.Total = n
		}
	}
	start := time.Now()
	last := start
	queue := make(chan []Exported, copyWorkers)
	for range copyWorkers {
		wg.Go(func() {
			for batch := range queue {
				results := ImportAll(ctx, to, batch)
				mu.Lock()
				for i, r := range results {
					if r.Err != nil {
						if firstErr == nil {
							firstErr = r.Err
							cancel()
						}
						continue
					}
					switch r.Outcome {
					case ImportWritten:
						p.Written++
					case ImportSame:
						p.Same++
					case ImportExpired:
						p.Expired++
					case ImportKept:
						p.Kept++
						if len(p.KeptIDs) < 1000 {
							e := batch[i]
							e.Response, e.RecoveryPoint = nil, nil
							p.KeptIDs = append(p.KeptIDs, e)
						}
					}
				}
				if now := time.Now(); progress != nil && now.Sub(last) >= every {
					last = now
					p.Elapsed = now.Sub(start)
					progress(p)
				}
				mu.Unlock()
			}
		})
	}
	var batch []Exported
	size := 0
	send := func() error {
		if len(batch) == 0 {
			return nil
		}
		select {
		case queue <- batch:
			batch, size = nil, 0
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := from.Export(ctx, func(e Exported) error {
		mu.Lock()
		p.Read++
		mu.Unlock()
		batch = append(batch, e)
		if size += recordBytes(e); len(batch) < copyBatch && size < copyBatchBytes {
			return nil
		}
		return send()
	})
	if err == nil {
		err = send()
	}
	close(queue)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if firstErr != nil {
		err = firstErr
	}
	p.Elapsed = time.Since(start)
	if progress != nil {
		progress(p)
	}
	return p, err
}

// recordBytes is about how much memory e holds.
func recordBytes(e Exported) int {
	n := 256 + len(e.ID.Key) + len(e.Fingerprint) + len(e.Owner)
	if r := e.Response; r != nil {
		n += len(r.Body)
		for k, vs := range r.Headers {
			n += len(k)
			for _, v := range vs {
				n += len(v)
			}
		}
	}
	if rp := e.RecoveryPoint; rp != nil {
		n += len(rp.Name) + len(rp.Data)
	}
	return n
}
