package enginetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
)

// BlobStore holds a blob store to the engine.BlobStore contract: a blob reads back as
// written with its size and SHA-256, a reader of the wrong length stores nothing, a
// missing name is ErrBlobNotFound, Delete is idempotent and List walks names in order.
func BlobStore(t *testing.T, s engine.BlobStore) {
	ctx := context.Background()
	prefix := fmt.Sprintf("%011d", time.Now().UnixNano()%1e11)
	name := func(i int) string { return fmt.Sprintf("%s/blob-%03d", prefix, i) }

	t.Run("round trip", func(t *testing.T) {
		body := make([]byte, 3<<20+17)
		_, _ = rand.Read(body)
		ref, err := s.Put(ctx, name(1), bytes.NewReader(body), int64(len(body)))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(body)
		if ref.Name != name(1) || ref.Size != int64(len(body)) || ref.SHA256 != hex.EncodeToString(sum[:]) {
			t.Fatalf("Put answered %+v, want %s %d %x", ref, name(1), len(body), sum)
		}
		r, err := s.Get(ctx, name(1))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		_ = r.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("Get read %d bytes (%v), want the %d written", len(got), err, len(body))
		}
	})
	t.Run("wrong length stores nothing", func(t *testing.T) {
		for _, c := range []struct {
			body string
			size int64
		}{{"short", 10}, {"much too long", 5}} {
			_, err := s.Put(ctx, name(2), strings.NewReader(c.body), c.size)
			if !errors.Is(err, engine.ErrBlobSize) {
				t.Fatalf("Put of %d bytes as %d: %v, want ErrBlobSize", len(c.body), c.size, err)
			}
			if r, err := s.Get(ctx, name(2)); !errors.Is(err, engine.ErrBlobNotFound) {
				if r != nil {
					_ = r.Close()
				}
				t.Fatalf("after a failed Put of %d bytes as %d, Get: %v, want ErrBlobNotFound", len(c.body), c.size, err)
			}
		}
	})
	t.Run("missing, delete, list", func(t *testing.T) {
		if _, err := s.Get(ctx, name(3)); !errors.Is(err, engine.ErrBlobNotFound) {
			t.Fatalf("Get of a name never written: %v, want ErrBlobNotFound", err)
		}
		for _, i := range []int{7, 5, 6} {
			if _, err := s.Put(ctx, name(i), strings.NewReader("x"), 1); err != nil {
				t.Fatal(err)
			}
		}
		var listed []string
		if err := s.List(ctx, name(4), func(n string) bool {
			if strings.HasPrefix(n, prefix+"/") {
				listed = append(listed, n)
			}
			return len(listed) < 2
		}); err != nil {
			t.Fatal(err)
		}
		if want := []string{name(5), name(6)}; fmt.Sprint(listed) != fmt.Sprint(want) {
			t.Fatalf("List after %s, stopped at two: %v, want %v", name(4), listed, want)
		}
		for range 2 {
			if err := s.Delete(ctx, name(5)); err != nil {
				t.Fatalf("Delete (twice): %v", err)
			}
		}
		if _, err := s.Get(ctx, name(5)); !errors.Is(err, engine.ErrBlobNotFound) {
			t.Fatalf("Get after Delete: %v, want ErrBlobNotFound", err)
		}
	})
}
