package redisstore

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Open connects to the Redis deployment a URL names:
//
//	redis://[user:password@]host:port[/db]          standalone
//	rediss://...                                    standalone over TLS
//	redis+sentinel://[user:password@]host:port,host:port/master-name[?db=N]
//	redis+cluster://[user:password@]host:port,host:port[?tls=true]
//
// Connections are pooled by go-redis; nothing is dialled until the first command.
func Open(rawURL string) (*Store, error) {
	return OpenWith(rawURL, Options{})
}

// OpenWith is Open with options.
func OpenWith(rawURL string, opts Options) (*Store, error) {
	base := cmp.Or(opts.ClientName, DaemonClientName)
	h := heartbeat{instance: newInstance(), role: roleServing}
	if base == MigratingClientName {
		h.role = roleMigrating
	}
	daemon := base == DaemonClientName || base == MigratingClientName
	name := base
	if daemon {
		name += "." + h.instance
	}
	universal, err := newClient(rawURL, name)
	if err != nil {
		return nil, err
	}
	client, err := Adapt(universal)
	if err != nil {
		_ = universal.Close()
		return nil, err
	}
	s := New(client, opts)
	if daemon {
		s.startHeartbeat(h)
	}
	return s, nil
}

// DaemonClientName is the name an idemd daemon's connections give Redis (CLIENT
// SETNAME), followed by a dot and the store's instance (heartbeat.go), unless the
// URL's client_name says otherwise: Store.Daemons counts them, so that a copy between
// stores can tell that daemons still serve one.
const DaemonClientName = "idemd"

// MigratingClientName is the name a migrating daemon's connections to the store it
// moves records out of give Redis (idemd --migrate-from): not DaemonClientName, so
// that Daemons counts only the daemons that still serve that store alone.
const MigratingClientName = "idemd-migrating"

// NewClient returns the go-redis client for a store URL, its connections named
// DaemonClientName.
func NewClient(rawURL string) (redis.UniversalClient, error) {
	return newClient(rawURL, DaemonClientName)
}

func newClient(rawURL, name string) (redis.UniversalClient, error) {
	scheme, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		return nil, fmt.Errorf("store URL %q has no scheme", rawURL)
	}
	switch scheme {
	case "redis", "rediss":
		opts, err := redis.ParseURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		// Without it go-redis times reads by its own 3 s timeout, retried, and the
		// caller's deadline never reaches the socket.
		opts.ContextTimeoutEnabled = true
		if opts.ClientName == "" {
			opts.ClientName = name
		}
		return redis.NewClient(opts), nil
	case "redis+sentinel", "rediss+sentinel":
		u, err := url.Parse("redis://" + rest)
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		master := strings.Trim(u.Path, "/")
		if master == "" {
			return nil, fmt.Errorf("store URL %q names no Sentinel master (…/master-name)", rawURL)
		}
		opts := &redis.FailoverOptions{
			MasterName:            master,
			SentinelAddrs:         strings.Split(u.Host, ","),
			ContextTimeoutEnabled: true,
			ClientName:            name,
		}
		if u.User != nil {
			opts.Username = u.User.Username()
			opts.Password, _ = u.User.Password()
			opts.SentinelUsername = opts.Username
			opts.SentinelPassword = opts.Password
		}
		if db := u.Query().Get("db"); db != "" {
			if opts.DB, err = strconv.Atoi(db); err != nil {
				return nil, fmt.Errorf("store URL: db %q is not a number", db)
			}
		}
		if scheme == "rediss+sentinel" {
			opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		return redis.NewFailoverClient(opts), nil
	case "redis+cluster", "rediss+cluster":
		u, err := url.Parse("redis://" + rest)
		if err != nil {
			return nil, fmt.Errorf("store URL: %w", err)
		}
		if u.Host == "" {
			return nil, fmt.Errorf("store URL %q names no cluster nodes", rawURL)
		}
		// The periodic reload bounds how long a changed slot map goes unnoticed when no
		// request fails; failures trigger a reload at once (see reloadOnNetworkError).
		opts := &redis.ClusterOptions{Addrs: strings.Split(u.Host, ","), ClusterStateReloadInterval: 10 * time.Second,
			ContextTimeoutEnabled: true, ClientName: name}
		if u.User != nil {
			opts.Username = u.User.Username()
			opts.Password, _ = u.User.Password()
		}
		if scheme == "rediss+cluster" || u.Query().Get("tls") == "true" {
			opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		return redis.NewClusterClient(opts), nil
	}
	return nil, fmt.Errorf("store URL scheme %q is not one of redis, rediss, redis+sentinel, redis+cluster", scheme)
}

// SetLogger sends go-redis's own messages (failed dials, Sentinel's master changes)
// to logger at warn level, instead of its default unstructured output on stderr. It
// is process-wide, as go-redis's logger is.
func SetLogger(logger *slog.Logger) {
	redis.SetLogger(slogAdapter{logger})
}

type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Printf(ctx context.Context, format string, v ...any) {
	a.l.WarnContext(ctx, fmt.Sprintf(format, v...), "source", "go-redis")
}
