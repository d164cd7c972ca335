package main

import (
	"bufio"
	"context"
	"errors"
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

// verifyBackup checks a copy: its digest against FILE.sha256 when there is one, and
// bbolt's check of every page.
func (a *app) verifyBackup(args []string) int {
	fs := a.flags("backup verify")
	pos, err := a.parse(fs, args, 1, "one FILE")
	if err != nil {
		return a.usageError(err)
	}
	stats, err := verifyCopy(pos[0])
	if err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	if a.json {
		a.printJSON(map[string]any{"file": pos[0], "records": stats.Records, "bytes": stats.Bytes, "sha256": stats.SHA256})
	} else {
		fmt.Fprintf(a.stdout, "%s: whole, %d records (%d bytes), sha256 %s\n", pos[0], stats.Records, stats.Bytes, stats.SHA256)
	}
	return exitOK
}

// verifyCopy is boltstore.Verify, and the digest of FILE.sha256 when it is there.
func verifyCopy(path string) (boltstore.BackupStats, error) {
	stats, err := boltstore.Verify(path)
	if err != nil {
		return stats, err
	}
	f, err := os.Open(path + ".sha256")
	if errors.Is(err, os.ErrNotExist) {
		return stats, nil
	}
	if err != nil {
		return stats, err
	}
	defer f.Close()
	line, _ := bufio.NewReader(f).ReadString('\n')
	want, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	if want != stats.SHA256 {
		return stats, fmt.Errorf("%s has SHA-256 %s, where %s.sha256 says %s: it changed since the backup", path, stats.SHA256, path, want)
	}
	return stats, nil
}

// restore puts a checked copy in a data directory, for an idemd started on it after.
func (a *app) restore(args []string) int {
	fs := a.flags("restore")
	dataDir := fs.String("data-dir", "", "the data directory of the idemd to start on the copy")
	replace := fs.Bool("replace", false, "replace a database there (kept beside it, renamed with the time)")
	pos, err := a.parse(fs, args, 1, "one FILE")
	if err != nil {
		return a.usageError(err)
	}
	if *dataDir == "" {
		return a.usageError(errors.New("restore needs --data-dir DIR"))
	}
	if _, err := verifyCopy(pos[0]); err != nil {
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
