package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
)

// copyCmd copies every record of one store into another, lease tokens and all, while
// no daemon serves either: the move between stores with downtime
// (docs/moving.md, "Growing out of one machine").
func (a *app) copyCmd(args []string) int {
	fs := a.flags("copy")
	from := fs.String("from", "", "the store to copy: bolt:///abs/path/idemd.db or a Redis URL as idemd's --store")
	to := fs.String("to", "", "the store to copy into, as --from")
	every := fs.Duration("progress", 2*time.Second, "how often to print the progress")
	if _, err := a.parse(fs, args, 0, "no arguments but --from and --to"); err != nil {
		return a.usageError(err)
	}
	if *from == "" || *to == "" {
		return a.usageError(errors.New("copy needs --from STORE and --to STORE"))
	}
	src, err := openStore(*from, true)
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: --from: %v\n", err)
		return exitUnavailable
	}
	defer src.Close()
	dst, err := openStore(*to, false)
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: --to: %v\n", err)
		return exitUnavailable
	}
	defer dst.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	show := func(p engine.CopyProgress) {
		if !a.json {
			fmt.Fprintf(a.stderr, "copied %d of %d read: %d written, %d there already, %d kept, %d expired; %.0f records/s, %s; about %d left, %s to go\n",
				p.Written+p.Same+p.Kept+p.Expired, p.Read, p.Written, p.Same, p.Kept, p.Expired, p.Rate(), p.Elapsed.Round(time.Millisecond),
				p.Left(), p.ToGo().Round(time.Second))
		}
	}
	p, err := engine.Copy(ctx, src.(engine.Porter), dst.(engine.Porter), *every, show)
	if err != nil {
		fmt.Fprintf(a.stderr, "idemctl: the copy stopped after %d records: %v; run it again to finish it\n", p.Read, err)
		return exitUnavailable
	}
	if a.json {
		kept := make([]map[string]string, 0, len(p.KeptIDs))
		for _, e := range p.KeptIDs {
			kept = append(kept, map[string]string{"tenant": e.ID.Tenant, "key_sha256": hex.EncodeToString(e.KeyDigest[:]), "key": e.ID.Key})
		}
		a.printJSON(map[string]any{"read": p.Read, "written": p.Written, "same": p.Same, "kept": p.Kept, "expired": p.Expired,
			"seconds": p.Elapsed.Seconds(), "records_per_second": p.Rate(), "kept_records": kept})
		return exitOK
	}
	for _, e := range p.KeptIDs {
		name := e.ID.Key
		if name == "" {
			name = "sha256:" + hex.EncodeToString(e.KeyDigest[:])
		}
		fmt.Fprintf(a.stdout, "kept\t%s\t%s\n", e.ID.Tenant, name)
	}
	fmt.Fprintf(a.stdout, "copied %d records in %s: %d written, %d there already, %d kept (the target holds another record of the key), %d expired\n",
		p.Read, p.Elapsed.Round(time.Millisecond), p.Written, p.Same, p.Kept, p.Expired)
	return exitOK
}

// openStore opens a store as idemd does, for a copy: a bolt file only when no idemd
// holds it, and a Redis only when no daemon of this release is connected, in the layout
// its daemons agreed (or, for an empty one, the layout a first daemon would choose).
func openStore(url string, source bool) (engine.Store, error) {
	switch {
	case strings.HasPrefix(url, "bolt://"):
		path := strings.TrimPrefix(url, "bolt://")
		if !filepath.IsAbs(path) {
			return nil, fmt.Errorf("%q: a bolt URL takes an absolute path, bolt:///var/lib/idemd/idemd.db", url)
		}
		if _, err := os.Stat(path); source && err != nil {
			// A source that is not there would be created empty, and copied as nothing.
			return nil, err
		}
		s, err := boltstore.Open(path, boltstore.Options{LockTimeout: time.Second})
		if err != nil {
			return nil, fmt.Errorf("%w: stop the idemd that serves it first", err)
		}
		return s, nil
	case strings.HasPrefix(url, "redis"):
		s, err := redisstore.OpenWith(url, redisstore.Options{Layout: redisstore.LayoutAuto, ClientName: "idemctl-copy"})
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		n, err := s.Daemons(ctx)
		if err == nil && n > 0 {
			err = fmt.Errorf("%d connections of idemd daemons are open to it: stop every daemon of both stores first", n)
		}
		if err == nil {
			_, err = s.AgreeLayout(ctx)
		}
		if err != nil {
			_ = s.Close()
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("%q: bolt:///abs/path/idemd.db, redis://, rediss://, redis+sentinel:// or redis+cluster://", url)
}
