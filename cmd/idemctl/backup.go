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

	"github.com/idemd/idemd/internal/engine/boltstore"
)

// backupCmd copies a running daemon's embedded store to --out, checked against the
// daemon's digest and bbolt's check of every page before it takes the file's name, and
// writes FILE.sha256 beside it, in sha256sum's form.
func (a *app) backupCmd(args []string) int {
	if len(args) > 0 && args[0] == "verify" {
		return a.verifyBackup(args[1:])
	}
	fs := a.flags("backup")
	out := fs.String("out", "", "the file to write")
	if _, err := a.parse(fs, args, 0, "no arguments but --out FILE"); err != nil {
		return a.usageError(err)
	}
	if *out == "" {
		return a.usageError(errors.New("backup needs --out FILE"))
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(*out), "."+filepath.Base(*out)+".*")
	if err != nil {
		return a.fileError(err)
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
		return a.fail(err)
	}
	stats, err := boltstore.Verify(tmp.Name())
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: the copy idemd sent does not check, and %s was not written: %v\n", *out, err)
		return exitRefused
	}
	if err := os.Rename(tmp.Name(), *out); err != nil {
		return a.fileError(err)
	}
	if err := os.WriteFile(*out+".sha256", []byte(copied.SHA256+"  "+filepath.Base(*out)+"\n"), 0o600); err != nil {
		return a.fileError(err)
	}
	if a.json {
		a.printJSON(map[string]any{"file": *out, "records": stats.Records, "bytes": stats.Bytes, "sha256": stats.SHA256})
	} else {
		fmt.Fprintf(a.stdout, "backed up %d records (%d bytes) to %s, sha256 %s in %s.sha256\n", stats.Records, stats.Bytes, *out, stats.SHA256, *out)
	}
	return exitOK
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
		a.printJSON(map[string]any{"file": pos[0], "records": stats.Records, "bytes": stats.Bytes, "sha256": stats.SHA256, "digest_checked": stats.digest})
	} else {
		fmt.Fprintf(a.stdout, "%s: %s, %d records (%d bytes), sha256 %s\n", pos[0], checked, stats.Records, stats.Bytes, stats.SHA256)
	}
	return exitOK
}

// digestCheck is how a copy's digest is known: from FILE.sha256 beside it, from
// --sha256, or not at all, which --pages-only accepts.
type digestCheck struct {
	sha256    *string
	pagesOnly *bool
}

func digestFlags(fs *flag.FlagSet) digestCheck {
	return digestCheck{
		sha256:    fs.String("sha256", "", "the copy's SHA-256, as backup printed it, when FILE.sha256 is not beside it"),
		pagesOnly: fs.Bool("pages-only", false, "without a digest, accept bbolt's check of the pages alone, which misses a changed byte of data"),
	}
}

// checkedCopy is what a check of a copy found, and whether its digest was compared.
type checkedCopy struct {
	boltstore.BackupStats
	digest bool
}

// verify is boltstore.Verify, and the digest given or in FILE.sha256 compared.
func (c digestCheck) verify(path string) (checkedCopy, error) {
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
	replace := fs.Bool("replace", false, "replace a database there (kept beside it, renamed with the time)")
	check := digestFlags(fs)
	pos, err := a.parse(fs, args, 1, "one FILE")
	if err != nil {
		return a.usageError(err)
	}
	if *dataDir == "" {
		return a.usageError(errors.New("restore needs --data-dir DIR"))
	}
	if _, err := check.verify(pos[0]); err != nil {
		fmt.Fprintf(a.stderr, "idemctl: %v; nothing was restored\n", err)
		return exitRefused
	}
	stats, err := boltstore.Restore(pos[0], *dataDir, *replace)
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: %v; nothing was restored\n", err)
		if errors.Is(err, boltstore.ErrDataExists) {
			fmt.Fprintln(a.stderr, "idemctl: --replace replaces it, keeping it beside the copy")
		}
		return exitRefused
	}
	target := filepath.Join(*dataDir, boltstore.DatabaseFile)
	if a.json {
		a.printJSON(map[string]any{"file": target, "records": stats.Records, "sha256": stats.SHA256})
	} else {
		fmt.Fprintf(a.stdout, "restored %d records to %s; start idemd with --data-dir %s\n", stats.Records, target, *dataDir)
	}
	return exitOK
}

func (a *app) fileError(err error) int {
	fmt.Fprintln(a.stderr, "idemctl:", err)
	return exitRefused
}
