package soak

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// ack is a completion idemd acknowledged: its key must be found completed with body
// until `until`.
type ack struct {
	key   string
	body  []byte
	until time.Time
}

// ackBook remembers acknowledged completions, bounded: every one of the first phase
// (up to firstMax), kept for the whole run, and the most recent ones in a ring.
type ackBook struct {
	mu       sync.Mutex
	first    []ack
	firstMax int
	ring     []ack
	next     int
	filled   bool
	lost     map[string]string
	// lostOrder keeps the lost keys in the order they were found, for the report.
	lostOrder []string
}

func newAckBook(firstMax, ringSize int) *ackBook {
	return &ackBook{firstMax: firstMax, ring: make([]ack, ringSize), lost: map[string]string{}}
}

func (b *ackBook) add(a ack, first bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if first && len(b.first) < b.firstMax {
		b.first = append(b.first, a)
		return
	}
	b.ring[b.next] = a
	b.next = (b.next + 1) % len(b.ring)
	if b.next == 0 {
		b.filled = true
	}
}

// pick returns a random recent acknowledgement still kept after by.
func (b *ackBook) pick(by time.Time) (ack, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.next
	if b.filled {
		n = len(b.ring)
	}
	// A few tries find a live one among the recent: most of the ring is live when the
	// retention is longer than the ring takes to fill.
	for try := 0; try < 4 && n > 0; try++ {
		a := b.ring[rand.IntN(n)]
		if a.until.After(by) {
			return a, true
		}
	}
	return ack{}, false
}

// lose records that a's acknowledged completion is gone, once per key.
func (b *ackBook) lose(a ack, why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, seen := b.lost[a.key]; !seen {
		b.lost[a.key] = why
		b.lostOrder = append(b.lostOrder, a.key+": "+why)
	}
}

func (b *ackBook) lostCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.lost)
}

func (b *ackBook) lostKeys(max int) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.lostOrder[:min(max, len(b.lostOrder))]...)
}

// live returns the acknowledgements still kept after by.
func (b *ackBook) live(by time.Time) []ack {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []ack
	for _, list := range [][]ack{b.first, b.ring} {
		for _, a := range list {
			if a.key != "" && a.until.After(by) {
				out = append(out, a)
			}
		}
	}
	return out
}

// checkResult is what one pass of lookups over the book found.
type checkResult struct {
	Checked   int `json:"checked"`
	Unchecked int `json:"unchecked"`
	Lost      int `json:"lost"`
}

// check looks every live acknowledgement up, with parallel lookups, and records those
// found missing or changed as lost. A lookup that fails (a fault) leaves its key
// unchecked this time; it is looked up again at the next sample if still kept.
func (b *ackBook) check(ctx context.Context, client *http.Client, base string, parallel int) checkResult {
	acks := b.live(time.Now())
	var (
		mu  sync.Mutex
		res checkResult
		wg  sync.WaitGroup
	)
	next := make(chan ack)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a := range next {
				verdict := lookupAck(ctx, client, base, a)
				mu.Lock()
				switch verdict {
				case "":
					res.Checked++
				case "unchecked":
					res.Unchecked++
				default:
					res.Checked++
					res.Lost++
					b.lose(a, verdict)
				}
				mu.Unlock()
			}
		}()
	}
	for _, a := range acks {
		select {
		case next <- a:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	return res
}

// lookupAck returns "" when a's record holds its result, "unchecked" when the lookup
// could not tell (a fault, or the retention passing meanwhile), or why it is lost.
func lookupAck(ctx context.Context, client *http.Client, base string, a ack) string {
	sent := time.Now()
	if !a.until.After(sent) {
		return "unchecked"
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(lctx, "GET", base+"/v1/records/"+url.PathEscape(a.key), nil)
	if err != nil {
		return "unchecked"
	}
	resp, err := client.Do(req)
	if err != nil {
		return "unchecked"
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var rec keyRecord
		if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
			return "unchecked"
		}
		if rec.State != "completed" || rec.Response == nil || !bytes.Equal(rec.Response.Body, a.body) {
			return fmt.Sprintf("a lookup found it %s", rec.State)
		}
		return ""
	case http.StatusNotFound:
		return "a lookup found no record"
	default:
		return "unchecked"
	}
}
