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

// DropPendingIndex removes the index of pending records, as a database written by a
// release before the abandoned-keys feed has none. The store must be closed.
func DropPendingIndex(path string) error {
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket(bucketPending) })
}

// PendingEntries counts the entries of the pending index.
func PendingEntries(s *Store) (int, error) {
	n := 0
	err := s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketPending).Stats().KeyN
		return nil
	})
	return n, err
}
