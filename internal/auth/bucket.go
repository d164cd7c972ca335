package auth

import (
	"sync"
	"time"
)

// bucket is a token bucket: it holds up to burst tokens, gains rate tokens a second, and
// each request takes one. It is small enough that a dependency would buy nothing.
type bucket struct {
	rate  float64
	burst float64

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int, now time.Time) *bucket {
	return &bucket{rate: rate, burst: float64(burst), tokens: float64(burst), last: now}
}

// take takes one token at now and returns 0, or takes nothing and returns how long
// until a token will be there.
func (b *bucket) take(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	// A clock that steps back adds nothing rather than draining the bucket.
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.tokens = min(b.burst, b.tokens+elapsed.Seconds()*b.rate)
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	wait := time.Duration((1 - b.tokens) / b.rate * float64(time.Second))
	return max(wait, time.Millisecond)
}
