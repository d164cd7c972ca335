package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/engine"
)

// export writes the record stream to --out, checked before it takes the file's name:
// a stream cut short never passes for a whole one.
func (a *app) export(args []string) int {
	fs := a.flags("export")
	out := fs.String("out", "-", "the file to write, - for stdout")
	if _, err := a.parse(fs, args, 0, "no arguments"); err != nil {
		return a.usageError(err)
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	if *out == "-" {
		if err := c.ExportRecords(context.Background(), a.stdout); err != nil {
			return a.fail(err)
		}
		return exitOK
	}
	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*")
	if err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	defer os.Remove(tmp.Name())
	if err := c.ExportRecords(context.Background(), tmp); err != nil {
		_ = tmp.Close()
		return a.fail(err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	n, sum, err := checkStream(tmp)
	_ = tmp.Close()
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: the stream idemd sent is not whole, and %s was not written: %v\n", *out, err)
		return exitUnavailable
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	if a.json {
		a.printJSON(map[string]any{"file": *out, "records": n, "sha256": sum})
	} else {
		fmt.Fprintf(a.stdout, "exported %d records to %s (sha256 %s)\n", n, *out, sum)
	}
	return exitOK
}

// checkStream reads a whole record stream and returns how many records it holds and
// its SHA-256.
func checkStream(r io.Reader) (int64, string, error) {
	h := sha256.New()
	sr, err := engine.NewStreamReader(io.TeeReader(r, h), 0)
	if err != nil {
		return 0, "", err
	}
	var n int64
	for {
		_, err := sr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, "", err
		}
		n++
	}
	// Anything after the trailer is part of no stream.
	if extra, _ := io.Copy(io.Discard, r); extra > 0 {
		return n, "", fmt.Errorf("%w: %d bytes after the trailer", engine.ErrStream, extra)
	}
	return n, hexSum(h), nil
}

func hexSum(h hash.Hash) string { return hex.EncodeToString(h.Sum(nil)) }

// importCmd checks the whole file first, so that a malformed stream changes nothing,
// then sends it.
func (a *app) importCmd(args []string) int {
	fs := a.flags("import")
	pos, err := a.parse(fs, args, 1, "one FILE")
	if err != nil {
		return a.usageError(err)
	}
	f, err := os.Open(pos[0])
	if err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	defer f.Close()
	n, _, err := checkStream(f)
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: %s: %v; nothing was imported\n", pos[0], err)
		return exitRefused
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	sum, err := c.ImportRecords(context.Background(), f)
	if err != nil {
		return a.fail(err)
	}
	if a.json {
		a.printJSON(importJSON(sum))
		return exitOK
	}
	fmt.Fprintf(a.stdout, "%d records: %d written, %d there already, %d kept (the store holds another record of the key), %d expired\n",
		n, sum.Written, sum.Same, sum.Kept, sum.Expired)
	if sum.OtherTenant > 0 {
		fmt.Fprintf(a.stdout, "%d records of other tenants left out: importing them needs a token with the platform scope\n", sum.OtherTenant)
	}
	for _, k := range sum.KeptRecords {
		name := k.Key
		if name == "" {
			name = "sha256:" + k.KeySHA256
		}
		fmt.Fprintf(a.stdout, "kept\t%s\t%s\n", k.Tenant, name)
	}
	return exitOK
}

func importJSON(sum idem.ImportSummary) map[string]any {
	kept := make([]map[string]string, 0, len(sum.KeptRecords))
	for _, k := range sum.KeptRecords {
		kept = append(kept, map[string]string{"tenant": k.Tenant, "key_sha256": k.KeySHA256, "key": k.Key})
	}
	return map[string]any{"written": sum.Written, "same": sum.Same, "kept": sum.Kept, "expired": sum.Expired,
		"other_tenant": sum.OtherTenant, "kept_records": kept}
}
