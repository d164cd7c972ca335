package engine_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
)

func TestStreamRefusesWhatIsNotWhole(t *testing.T) {
	now := time.Now()
	rec := engine.Exported{KeyDigest: engine.KeyDigest("k")}
	rec.ID = engine.ID{Tenant: "default", Key: "k"}
	rec.State, rec.Attempt = engine.StateCompleted, 1
	rec.CreatedAt, rec.UpdatedAt, rec.ExpiresAt = now, now, now.Add(time.Hour)
	var whole bytes.Buffer
	sw, err := engine.NewStreamWriter(&whole, "bolt", now)
	if err != nil {
		t.Fatal(err)
	}
	if err := sw.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := sw.Close(); err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(whole.String(), "\n")
	header, record, trailer := lines[0], lines[1], lines[2]

	for _, tc := range []struct {
		name, stream, want string
	}{
		{"empty", "", "empty"},
		{"no header", record + trailer, "no header"},
		{"a later version", strings.Replace(header, `"version":1`, `"version":2`, 1) + record + trailer, "version 2"},
		{"cut short before the trailer", header + record, "cut short"},
		{"a trailer counting other records", header + record + strings.Replace(trailer, `"records":1`, `"records":2`, 1), "counts 2"},
		{"a key that is not its digest", header + strings.Replace(record, `"key":"k"`, `"key":"j"`, 1) + trailer, "key_sha256"},
		{"an unknown state", header + strings.Replace(record, `"completed"`, `"done"`, 1) + trailer, "state"},
		{"a line too long", header + `{"tenant":"` + strings.Repeat("x", 400) + `"}` + "\n" + trailer, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := readAll(tc.stream)
			if !errors.Is(err, engine.ErrStream) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want a stream error saying %q", err, tc.want)
			}
		})
	}
	if err := readAll(whole.String()); err != nil {
		t.Fatalf("the whole stream: %v", err)
	}
}

func readAll(stream string) error {
	sr, err := engine.NewStreamReader(strings.NewReader(stream), 300)
	if err != nil {
		return err
	}
	for {
		if _, err := sr.Next(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
}
