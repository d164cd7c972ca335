package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/blobs3"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/tests3"
	"github.com/idemd/idemd/internal/testing/wait"
)

// TestBlobsFollowRecords holds the lifetime of blobs with real daemons on Redis and on a
// 3-master Cluster, their blobs in a real S3 server: large completions with retentions
// of seconds, the daemon killed (SIGKILL) in the middle of them several times and
// started again, records expiring in Redis on their own, some purged. Once the sweep
// (every second here, with a grace of 4 s) has had its time, the bucket holds exactly
// the blobs of live records: each of those with the size and SHA-256 its record keeps,
// and no other. Every completion acknowledged with a long retention replays byte for
// byte. The Cluster runs only with IDEMD_LONG_TESTS set, the CI suite's Redis being
// enough to hold what the store does not change.
func TestBlobsFollowRecords(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon, Redis and an S3 server")
	}
	s3srv := tests3.Start(t)
	bin := buildDaemon(t)
	t.Run("Redis", func(t *testing.T) {
		r := testredis.Start(t)
		blobsFollowRecords(t, bin, s3srv, r.URL(), "redis")
	})
	t.Run("Cluster", func(t *testing.T) {
		if os.Getenv("IDEMD_LONG_TESTS") == "" {
			t.Skip("IDEMD_LONG_TESTS is not set: the Cluster's six servers are left out of the CI suite")
		}
		c := testredis.StartCluster(t)
		blobsFollowRecords(t, bin, s3srv, c.URL(), "cluster")
	})
}

// lifeRun is what one run of blobsFollowRecords did, as its clients saw it.
type lifeRun struct {
	mu sync.Mutex
	// keys are every key claimed.
	keys []string
	// kept are the results acknowledged with a long retention and not purged.
	kept map[string][]byte
	// short are the keys whose completion, with a retention of seconds, was sent.
	short []string
	// tokens are the leases of the short keys whose completion got no answer.
	tokens map[string]string
	// acked counts the completions acknowledged, unanswered those the daemon was
	// killed under.
	acked, unanswered int
}

// try sends one JSON request; a transport error (the daemon killed) is returned, not
// fatal.
func try(base, method, path string, body any) (tenantAnswer, error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return tenantAnswer{}, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, r)
	if err != nil {
		return tenantAnswer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return tenantAnswer{}, err
	}
	defer resp.Body.Close()
	var a tenantAnswer
	if resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			return tenantAnswer{}, fmt.Errorf("%s %s: %d, undecodable: %w", method, path, resp.StatusCode, err)
		}
	}
	a.Status = resp.StatusCode
	return a, nil
}

func completion(key, token string, body []byte, retention time.Duration) map[string]any {
	return map[string]any{"key": key, "lease_token": token, "retention_ms": retention.Milliseconds(),
		"response": map[string]any{"status": 200, "headers": map[string][]string{"Content-Type": {"application/octet-stream"}}, "body": body}}
}

func blobsFollowRecords(t *testing.T, bin string, s3srv *tests3.Server, storeURL, prefix string) {
	const (
		rounds  = 4
		clients = 6
		perRun  = 12 // completions a client sends at most in a round
		long    = 12 // results kept an hour
		grace   = 4 * time.Second
	)
	// The grace is the least the daemon takes with these flags: 2×1 s + 250 ms + 1 s.
	flags := []string{"--store", storeURL, "--blob-store", s3srv.URL(prefix), "--store-timeout", "1s",
		"--max-blob-bytes", "1048576", "--blob-sweep-every", "1s", "--blob-sweep-grace", grace.String()}
	p := startWith(t, bin, flags...)
	run := &lifeRun{kept: map[string][]byte{}, tokens: map[string]string{}}

	for i := range long {
		key := fmt.Sprintf("long-%d", i)
		body := randomBody(t, 70<<10+rand.IntN(200<<10))
		a := claimKey(t, p.base, key)
		if a.Status != http.StatusCreated {
			t.Fatalf("claim %s: %d %s", key, a.Status, a.Code)
		}
		if c, err := try(p.base, http.MethodPost, "/v1/complete", completion(key, a.LeaseToken, body, time.Hour)); err != nil || c.Status != http.StatusOK {
			t.Fatalf("complete %s: %d %s %v", key, c.Status, c.Code, err)
		}
		run.keys = append(run.keys, key)
		run.kept[key] = body
	}
	for _, key := range []string{"long-0", "long-5", "long-11"} {
		if a := blobCall(t, p.base, http.MethodDelete, "/v1/records/"+key, nil); a.Status != http.StatusNoContent {
			t.Fatalf("purge %s: %d %s", key, a.Status, a.Code)
		}
		delete(run.kept, key)
	}

	for round := range rounds {
		// Clients complete large results with retentions of 1 to 3 s until the daemon
		// is killed under them, once a few of this round's have been acknowledged.
		run.mu.Lock()
		killAt := run.acked + 2 + rand.IntN(8)
		run.mu.Unlock()
		var wg sync.WaitGroup
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				shortClient(p.base, fmt.Sprintf("r%d-c%d", round, c), perRun, run)
			}()
		}
		err := wait.Until(30*time.Second, func() error {
			run.mu.Lock()
			defer run.mu.Unlock()
			if run.acked < killAt {
				return fmt.Errorf("%d completions acknowledged, waiting for %d", run.acked, killAt)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		p.kill(t)
		wg.Wait()
		p = startWith(t, bin, flags...)

		// A client whose completion got no answer sends it again under its lease: the
		// result is stored once, whatever the killed daemon had written.
		run.mu.Lock()
		retries := run.tokens
		run.tokens = map[string]string{}
		run.mu.Unlock()
		for key, token := range retries {
			if rand.IntN(2) == 0 {
				continue // left to expire pending, its blob (if written) orphaned
			}
			if _, err := try(p.base, http.MethodPost, "/v1/complete", completion(key, token, randomBody(t, 100<<10), 2*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		// Some short results are purged before they expire.
		run.mu.Lock()
		purge := slices.Clone(run.short[len(run.short)-min(2, len(run.short)):])
		run.mu.Unlock()
		for _, key := range purge {
			if _, err := try(p.base, http.MethodDelete, "/v1/records/"+key, nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	written := time.Now()
	t.Logf("%d short completions acknowledged, %d killed under, of %d short keys; %d daemons killed", run.acked, run.unanswered, len(run.short), rounds)

	// The records, read from the store itself, and the bucket, read from the S3 server.
	store, err := redisstore.OpenWith(storeURL, redisstore.Options{Layout: redisstore.LayoutAuto, ClientName: "idemd-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	if _, err := store.AgreeLayout(context.Background()); err != nil {
		t.Fatal(err)
	}
	o, err := blobs3.ParseURL(s3srv.URL(prefix))
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := blobs3.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	// references are the blobs the records of every key claimed refer to, by name,
	// with the key of each.
	references := func(ctx context.Context) (map[string]engine.BlobRef, map[string]string, error) {
		refs, keys := map[string]engine.BlobRef{}, map[string]string{}
		for _, key := range run.keys {
			rec, err := store.Lookup(ctx, engine.ID{Tenant: engine.DefaultTenant, Key: key})
			switch {
			case errors.Is(err, engine.ErrNotFound):
				continue
			case err != nil:
				return nil, nil, err
			}
			if ref, ok := rec.Response.Blob(); ok {
				refs[ref.Name], keys[ref.Name] = ref, key
			}
		}
		return refs, keys, nil
	}
	list := func(ctx context.Context) ([]string, error) {
		var objects []string
		err := bucket.List(ctx, "", func(n string) bool { objects = append(objects, n); return true })
		return objects, err
	}
	exact := func() error {
		ctx := context.Background()
		objects, err := list(ctx)
		if err != nil {
			return err
		}
		live, keys, err := references(ctx)
		if err != nil {
			return err
		}
		for name := range live {
			if _, kept := run.kept[keys[name]]; !kept {
				return fmt.Errorf("%s, completed for seconds or purged, is still live", keys[name])
			}
		}
		for _, name := range objects {
			if _, ok := live[name]; !ok {
				return fmt.Errorf("the bucket holds %s, which no live record refers to (%d objects, %d live references)", name, len(objects), len(live))
			}
		}
		if len(live) != len(run.kept) {
			return fmt.Errorf("%d live records refer to a blob, want the %d kept", len(live), len(run.kept))
		}
		for _, ref := range live {
			rc, err := bucket.Get(ctx, ref.Name)
			if err != nil {
				return fmt.Errorf("the blob of a live record, %s: %w", ref.Name, err)
			}
			h := engine.NewHashingReader(rc)
			_, err = io.Copy(io.Discard, h)
			_ = rc.Close()
			if err != nil {
				return err
			}
			if h.Size() != ref.Size || h.Sum() != ref.SHA256 {
				return fmt.Errorf("the blob %s holds %d bytes of SHA-256 %s, its record says %d of %s", ref.Name, h.Size(), h.Sum(), ref.Size, ref.SHA256)
			}
		}
		return nil
	}
	first, err := list(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	refs, _, err := references(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	orphans := 0
	for _, name := range first {
		if _, ok := refs[name]; !ok {
			orphans++
		}
	}
	t.Logf("the bucket held %d objects once the writes ended: %d kept an hour, %d of records still live for seconds, %d of no record (purged, expired, or written by a daemon killed before its record)",
		len(first), len(run.kept), len(first)-orphans-len(run.kept), orphans)
	for key, body := range run.kept {
		a := claimKey(t, p.base, key)
		if a.Status != http.StatusOK || a.Response == nil || !bytes.Equal(a.Response.Body, body) {
			t.Fatalf("replay of %s after the kills: %d %s; want the %d bytes acknowledged", key, a.Status, a.Code, len(body))
		}
	}
	// The bound: the last short record expires 3 s after it was written; its blob goes
	// at the first sweep past the grace, one period later at most.
	if err := wait.Until(30*time.Second, exact); err != nil {
		t.Fatalf("the bucket never held exactly the blobs of the live records: %v\n%s", err, p.logs)
	}
	t.Logf("the bucket held exactly the blobs of the live records %s after the last write", time.Since(written).Round(100*time.Millisecond))
}

// shortClient claims and completes up to n keys named after name with large results
// kept for 1 to 3 s, and stops at the first transport error (the daemon killed).
func shortClient(base, name string, n int, run *lifeRun) {
	for i := range n {
		key := fmt.Sprintf("%s-%d", name, i)
		a, err := try(base, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": "fp", "lease_ms": 10_000})
		if err != nil {
			return
		}
		run.mu.Lock()
		run.keys = append(run.keys, key)
		run.mu.Unlock()
		if a.Status != http.StatusCreated {
			continue
		}
		body := make([]byte, 70<<10+rand.IntN(300<<10))
		for j := range body {
			body[j] = byte(rand.Uint32())
		}
		run.mu.Lock()
		run.short = append(run.short, key)
		run.mu.Unlock()
		retention := time.Second + time.Duration(rand.IntN(2000))*time.Millisecond
		c, err := try(base, http.MethodPost, "/v1/complete", completion(key, a.LeaseToken, body, retention))
		run.mu.Lock()
		switch {
		case err != nil:
			run.tokens[key] = a.LeaseToken
			run.unanswered++
		case c.Status == http.StatusOK:
			run.acked++
		}
		run.mu.Unlock()
		if err != nil {
			return
		}
	}
}
