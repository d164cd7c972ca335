package idem

// QueuedCalls is how many calls of c wait for the batch in flight to return.
func QueuedCalls(c *Client) int {
	if c.batches == nil {
		return 0
	}
	c.batches.mu.Lock()
	defer c.batches.mu.Unlock()
	return len(c.batches.queue)
}
