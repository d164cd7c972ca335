package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/engine/boltstore"
)

// backupCmd copies a running daemon's embedded store to --out, checked against the
// daemon's digest and bbolt's check of every page before it takes the file's name,
// copies the blobs its live records refer to from --blob-dir to FILE.blobs, each
// checked against its record, and writes FILE.sha256 beside it, in sha256sum's form.
func (a *app) backupCmd(args []string) int {
	if len(args) > 0 && args[0] == "verify" {
		return a.verifyBackup(args[1:])
	}
	fs := a.flags("backup")
	out := fs.String("out", "", "the file to write")
	blobDir := fs.String("blob-dir", "", "the daemon's blob directory (<data-dir>/blobs unless --blob-store names another): the blobs the copy's records refer to are copied from it to FILE.blobs")
	recordsOnly := fs.Bool("records-only", false, "copy the records without the blobs they refer to, which stay where they are (an S3 bucket)")
	if _, err := a.parse(fs, args, 0, "no arguments but --out FILE"); err != nil {
		return a.usageError(err)
	}
	if *out == "" {
		return a.usageError(errors.New("backup needs --out FILE"))
	}
	if *blobDir != "" && *recordsOnly {
		return a.usageError(errors.New("--blob-dir and --records-only exclude each other"))
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	for attempt := 1; ; attempt++ {
		code, gone := a.backupOnce(c, *out, *blobDir, *recordsOnly)
		if gone == nil {
			return code
		}
		if attempt == backupAttempts {
			fmt.Fprintf(a.stderr, "idemctl: %v, in each of %d copies; %s was not written\n", gone, backupAttempts, *out)
			return exitRefused
		}
		fmt.Fprintf(a.stderr, "idemctl: %v (its record left the store since); taking a new copy\n", gone)
	}
}

// backupAttempts bounds the copies backup takes. A blob deleted between the copy of
// the database and the copying of the blob (its key purged meanwhile) makes it take a
// new copy, which no longer holds the record.
const backupAttempts = 3

// copyTaken is called once a copy of the database is taken and checked, before its
// blobs are copied; a variable so that a test can purge a key in between.
var copyTaken = func() {}

// backupOnce takes one copy of the database and of the blobs it refers to, and puts
// them in place; a blob deleted since the copy was taken answers a *blobGone, and
// then nothing was put in place.
func (a *app) backupOnce(c *idem.Client, out, blobDir string, recordsOnly bool) (int, *blobGone) {
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".*")
	if err != nil {
		return a.fileError(err), nil
	}
	defer os.Remove(tmp.Name())
	copied, err := c.Backup(context.Background(), tmp)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return a.fail(err), nil
	}
	stats, err := boltstore.Verify(tmp.Name())
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: the copy idemd sent does not check, and %s was not written: %v\n", out, err)
		return exitRefused, nil
	}
	copyTaken()
	var blobs []boltstore.BackupBlob
	if !recordsOnly {
		if blobs, err = boltstore.Blobs(tmp.Name(), time.Now()); err != nil {
			return a.fileError(err), nil
		}
	}
	if len(blobs) > 0 && blobDir == "" {
		fmt.Fprintf(a.stderr, "idemctl: the copy's records keep %d results in the blob store; give --blob-dir DIR, the daemon's blob directory (<data-dir>/blobs), to copy them with it, "+
			"or --records-only to leave them where they are (an S3 bucket); %s was not written\n", len(blobs), out)
		return exitRefused, nil
	}
	// The blobs go to a directory of their own first, which takes FILE.blobs's
	// name once every one of them is there and checked.
	tmpBlobs, err := os.MkdirTemp(filepath.Dir(out), "."+filepath.Base(backupBlobs(out))+".*")
	if err != nil {
		return a.fileError(err), nil
	}
	defer os.RemoveAll(tmpBlobs)
	var blobBytes int64
	for _, b := range blobs {
		if err := copyBlob(b, blobDir, tmpBlobs); err != nil {
			var gone *blobGone
			if errors.As(err, &gone) {
				return exitRefused, gone
			}
			fmt.Fprintf(a.stderr, "idemctl: %v; %s was not written\n", err, out)
			return exitRefused, nil
		}
		blobBytes += b.Ref.Size
	}
	if err := a.placeBackup(out, tmp.Name(), tmpBlobs, sha256Lines(out, copied.SHA256, blobs)); err != nil {
		return a.fileError(err), nil
	}
	if a.json {
		a.printJSON(map[string]any{"file": out, "records": stats.Records, "bytes": stats.Bytes, "sha256": stats.SHA256, "blobs": len(blobs), "blob_bytes": blobBytes})
	} else {
		fmt.Fprintf(a.stdout, "backed up %d records (%d bytes) to %s, sha256 %s in %s.sha256", stats.Records, stats.Bytes, out, stats.SHA256, out)
		if len(blobs) > 0 {
			fmt.Fprintf(a.stdout, ", and the %d results they keep by reference (%d bytes) to %s", len(blobs), blobBytes, backupBlobs(out))
		}
		fmt.Fprintln(a.stdout)
	}
	return exitOK, nil
}

// placeBackup gives the copy db and its blobs the names of the backup out, the blobs
// first, and writes out.sha256 last: a backup cut short leaves no .sha256 that
// vouches for it. A backup of that name is replaced.
func (a *app) placeBackup(out, db, blobs, sums string) error {
	dir := backupBlobs(out)
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = blobs + ".old"
		if err := os.Rename(dir, old); err != nil {
			return err
		}
	}
	if err := os.Rename(blobs, dir); err != nil {
		return err
	}
	if old != "" {
		_ = os.RemoveAll(old)
	}
	if err := os.Rename(db, out); err != nil {
		return err
	}
	return os.WriteFile(out+".sha256", []byte(sums), 0o600)
}

// verifyBackup checks a copy: its digest against FILE.sha256 (or --sha256), and bbolt's
// check of every page. Without a digest only the pages can be checked, which misses a
// changed byte of a record's data, so it refuses unless told --pages-only.
func (a *app) verifyBackup(args []string) int {
	fs := a.flags("backup verify")
	check := digestFlags(fs)
	pos, err := a.parse(fs, args, 1, "one FILE")
	if err != nil {
		return a.usageError(err)
	}
	stats, err := check.verify(pos[0])
	if err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	checked := "whole"
	if !stats.digest {
		checked = "pages only, data not checked (no digest)"
	}
	if a.json {
		a.printJSON(map[string]any{"file": pos[0], "records": stats.Records, "bytes": stats.Bytes, "sha256": stats.SHA256, "digest_checked": stats.digest,
			"blobs": stats.blobs, "blob_bytes": stats.blobBytes})
	} else {
		fmt.Fprintf(a.stdout, "%s: %s, %d records (%d bytes), sha256 %s", pos[0], checked, stats.Records, stats.Bytes, stats.SHA256)
		if stats.blobs > 0 {
			fmt.Fprintf(a.stdout, "; the %d results they keep by reference (%d bytes) each the bytes its record names", stats.blobs, stats.blobBytes)
		}
		fmt.Fprintln(a.stdout)
	}
	return exitOK
}

// digestCheck is how a copy's digest is known: from FILE.sha256 beside it, from
// --sha256, or not at all, which --pages-only accepts; and where the blobs its records
// refer to are: FILE.blobs, --blobs, or elsewhere (--records-only).
type digestCheck struct {
	sha256      *string
	pagesOnly   *bool
	blobs       *string
	recordsOnly *bool
}

func digestFlags(fs *flag.FlagSet) digestCheck {
	return digestCheck{
		sha256:      fs.String("sha256", "", "the copy's SHA-256, as backup printed it, when FILE.sha256 is not beside it"),
		pagesOnly:   fs.Bool("pages-only", false, "without a digest, accept bbolt's check of the pages alone, which misses a changed byte of data"),
		blobs:       fs.String("blobs", "", "the directory of the blobs the copy's records refer to, when it is not FILE.blobs"),
		recordsOnly: fs.Bool("records-only", false, "the copy's blobs are not part of it (backup --records-only): check the records alone"),
	}
}

// blobDir is where the blobs of the copy at path are.
func (c digestCheck) blobDir(path string) string {
	if *c.blobs != "" {
		return *c.blobs
	}
	return backupBlobs(path)
}

// checkedCopy is what a check of a copy found, whether its digest was compared, and
// the blobs its records refer to.
type checkedCopy struct {
	boltstore.BackupStats
	digest    bool
	blobs     int
	blobBytes int64
}

// verify is boltstore.Verify, the digest given or in FILE.sha256 compared, and then
// every blob the copy's live records refer to checked against its record (unless
// --records-only).
func (c digestCheck) verify(path string) (checkedCopy, error) {
	out, err := c.verifyDatabase(path)
	if err != nil || *c.recordsOnly {
		return out, err
	}
	out.blobs, out.blobBytes, err = checkBlobs(path, c.blobDir(path))
	return out, err
}

// verifyDatabase is boltstore.Verify, and the digest given or in FILE.sha256 compared.
func (c digestCheck) verifyDatabase(path string) (checkedCopy, error) {
	stats, err := boltstore.Verify(path)
	out := checkedCopy{BackupStats: stats}
	if err != nil {
		return out, err
	}
	want, source := strings.ToLower(strings.TrimSpace(*c.sha256)), "--sha256"
	if want == "" {
		f, err := os.Open(path + ".sha256")
		switch {
		case errors.Is(err, os.ErrNotExist):
			if *c.pagesOnly {
				return out, nil
			}
			return out, fmt.Errorf("%s: its pages are whole, but without %s.sha256 beside it (or --sha256) its data could not be checked, "+
				"and a page check misses a changed byte of a record; give the digest, or --pages-only to accept the pages alone", path, path)
		case err != nil:
			return out, err
		}
		defer f.Close()
		line, _ := bufio.NewReader(f).ReadString('\n')
		want, _, _ = strings.Cut(strings.TrimSpace(line), " ")
		source = path + ".sha256"
	}
	if want != stats.SHA256 {
		return out, fmt.Errorf("%s has SHA-256 %s, where %s says %s: it changed since the backup", path, stats.SHA256, source, want)
	}
	out.digest = true
	return out, nil
}

// restore puts a checked copy in a data directory, for an idemd started on it after.
func (a *app) restore(args []string) int {
	fs := a.flags("restore")
	dataDir := fs.String("data-dir", "", "the data directory of the idemd to start on the copy")
	blobDir := fs.String("blob-dir", "", "the blob directory of the idemd to start on the copy, when it is not <data-dir>/blobs (its --blob-store file:///dir)")
	replace := fs.Bool("replace", false, "replace a database there (kept beside it, renamed with the time)")
	check := digestFlags(fs)
	pos, err := a.parse(fs, args, 1, "one FILE")
	if err != nil {
		return a.usageError(err)
	}
	if *dataDir == "" {
		return a.usageError(errors.New("restore needs --data-dir DIR"))
	}
	checked, err := check.verify(pos[0])
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: %v; nothing was restored\n", err)
		return exitRefused
	}
	target := filepath.Join(*dataDir, boltstore.DatabaseFile)
	if _, err := os.Stat(target); err == nil && !*replace {
		fmt.Fprintf(a.stderr, "idemctl: %v: %s; nothing was restored\n", boltstore.ErrDataExists, target)
		fmt.Fprintln(a.stderr, "idemctl: --replace replaces it, keeping it beside the copy")
		return exitRefused
	}
	if *blobDir == "" {
		*blobDir = filepath.Join(*dataDir, "blobs")
	}
	// The blobs go first: a blob no record refers to is the sweep's, by its expiry,
	// while a record whose blob is missing would answer 502.
	blobs := 0
	if !*check.recordsOnly && checked.blobs > 0 {
		if blobs, err = restoreBlobs(pos[0], check.blobDir(pos[0]), *blobDir); err != nil {
			fmt.Fprintf(a.stderr, "idemctl: %v; the database was not restored\n", err)
			return exitRefused
		}
	}
	stats, err := boltstore.Restore(pos[0], *dataDir, *replace)
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: %v; nothing was restored\n", err)
		if errors.Is(err, boltstore.ErrDataExists) {
			fmt.Fprintln(a.stderr, "idemctl: --replace replaces it, keeping it beside the copy")
		}
		return exitRefused
	}
	if a.json {
		a.printJSON(map[string]any{"file": target, "records": stats.Records, "sha256": stats.SHA256, "blobs": blobs, "blob_dir": *blobDir})
	} else {
		fmt.Fprintf(a.stdout, "restored %d records to %s", stats.Records, target)
		if blobs > 0 {
			fmt.Fprintf(a.stdout, " and the %d results they keep by reference to %s", blobs, *blobDir)
		}
		fmt.Fprintf(a.stdout, "; start idemd with --data-dir %s\n", *dataDir)
	}
	return exitOK
}

func (a *app) fileError(err error) int {
	fmt.Fprintln(a.stderr, "idemctl:", err)
	return exitRefused
}
