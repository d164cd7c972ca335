package blobs3_test

import (
	"context"
	"testing"

	"github.com/idemd/idemd/internal/engine/blobs3"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/testing/tests3"
)

func TestParseURL(t *testing.T) {
	o, err := blobs3.ParseURL("s3://results/idemd/prod?endpoint=http://127.0.0.1:9000&region=eu-west-1&path_style=true")
	if err != nil {
		t.Fatal(err)
	}
	want := blobs3.Options{Bucket: "results", Prefix: "idemd/prod", Endpoint: "http://127.0.0.1:9000", Region: "eu-west-1", PathStyle: true}
	if o != want {
		t.Fatalf("%+v, want %+v", o, want)
	}
	for _, bad := range []string{
		"s3://key:secret@results/p", "s3:///p", "file:///x", "s3://b/p?path_style=maybe",
		"s3://b/p?endpoint=ftp://h", "s3://b/p?endpoint=http://k:s@h", "s3://b/p?secret_key=x",
	} {
		if _, err := blobs3.ParseURL(bad); err == nil {
			t.Errorf("%s was taken", bad)
		}
	}
}

// The store against a real S3 server (SeaweedFS), with and without a prefix.
func TestContract(t *testing.T) {
	srv := tests3.Start(t)
	for _, prefix := range []string{"", "idemd/test"} {
		t.Run("prefix="+prefix, func(t *testing.T) {
			o, err := blobs3.ParseURL(srv.URL(prefix))
			if err != nil {
				t.Fatal(err)
			}
			s, err := blobs3.Open(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Check(context.Background()); err != nil {
				t.Fatal(err)
			}
			enginetest.BlobStore(t, s)
		})
	}
}
