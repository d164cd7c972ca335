package engine

import (
	"context"
	"sync"
)

// This file is what a store offers to move many keys in one round trip: the live
// move's copier and Copy send the steps of a batch of keys together rather than one
// key's at a time. Each key's step is the same atomic step it is alone (one script on
// the record's keys, one transition in a bbolt transaction), so every guarantee of one
// key's handover or import holds for each key of a batch.

// MoveKey names a key to hand over: its tenant, the SHA-256 of the client's key, and
// the client's key where the store knows it ("" otherwise).
type MoveKey struct {
	Tenant string
	Digest [32]byte
	Key    string
}

// MovedOut is what MoveOut did with one key of a batch: Record is set when Outcome is
// MoveHandingOver.
type MovedOut struct {
	Outcome MoveOutcome
	Record  *Exported
	Err     error
}

// Imported is what Import did with one record of a batch.
type Imported struct {
	Outcome ImportOutcome
	Err     error
}

// BatchImporter is a Porter that imports many records at once, each as Import alone.
type BatchImporter interface {
	ImportBatch(ctx context.Context, es []Exported) []Imported
}

// importersAlone is how many records ImportAll imports at once into a store that
// imports one at a time.
const importersAlone = 64

// ImportAll imports es into to, in one batch where to is a BatchImporter, else
// importersAlone records at a time, and answers each record's outcome in es's order.
func ImportAll(ctx context.Context, to Porter, es []Exported) []Imported {
	if b, ok := to.(BatchImporter); ok {
		return b.ImportBatch(ctx, es)
	}
	out := make([]Imported, len(es))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(importersAlone, len(es)) {
		wg.Go(func() {
			for i := range next {
				out[i].Outcome, out[i].Err = to.Import(ctx, es[i])
			}
		})
	}
	for i := range es {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}
