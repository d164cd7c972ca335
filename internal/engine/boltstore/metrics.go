package boltstore

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/idemd/idemd/internal/engine"
)

// stateCounts counts the records by state. It is loaded once at open and moved after
// each commit; records past retention count until the sweeper removes them.
type stateCounts struct {
	mu sync.Mutex
	n  map[engine.State]int64
}

func (c *stateCounts) load(tx *bolt.Tx) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n = make(map[engine.State]int64)
	return tx.Bucket(bucketRecords).ForEach(func(_, v []byte) error {
		st, err := decodeState(v)
		if err != nil {
			return err
		}
		c.n[st]++
		return nil
	})
}

func (c *stateCounts) move(from, to engine.State) {
	if from == to {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if from != "" {
		c.n[from]--
	}
	if to != "" {
		c.n[to]++
	}
}

func (c *stateCounts) get(st engine.State) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[st]
}

// stateField is how an encoded record shows its state. A store that opens counts its
// records by state from every record, so the state is read without decoding the
// record, which took nearly all of a start-up's CPU (docs/bench-size.md, "What grows,
// and why"). The pattern is found only where it is the field: in a JSON string a quote
// is always escaped, and no other object in a record holds a string under "st" (the
// headers' values are arrays).
var stateField = []byte(`,"st":"`)

func decodeState(v []byte) (engine.State, error) {
	if i := bytes.Index(v, stateField); i > 0 && v[0] == '{' {
		rest := v[i+len(stateField):]
		if j := bytes.IndexByte(rest, '"'); j >= 0 && bytes.IndexByte(rest[:j], '\\') < 0 {
			return engine.State(rest[:j]), nil
		}
	}
	r, err := decodeHead(v)
	return r.State, err
}

// head is the part of a stored record that the counts and the sweeper read.
type head struct {
	Key    string       `json:"k"`
	Tenant string       `json:"t"`
	State  engine.State `json:"st"`
}

func decodeHead(v []byte) (head, error) {
	var r head
	if err := json.Unmarshal(v, &r); err != nil {
		return head{}, fmt.Errorf("record is corrupt: %w", err)
	}
	return r, nil
}

// collector exports the database's size, its records by state and the sweeper's work.
type collector struct {
	s       *Store
	size    *prometheus.Desc
	records *prometheus.Desc
	swept   prometheus.Counter
}

func newCollector(s *Store) *collector {
	return &collector{
		s: s,
		size: prometheus.NewDesc("idemd_bolt_db_size_bytes",
			"Size of the embedded database file.", nil, nil),
		records: prometheus.NewDesc("idemd_records",
			"Records in the store by state, counting expired ones until they are swept.", []string{"state"}, nil),
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idemd_bolt_swept_records_total",
			Help: "Records removed by the sweeper after their retention.",
		}),
	}
}

// Describe implements prometheus.Collector.
func (s *Store) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.metrics.size
	ch <- s.metrics.records
	s.metrics.swept.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *Store) Collect(ch chan<- prometheus.Metric) {
	m := s.metrics
	var size int64
	if err := s.db.View(func(tx *bolt.Tx) error { size = tx.Size(); return nil }); err == nil {
		ch <- prometheus.MustNewConstMetric(m.size, prometheus.GaugeValue, float64(size))
	}
	for _, st := range []engine.State{engine.StatePending, engine.StateReleased, engine.StateCompleted, engine.StateFailed} {
		ch <- prometheus.MustNewConstMetric(m.records, prometheus.GaugeValue, float64(s.counts.get(st)), string(st))
	}
	m.swept.Collect(ch)
}
