package boltstore

import (
	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
)

// OnTx makes the commit loop call f before each write transaction of transitions, with
// their number. f runs on the loop, so a test that blocks in it holds every commit.
// Set it before the first transition.
func OnTx(s *Store, f func(size int)) { s.commits.onTx = f }

// Queued is how many transitions wait for a group.
func Queued(s *Store) int {
	s.commits.mu.Lock()
	defer s.commits.mu.Unlock()
	return len(s.commits.queue)
}

// Closing reports whether the store refuses new transitions.
func Closing(s *Store) bool {
	s.commits.mu.Lock()
	defer s.commits.mu.Unlock()
	return s.commits.closed
}

// Corrupt stores an undecodable record for id, so that a transition on it fails.
func Corrupt(s *Store, id engine.ID) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRecords).Put(recordKey(id), []byte("{not json"))
	})
}
