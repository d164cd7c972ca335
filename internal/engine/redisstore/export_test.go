package redisstore

// Queued is how many calls wait for a pipeline, for tests that arrange a batch.
func (s *Store) Queued() int { return s.pipe.queued() }
