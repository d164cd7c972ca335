package idem

import (
	"encoding/json"
	"reflect"
	"time"
)

// QueuedCalls is how many calls of c wait for the batch in flight to return.
func QueuedCalls(c *Client) int {
	if c.batches == nil {
		return 0
	}
	c.batches.mu.Lock()
	defer c.batches.mu.Unlock()
	return len(c.batches.queue)
}

// ReadsBatchAnswer reports whether the one-pass reader of batch answers reads body
// itself, and whether it reads it exactly as encoding/json does.
func ReadsBatchAnswer(body []byte) (fast, same bool) {
	var got, want batchResults
	fast = fastBatchResults(body, &got)
	err := json.Unmarshal(body, &want)
	return fast, err == nil && reflect.DeepEqual(got, want)
}

// RenewalRetry is the delay before a failed renewal is tried again, for a lease with
// left to its deadline.
func RenewalRetry(lease, left time.Duration) time.Duration { return renewalRetry(lease, left) }
