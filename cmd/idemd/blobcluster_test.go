package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/engine/blobs3"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/tests3"
)

// The real binary on a 3-master Redis Cluster with its blobs in a real S3 server: a
// 16 MiB result completes and replays byte for byte through the raw forms, plain, and
// through the Go client sealing it; the bucket holds one object for each, the sealed
// one holding none of the result's bytes in the clear. (The JSON forms take the same
// path to the store; TestLargeResultsInS3 runs them.)
func TestLargeResultsOnAClusterInS3(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the daemon, a Redis Cluster and an S3 server")
	}
	s3srv := tests3.Start(t)
	cluster := testredis.StartCluster(t)
	bin := buildDaemon(t)
	// The deadline is not what this tests: 16 MiB through a busy machine gets room.
	p := startWith(t, bin, "--store", cluster.URL(), "--blob-store", s3srv.URL("cluster"), "--store-timeout", "10s")

	body := randomBody(t, 16<<20)
	rawKey := "raw/" + t.Name()
	if a := claimKey(t, p.base, rawKey); a.Status != http.StatusCreated {
		t.Fatalf("claim %s: %d %s", rawKey, a.Status, a.Code)
	} else if code, text := putRaw(t, p.base, rawKey, a.LeaseToken, body); code != http.StatusOK {
		t.Fatalf("PUT the raw result: %d %s", code, text)
	}
	if code, h, got := getRaw(t, p.base, rawKey); code != http.StatusOK || !bytes.Equal(got, body) || h.Get("Idemd-Status") != "201" {
		t.Fatalf("GET the raw result: %d, %d bytes, status %q; want 200, the %d bytes put, status 201", code, len(got), h.Get("Idemd-Status"), len(body))
	}

	ring, err := idem.ParseKeyRing("k-cluster=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	client := func() *idem.Client {
		// A client of its own for each call, so that a replay comes from the daemon and
		// not from the client's cache.
		c, err := idem.New(p.base, idem.WithSealing("default", ring))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx := context.Background()
	claimed, err := client().Claim(ctx, "sealed", idem.ClaimOptions{})
	if err != nil || claimed.Outcome != idem.Acquired {
		t.Fatalf("claim sealed: %v %v", claimed, err)
	}
	if err := client().Complete(ctx, "sealed", claimed.Token, idem.Response{Status: 200,
		Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: body}); err != nil {
		t.Fatalf("complete sealed with %d bytes: %v", len(body), err)
	}
	replay, err := client().Claim(ctx, "sealed", idem.ClaimOptions{})
	if err != nil || replay.Outcome != idem.Completed || replay.Response == nil || !bytes.Equal(replay.Response.Body, body) {
		n := -1
		if replay != nil && replay.Response != nil {
			n = len(replay.Response.Body)
		}
		t.Fatalf("replay of the sealed result: %v, %d bytes; want it completed with the %d bytes", err, n, len(body))
	}

	o, err := blobs3.ParseURL(s3srv.URL("cluster"))
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := blobs3.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	if err := bucket.List(ctx, "", func(n string) bool { names = append(names, n); return true }); err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 {
		t.Fatalf("objects: %v, want one for each of the two results", names)
	}
	clear := 0
	for _, name := range names {
		rc, err := bucket.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := io.ReadAll(rc)
		_ = rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(stored, body[8<<20:8<<20+64]) {
			clear++
		}
		if strings.Contains(name, "sealed") || strings.Contains(name, "raw") {
			t.Fatalf("the object's name %q shows the key", name)
		}
	}
	if clear != 1 {
		t.Fatalf("%d objects hold the result in the clear, want the one not sealed", clear)
	}
}
