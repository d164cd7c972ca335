package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobdir"
	"github.com/idemd/idemd/internal/engine/blobs3"
)

// Sweeps of the blob store: how often by default (--blob-sweep-every), and how many
// blobs one sweep deletes at most. A blob outlives its record by at most the grace
// (--blob-sweep-grace) and one period.
const (
	defaultBlobSweepEvery = 5 * time.Minute
	blobSweepLimit        = 10000
)

// noBlobStore is the --blob-store that turns the blob store off, beside the embedded
// store too: results over --max-response-bytes are then refused.
const noBlobStore = "none"

// blobStoreKind reads --blob-store: "" for none, "file" or "s3". A URL with
// credentials in it is refused without being repeated.
func blobStoreKind(raw string) (string, error) {
	if raw == "" || raw == noBlobStore {
		return "", nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("--blob-store is not a URL (file:///dir, file: for the directory blobs in --data-dir, s3://bucket/prefix?endpoint=...&region=...&path_style=true, or none)")
	}
	if u.User != nil {
		return "", errors.New("--blob-store: credentials do not go in the URL; give them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), the shared credentials file, or the pod's or instance's identity")
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" {
			return "", errors.New("--blob-store: a file URL names a local directory: file:///abs/dir")
		}
		return "file", nil
	case "s3":
		if _, err := blobs3.ParseURL(raw); err != nil {
			return "", fmt.Errorf("--blob-store: %w", err)
		}
		return "s3", nil
	}
	return "", fmt.Errorf("--blob-store: scheme %q is neither file nor s3 (or none for no blob store)", u.Scheme)
}

// embedded says whether the daemon runs on the embedded store.
func (m *Main) embedded() bool { return m.Store == "" || strings.HasPrefix(m.Store, "bolt://") }

// blobsByDefault says whether the daemon keeps large results in the directory blobs
// beside the embedded store's database without being told: on the embedded store,
// when --blob-store is not given. A daemon on Redis has no blob store unless one is
// given, since a directory is not shared with its other daemons.
func (m *Main) blobsByDefault() bool { return m.BlobStore == "" && m.embedded() }

// checkBlobFlags checks the blob store's flags at parse time; given holds the flags
// set on the command line or by the environment. With the default blob directory, a
// --blob-threshold or --max-blob-bytes left at its default that does not fit the
// --max-response-bytes given is fitted to it, so that a daemon that started before
// the default directory existed starts as it did.
func (m *Main) checkBlobFlags(given map[string]bool) error {
	if _, err := blobStoreKind(m.BlobStore); err != nil {
		return err
	}
	if m.blobsByDefault() {
		if !given["blob-threshold"] && m.BlobThreshold > m.MaxResponseBytes {
			m.BlobThreshold = m.MaxResponseBytes
		}
		if !given["max-blob-bytes"] && m.MaxBlobBytes < m.MaxResponseBytes {
			m.MaxBlobBytes = m.MaxResponseBytes
		}
	} else if m.BlobStore == "" || m.BlobStore == noBlobStore {
		return nil
	}
	switch {
	case m.BlobThreshold <= 0:
		return errors.New("--blob-threshold must be positive")
	case m.BlobThreshold > m.MaxResponseBytes:
		return errors.New("--blob-threshold must be at most --max-response-bytes: a result up to it stays in the record")
	case m.MaxBlobBytes < m.MaxResponseBytes:
		return errors.New("--max-blob-bytes must be at least --max-response-bytes")
	case m.BlobSweepEvery <= 0:
		return errors.New("--blob-sweep-every must be positive")
	}
	// A grace shorter than this could let a sweep delete the blob of a record still
	// being stored; the default gives way to it, a grace given is refused.
	lead := engine.BlobNameLead(m.StoreTimeout, int64(m.MaxBlobBytes))
	if m.BlobSweepGrace == engine.BlobSweepGrace {
		m.BlobSweepGrace = max(m.BlobSweepGrace, lead)
	}
	if m.BlobSweepGrace < lead {
		return fmt.Errorf("--blob-sweep-grace must be at least %s with this --store-timeout and --max-blob-bytes (twice the one, plus 250ms per MiB of the other, plus 1s): a blob is named before it is written and its record stored", lead)
	}
	return nil
}

// blobDesc is the blob store as a log line may show it: the URL has no credentials
// (they are refused), and its query is left out all the same.
func blobDesc(raw string) string {
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		return raw[:i]
	}
	return raw
}

// blobDirName is the directory of blobs beside the embedded store's database: the blob
// store of a daemon on the embedded store without --blob-store, and of --blob-store
// file:.
const blobDirName = "blobs"

// openBlobs opens the blob store of --blob-store, nil without one. It runs after
// openStore, which names the embedded store's database in m.Store.
func (m *Main) openBlobs() (engine.BlobStore, error) {
	if m.blobsByDefault() {
		dir := filepath.Join(filepath.Dir(strings.TrimPrefix(m.Store, "bolt://")), blobDirName)
		s, err := blobdir.Open(dir)
		if err != nil {
			return nil, fmt.Errorf("the blob directory beside the embedded store (--blob-store none goes without): %w", err)
		}
		m.Logger.Info("blob store opened", "dir", s.Dir(), "default", true, "threshold", m.BlobThreshold, "max_blob_bytes", m.MaxBlobBytes)
		return s, nil
	}
	kind, err := blobStoreKind(m.BlobStore)
	if err != nil || kind == "" {
		return nil, err
	}
	if kind == "file" {
		u, _ := url.Parse(m.BlobStore)
		dir := u.Path
		if dir == "" {
			dir = filepath.Join(m.DataDir, blobDirName)
		}
		s, err := blobdir.Open(dir)
		if err != nil {
			return nil, fmt.Errorf("--blob-store: %w", err)
		}
		m.Logger.Info("blob store opened", "dir", s.Dir(), "threshold", m.BlobThreshold, "max_blob_bytes", m.MaxBlobBytes)
		return s, nil
	}
	o, _ := blobs3.ParseURL(m.BlobStore)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := blobs3.Open(ctx, o)
	if err != nil {
		return nil, fmt.Errorf("--blob-store: %w", err)
	}
	if err := s.Check(ctx); err != nil {
		// As with Redis, a bucket out of reach at start-up is no reason not to start:
		// large results answer 503 until it answers.
		m.Logger.Warn("the blob store's bucket does not answer; large results answer 503 until it does", "blob_store", blobDesc(m.BlobStore), "err", err)
	} else {
		m.Logger.Info("blob store opened", "blob_store", blobDesc(m.BlobStore), "threshold", m.BlobThreshold, "max_blob_bytes", m.MaxBlobBytes)
	}
	return s, nil
}

// blobErrors is idemd_blob_errors_total.
func blobErrors(registry *prometheus.Registry) func(op string) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idemd_blob_errors_total",
		Help: "Failures of the blob store, by operation: put, get, delete, sweep, and verify (a blob missing its bytes or not the bytes stored: the result answered 502 result_unavailable).",
	}, []string{"op"})
	for _, op := range []string{"put", "get", "verify", "delete", "sweep"} {
		c.WithLabelValues(op)
	}
	registry.MustRegister(c)
	return func(op string) { c.WithLabelValues(op).Inc() }
}

// sweepBlobs deletes the blobs of expired records every --blob-sweep-every until ctx
// ends.
func (m *Main) sweepBlobs(ctx context.Context, s *engine.Service) {
	t := time.NewTicker(m.BlobSweepEvery)
	defer t.Stop()
	for {
		sweepCtx, cancel := context.WithTimeout(ctx, max(m.BlobSweepEvery, time.Minute))
		n, err := s.SweepBlobs(sweepCtx, time.Now(), blobSweepLimit)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			m.Logger.Warn("the sweep of the blob store failed; it runs again later", "deleted", n, "err", err)
		case n > 0:
			m.Logger.Info("blob store swept", "deleted", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// meteredBlobs is a blob store whose calls are counted: idemd_blob_operation_seconds
// by operation (a get's time is to its first byte's readiness, the stream after it is
// the client's pace) and idemd_blob_bytes_total, the bytes written and read.
type meteredBlobs struct {
	engine.BlobStore
	seconds *prometheus.HistogramVec
	bytes   *prometheus.CounterVec
}

// meterBlobs registers the blob store's metrics and answers s counted by them.
func meterBlobs(registry *prometheus.Registry, s engine.BlobStore) engine.BlobStore {
	m := &meteredBlobs{
		BlobStore: s,
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idemd_blob_operation_seconds",
			Help:    "Time of the blob store's calls, by operation: put (the whole upload), get (until the object's bytes begin), delete and list (one sweep's listing).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}, []string{"op", "outcome"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idemd_blob_bytes_total",
			Help: "Bytes written to the blob store (op=put, blobs stored whole) and read from it (op=get, as replays and downloads read them).",
		}, []string{"op"}),
	}
	for _, op := range []string{"put", "get"} {
		m.bytes.WithLabelValues(op)
	}
	registry.MustRegister(m.seconds, m.bytes)
	return m
}

func (m *meteredBlobs) observe(op string, began time.Time, err error) {
	outcome := "ok"
	if err != nil && !errors.Is(err, engine.ErrBlobNotFound) {
		outcome = "error"
	}
	m.seconds.WithLabelValues(op, outcome).Observe(time.Since(began).Seconds())
}

func (m *meteredBlobs) Put(ctx context.Context, name string, r io.Reader, size int64) (engine.BlobRef, error) {
	began := time.Now()
	ref, err := m.BlobStore.Put(ctx, name, r, size)
	m.observe("put", began, err)
	if err == nil {
		m.bytes.WithLabelValues("put").Add(float64(ref.Size))
	}
	return ref, err
}

func (m *meteredBlobs) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	began := time.Now()
	r, err := m.BlobStore.Get(ctx, name)
	m.observe("get", began, err)
	if err != nil {
		return nil, err
	}
	counted := &countedReader{ReadCloser: r, add: m.bytes.WithLabelValues("get").Add}
	if n, ok := engine.BlobSize(r); ok {
		// The engine checks a size known before the bytes: keep it known.
		return &sizedReader{countedReader: counted, size: n}, nil
	}
	return counted, nil
}

func (m *meteredBlobs) Delete(ctx context.Context, name string) error {
	began := time.Now()
	err := m.BlobStore.Delete(ctx, name)
	m.observe("delete", began, err)
	return err
}

func (m *meteredBlobs) List(ctx context.Context, after string, fn func(name string) bool) error {
	began := time.Now()
	err := m.BlobStore.List(ctx, after, fn)
	m.observe("list", began, err)
	return err
}

// countedReader adds the bytes read through it to a counter.
type countedReader struct {
	io.ReadCloser
	add func(float64)
}

func (c *countedReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if n > 0 {
		c.add(float64(n))
	}
	return n, err
}

// sizedReader is a countedReader whose blob's size is known before its bytes.
type sizedReader struct {
	*countedReader
	size int64
}

func (s *sizedReader) Size() int64 { return s.size }
