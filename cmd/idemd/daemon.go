package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
)

// Main is the daemon: its configuration and what Open started. Tests build one, call
// ParseFlags and Open with --listen 127.0.0.1:0, read Addr, and Run it; main does the
// same with the real flags.
type Main struct {
	Listen           string
	Store            string
	DataDir          string
	DataMaxSize      int64
	StoreGuard       float64
	ReplicaAcks      int
	ReplicaTimeout   time.Duration
	Pipelines        int
	HashRecords      bool
	RecordLayout     string
	RequireNoevict   bool
	MaxResponseBytes int
	BlobStore        string
	BlobThreshold    int
	MaxBlobBytes     int
	BlobSweepEvery   time.Duration
	BlobSweepGrace   time.Duration
	MaxPointBytes    int
	Retention        time.Duration
	ShutdownTimeout  time.Duration
	StoreTimeout     time.Duration
	BodyTimeout      time.Duration
	WriteTimeout     time.Duration
	LogLevel         string
	AuthFile         string
	AllowedHosts     string
	TLSCert          string
	TLSKey           string
	Console          bool
	// MetricsTenantUsage puts every tenant's usage on the open scrape of /metrics.
	MetricsTenantUsage bool
	ShowVersion        bool
	// MigrateFrom is the store a live move takes records from (--migrate-from).
	MigrateFrom string

	Logger *slog.Logger
	// Tracing, when set, makes a span of each request (main sets it from OTEL_*).
	Tracing trace.TracerProvider
	// env names the flags set by environment variables, for errors about them.
	env fromEnv
	// keyring is the auth file in force, nil when the daemon runs open; cert is the TLS
	// certificate in force. Reload replaces both.
	keyring *auth.Keyring
	cert    atomic.Pointer[tls.Certificate]

	// What Open made and Close undoes.
	store    engine.Store
	service  *engine.Service
	migrator *engine.Migrator
	// clientName names the store's Redis connections (redisstore.Options.ClientName).
	clientName string
	listener   net.Listener
	httpServer *http.Server
}

// NewMain returns a Main with the defaults.
func NewMain() *Main {
	return &Main{Logger: slog.New(slog.NewJSONHandler(os.Stderr, nil))}
}

// ParseFlags reads the command line and the IDEMD_* environment variables (env.go).
func (m *Main) ParseFlags(args []string) (err error) {
	fs := flag.NewFlagSet("idemd", flag.ContinueOnError)
	fs.StringVar(&m.Listen, "listen", ":8080", "address to serve HTTP on")
	fs.StringVar(&m.MigrateFrom, "migrate-from", "", "serve from --store while moving every record out of this store (a URL as --store takes), live: each key is handed over from it at its first call, and a copier hands over the rest; every daemon of the old store must run this release or a later one first (docs/moving.md, Moving to another store while serving)")
	fs.StringVar(&m.Store, "store", "", "store URL: bolt:///abs/path/idemd.db, redis://, rediss://, redis+sentinel://, redis+cluster://; default: the embedded store in --data-dir")
	fs.IntVar(&m.ReplicaAcks, "redis-replica-acks", 0, "confirm every Redis write on this many replicas (WAIT) before answering; 503 not_replicated otherwise")
	fs.DurationVar(&m.ReplicaTimeout, "redis-replica-timeout", 250*time.Millisecond, "how long a write waits for --redis-replica-acks")
	fs.IntVar(&m.Pipelines, "redis-pipelines", redisstore.DefaultPipelines, "how many pipelines of scripts may be in flight to each Redis master at once on a fast link (a distant master gets more, up to 8 times as many); the calls that arrive meanwhile go together in the next")
	fs.StringVar(&m.RecordLayout, "redis-record-layout", string(redisstore.LayoutAuto), "how Redis records are kept: auto (the layout the other daemons of the Redis use, as its key "+redisstore.LayoutKey+" says; on a Redis without one, lean-only where it holds no records, strings where it holds the previous release's), strings (the layout the previous release reads), lean-ready (strings, and reading lean records too), lean (about half the memory; reads both), lean-only (lean, no longer looking at the earlier keys) or hashes (for releases before the previous); a layout given moves the key forward, and one that cannot run beside the key's refuses to start (docs/upgrading.md, Upgrading)")
	fs.BoolVar(&m.HashRecords, "redis-hash-records", false, "the same as --redis-record-layout hashes")
	fs.BoolVar(&m.RequireNoevict, "require-noeviction", false, "refuse to start unless every Redis master has maxmemory-policy noeviction")
	fs.StringVar(&m.DataDir, "data-dir", "idemd-data", "directory of the embedded store's idemd.db, when --store is not given")
	fs.Int64Var(&m.DataMaxSize, "data-max-size", 0, "size, in bytes, that the store guard measures the embedded store's database against; 0 measures it against the free space of its disk")
	fs.Float64Var(&m.StoreGuard, "store-guard", engine.DefaultGuardThreshold, "fill of the store (Redis used_memory of maxmemory on its fullest master, the embedded store's database of --data-max-size) past which tenants keeping more than their share are refused new keys (quota_exceeded); 0 turns the guard off")
	fs.IntVar(&m.MaxResponseBytes, "max-response-bytes", 1<<20, "largest stored response (body and headers), bytes")
	fs.StringVar(&m.BlobStore, "blob-store", "", "keep results over --blob-threshold in this blob store, the record keeping a reference: file:///abs/dir, file: (the directory blobs in --data-dir), s3://bucket/prefix?endpoint=URL&region=R&path_style=true (credentials from the AWS SDK's chain: environment, shared files, IRSA/pod identity, IMDS; never in the URL), or none; default on the embedded store: the directory blobs beside its database, which no other daemon shares; on Redis: none, and results over --max-response-bytes are refused (docs/sizing.md, Large results)")
	fs.IntVar(&m.BlobThreshold, "blob-threshold", engine.DefaultBlobThreshold, "with a blob store, the stored size (body and headers), bytes, over which a result goes to the blob store; at most --max-response-bytes")
	fs.IntVar(&m.MaxBlobBytes, "max-blob-bytes", engine.DefaultMaxBlobBytes, "with a blob store, largest stored result, bytes (its headers stay within --max-response-bytes)")
	fs.DurationVar(&m.BlobSweepEvery, "blob-sweep-every", defaultBlobSweepEvery, "with a blob store, how often the blob store is swept of the blobs of expired records")
	fs.DurationVar(&m.BlobSweepGrace, "blob-sweep-grace", engine.BlobSweepGrace, "with a blob store, how long after its record's expiry a sweep leaves a blob, for the daemons' and the store's clocks; at least twice --store-timeout, plus 250ms per MiB of --max-blob-bytes, plus 1s. A blob outlives its record by at most this plus --blob-sweep-every (docs/sizing.md, Large results)")
	fs.IntVar(&m.MaxPointBytes, "max-recovery-point-bytes", engine.DefaultMaxPointBytes, "largest recovery point's data, bytes; a pending record keeps one")
	fs.DurationVar(&m.Retention, "retention", engine.DefaultRetention, "how long results are kept when a request does not say")
	fs.DurationVar(&m.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "how long SIGTERM waits for in-flight requests")
	fs.DurationVar(&m.StoreTimeout, "store-timeout", engine.DefaultStoreTimeout, "bound on each store call; past it the request answers 503 store_unavailable. Keep it under clients' timeouts (the SDK's is 10s)")
	fs.DurationVar(&m.BodyTimeout, "body-timeout", server.DefaultTimeout, "how long a request body may take to arrive; slower clients get 408 and lose the connection")
	fs.DurationVar(&m.WriteTimeout, "write-timeout", server.DefaultTimeout, "how long writing an answer may take once it starts (a claim's wait does not count); clients that do not read lose the connection")
	fs.StringVar(&m.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&m.AuthFile, "auth-file", "", "YAML or JSON file of API tokens (hashed), tenants and limits; reloaded on SIGHUP (see docs/auth.md). Without it idemd is open")
	fs.StringVar(&m.AllowedHosts, "allowed-hosts", "", "without --auth-file, the names besides IP literals and localhost that requests may be sent to (their Host header), comma-separated; other names get 403, so that no web page reaches an open idemd by DNS rebinding (docs/auth.md)")
	fs.StringVar(&m.TLSCert, "tls-cert", "", "PEM certificate (chain) to serve HTTPS with; reloaded on SIGHUP")
	fs.StringVar(&m.TLSKey, "tls-key", "", "PEM private key of --tls-cert")
	fs.BoolVar(&m.Console, "console", false, "serve the operator's console at /console/: look keys up and purge them, the abandoned keys, traffic and the store, signed in with a token (docs/console.md, The console)")
	fs.BoolVar(&m.MetricsTenantUsage, "metrics-tenant-usage", false, "name every tenant's records and stored bytes on the open scrape of /metrics; without it only a bearer token sees them, a tenant's token its own and a platform token every tenant's (docs/auth.md)")
	fs.BoolVar(&m.ShowVersion, "version", false, "print the version and exit")
	if m.env, err = parseWithEnv(fs, args); err != nil || m.ShowVersion {
		return err
	}
	defer func() { err = m.env.explain(err) }()
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(m.LogLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if m.MaxResponseBytes <= 0 {
		return errors.New("--max-response-bytes must be positive")
	}
	if m.MaxPointBytes <= 0 {
		return errors.New("--max-recovery-point-bytes must be positive")
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if err := m.checkBlobFlags(given); err != nil {
		return err
	}
	if m.Retention < engine.MinRetention || m.Retention > engine.MaxRetention {
		return fmt.Errorf("--retention must be between %s and %s", engine.MinRetention, engine.MaxRetention)
	}
	if m.ReplicaAcks < 0 || m.ReplicaTimeout <= 0 {
		return errors.New("--redis-replica-acks must not be negative and --redis-replica-timeout must be positive")
	}
	if _, err := m.recordLayout(); err != nil {
		return err
	}
	if m.Pipelines < 1 {
		return errors.New("--redis-pipelines must be at least 1")
	}
	if m.BodyTimeout <= 0 || m.WriteTimeout <= 0 {
		return errors.New("--body-timeout and --write-timeout must be positive")
	}
	if m.StoreTimeout <= 0 {
		return errors.New("--store-timeout must be positive")
	}
	if m.StoreGuard < 0 || m.StoreGuard > 1 {
		return errors.New("--store-guard is a fraction of the store's limit, from 0 (off) to 1")
	}
	if m.DataMaxSize < 0 {
		return errors.New("--data-max-size must not be negative")
	}
	if m.ReplicaAcks > 0 && m.StoreTimeout <= m.ReplicaTimeout {
		return errors.New("--store-timeout must be longer than --redis-replica-timeout, which every write may wait")
	}
	if (m.TLSCert == "") != (m.TLSKey == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if _, err := m.allowedHosts(); err != nil {
		return err
	}
	return nil
}

// allowedHosts are the names of --allowed-hosts. Each is a bare host name: a port, a
// scheme or a path would never match a Host header, and would leave the name refused.
func (m *Main) allowedHosts() ([]string, error) {
	if m.AllowedHosts == "" {
		return nil, nil
	}
	if m.AuthFile != "" {
		return nil, errors.New("--allowed-hosts applies only to a daemon without --auth-file, which answers any Host")
	}
	var names []string
	for name := range strings.SplitSeq(m.AllowedHosts, ",") {
		name = strings.TrimSpace(name)
		if name == "" || strings.ContainsAny(name, ":/[]@ ") {
			return nil, fmt.Errorf("--allowed-hosts %q: each entry must be a host name, without scheme or port, such as idemd.platform.svc", m.AllowedHosts)
		}
		names = append(names, name)
	}
	return names, nil
}

// Addr is the address the daemon listens on once Open has bound it, and "" before
// or when Open failed.
func (m *Main) Addr() string {
	if m.listener == nil {
		return ""
	}
	return m.listener.Addr().String()
}

// openStore picks the store a URL names; without one, the embedded store in DataDir.
func (m *Main) openStore() (engine.Store, error) {
	switch {
	case m.Store == "":
		path, err := filepath.Abs(filepath.Join(m.DataDir, boltstore.DatabaseFile))
		if err != nil {
			return nil, err
		}
		m.Store = "bolt://" + path
		return m.openBolt(path)
	case strings.HasPrefix(m.Store, "bolt://"):
		path := strings.TrimPrefix(m.Store, "bolt://")
		if !filepath.IsAbs(path) {
			return nil, fmt.Errorf("--store %q: a bolt URL takes an absolute path, bolt:///var/lib/idemd/idemd.db", m.Store)
		}
		return m.openBolt(path)
	case strings.HasPrefix(m.Store, "redis"):
		layout, err := m.recordLayout()
		if err != nil {
			return nil, err
		}
		s, err := redisstore.OpenWith(m.Store, redisstore.Options{Layout: layout, Logger: m.Logger, ClientName: m.clientName,
			ReplicaAcks: m.ReplicaAcks, ReplicaTimeout: m.ReplicaTimeout, Pipelines: m.Pipelines})
		if err != nil {
			return nil, err
		}
		if err := m.checkEviction(s); err != nil {
			_ = s.Close()
			return nil, err
		}
		if err := m.agreeLayout(s, layout); err != nil {
			_ = s.Close()
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("--store %q: unknown scheme", m.Store)
}

// recordLayout reads --redis-record-layout and --redis-hash-records.
func (m *Main) recordLayout() (redisstore.Layout, error) {
	layout, err := redisstore.ParseLayout(m.RecordLayout)
	if err != nil {
		return "", fmt.Errorf("--redis-record-layout: %w", err)
	}
	if m.HashRecords {
		// strings was the default of --redis-record-layout when the two flags met first.
		if layout != redisstore.LayoutAuto && layout != redisstore.LayoutStrings && layout != redisstore.LayoutHashes {
			return "", fmt.Errorf("--redis-hash-records and --redis-record-layout %s disagree", layout)
		}
		return redisstore.LayoutHashes, nil
	}
	return layout, nil
}

// agreeLayout settles the record layout with the other daemons of the Redis before
// serving, so that a layout that cannot run beside theirs stops this one here. A Redis
// that does not answer yet leaves it to the store, which settles at its first call and
// answers 503 until then.
func (m *Main) agreeLayout(s *redisstore.Store, layout redisstore.Layout) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := s.AgreeLayout(ctx)
	switch {
	case errors.Is(err, redisstore.ErrLayoutConflict):
		return fmt.Errorf("--redis-record-layout %s: %w", layout, err)
	case err != nil:
		m.Logger.Warn("the Redis record layout is not agreed yet; calls answer 503 until Redis answers", "err", err)
	}
	return nil
}

// checkEviction reads maxmemory-policy on every master: eviction silently forgets
// records, pending leases included. It warns, or refuses with --require-noeviction.
func (m *Main) checkEviction(s *redisstore.Store) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bad, err := s.EvictionPolicies(ctx)
	switch {
	case err != nil && m.RequireNoevict:
		return fmt.Errorf("--require-noeviction: could not read maxmemory-policy: %w", err)
	case err != nil:
		m.Logger.Warn("could not check Redis's maxmemory-policy; it must be noeviction, or Redis may forget pending leases", "err", err)
	case len(bad) > 0 && m.RequireNoevict:
		return fmt.Errorf("--require-noeviction: Redis evicts keys (maxmemory-policy %v); set it to noeviction", bad)
	case len(bad) > 0:
		m.Logger.Warn("Redis may evict idemd's records, pending leases included; set maxmemory-policy noeviction", "policies", bad)
	}
	return nil
}

func (m *Main) openBolt(path string) (engine.Store, error) {
	s, err := boltstore.Open(path, boltstore.Options{MaxSize: m.DataMaxSize})
	if err != nil {
		return nil, err
	}
	m.Logger.Info("embedded store opened", "path", path)
	return s, nil
}

// Open does everything at start-up that can fail, and returns the first failure: it
// opens the store, reads the auth file and the TLS key pair, and binds the listener.
// Whatever it opened before a failure it closes again.
func (m *Main) Open() (err error) {
	defer func() {
		if err != nil {
			_ = m.Close()
		}
	}()
	if m.store, err = m.openStore(); err != nil {
		return err
	}
	if m.MigrateFrom != "" {
		if err := m.openMigration(); err != nil {
			return err
		}
	}
	if err := m.loadAccess(); err != nil {
		return err
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfoGauge())
	if c, ok := m.served().(prometheus.Collector); ok {
		registry.MustRegister(c)
	}
	if m.migrator != nil {
		registry.MustRegister(m.migrationMetrics())
	}
	blobs, err := m.openBlobs()
	if err != nil {
		return err
	}
	limits := server.Limits{MaxResponseBytes: m.MaxResponseBytes, MaxPointBytes: m.MaxPointBytes}
	if blobs != nil {
		limits.MaxBlobBytes = m.MaxBlobBytes
	}
	cfg := server.Config{
		Limits:   limits,
		Logger:   m.Logger,
		Registry: registry,
		Tracing:  m.Tracing,
		Console:  m.console(),

		MetricsTenantUsage: m.MetricsTenantUsage,

		BodyTimeout:  m.BodyTimeout,
		WriteTimeout: m.WriteTimeout,
	}
	if m.keyring != nil {
		cfg.Auth = m.keyring
	}
	// ParseFlags checked them.
	cfg.AllowedHosts, _ = m.allowedHosts()
	tenants := func() []string { return []string{engine.DefaultTenant} }
	if m.keyring != nil {
		tenants = m.keyring.Tenants
	}
	opts := []engine.Option{engine.WithStoreTimeout(m.StoreTimeout), engine.WithStoreGuard(m.StoreGuard, tenants)}
	if blobs != nil {
		opts = append(opts, engine.WithBlobs(meterBlobs(registry, blobs), engine.BlobOptions{Threshold: m.BlobThreshold, OnError: blobErrors(registry), SweepGrace: m.BlobSweepGrace}))
	}
	service := engine.NewService(m.store, m.Retention, opts...)
	m.service = service
	if m.listener, err = net.Listen("tcp", m.Listen); err != nil {
		return err
	}
	if m.TLSCert == "" {
		// Requests net/http refuses itself get problem+json too (not under TLS, where
		// the listener sees only ciphertext).
		m.listener = server.Listener(m.listener)
	}
	m.httpServer = &http.Server{
		Handler:           server.New(service, cfg),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(m.Logger.Handler(), slog.LevelWarn),
	}
	// Waiting claims would hold the drain for up to their wait_ms.
	m.httpServer.RegisterOnShutdown(service.StopWaiting)
	if m.TLSCert != "" {
		m.httpServer.TLSConfig = &tls.Config{
			MinVersion: tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return m.cert.Load(), nil
			},
		}
	}
	m.Logger.Info("idemd listening", "addr", m.Addr(), "tls", m.TLSCert != "", "store", redactURL(m.Store))
	return nil
}

// Run serves what Open made until ctx ends, reloading the auth file and TLS key pair
// on SIGHUP, then drains in-flight requests within the shutdown timeout.
func (m *Main) Run(ctx context.Context) error {
	if m.httpServer == nil {
		return errors.New("Run needs a successful Open first")
	}
	// SIGHUP is caught from here on, so that it reloads instead of ending the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	if m.migrator != nil {
		copyCtx, stopCopy := context.WithCancel(ctx)
		defer stopCopy()
		go m.copyOut(copyCtx)
	}
	if m.service != nil && m.service.BlobStore() != nil {
		sweepCtx, stopSweep := context.WithCancel(ctx)
		defer stopSweep()
		go m.sweepBlobs(sweepCtx, m.service)
	}
	served := make(chan error, 1)
	go func() {
		if m.TLSCert != "" {
			// The certificate comes from TLSConfig.GetCertificate.
			served <- m.httpServer.ServeTLS(m.listener, "", "")
			return
		}
		served <- m.httpServer.Serve(m.listener)
	}()
	for stopping := false; !stopping; {
		select {
		case err := <-served:
			return err
		case <-hup:
			m.Reload()
		case <-ctx.Done():
			stopping = true
		}
	}
	m.Logger.Info("shutting down", "timeout", m.ShutdownTimeout)
	drain, cancel := context.WithTimeout(context.Background(), m.ShutdownTimeout)
	defer cancel()
	if err := m.httpServer.Shutdown(drain); err != nil {
		m.Logger.Warn("in-flight requests did not finish in time", "err", err)
		_ = m.httpServer.Close()
	}
	return nil
}

// Close releases what Open made: the listener, if Run never served it, and the store.
// It is safe after a failed Open and more than once.
func (m *Main) Close() error {
	if m.listener != nil {
		// After Run, Shutdown has closed it already; that error means nothing.
		_ = m.listener.Close()
	}
	if m.store == nil {
		return nil
	}
	err := m.store.Close()
	m.store = nil
	if err != nil {
		return fmt.Errorf("closing the store: %w", err)
	}
	return nil
}

// loadAccess reads the auth file and the TLS key pair at start-up, where a bad file is
// fatal.
func (m *Main) loadAccess() error {
	if m.AuthFile == "" {
		names, _ := m.allowedHosts()
		m.Logger.Warn("no --auth-file: idemd is open, every request works in the default tenant; use --auth-file for tokens and tenants. "+
			"It answers requests sent to an IP literal, localhost or a name of --allowed-hosts", "allowed_hosts", names)
	} else {
		k, err := auth.Load(m.AuthFile)
		if err != nil {
			return fmt.Errorf("--auth-file: %w", err)
		}
		m.keyring = k
		m.Logger.Info("auth file loaded", "path", m.AuthFile, "tenants", len(k.Config().Tenants()), "tokens", k.Config().Tokens())
	}
	if m.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(m.TLSCert, m.TLSKey)
		if err != nil {
			return fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		m.cert.Store(&cert)
	}
	return nil
}

// Reload reads the auth file and the TLS key pair again, as SIGHUP asks. Whatever
// fails to load is logged and the version in force stays; requests in flight are not
// disturbed either way.
func (m *Main) Reload() {
	if m.keyring != nil {
		if err := m.keyring.Reload(); err != nil {
			m.Logger.Error("auth file not reloaded; the previous one stays in force", "err", err)
		} else {
			m.Logger.Info("auth file reloaded", "path", m.AuthFile, "tenants", len(m.keyring.Config().Tenants()), "tokens", m.keyring.Config().Tokens())
		}
	}
	if m.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(m.TLSCert, m.TLSKey)
		if err != nil {
			m.Logger.Error("TLS key pair not reloaded; the previous one stays in force", "err", err)
		} else {
			m.cert.Store(&cert)
			m.Logger.Info("TLS key pair reloaded", "cert", m.TLSCert)
		}
	}
	if m.keyring == nil && m.TLSCert == "" {
		m.Logger.Info("SIGHUP: nothing to reload (no --auth-file, no --tls-cert)")
	}
}

// redactURL hides a password in a store URL before it is logged.
func redactURL(u string) string {
	scheme, rest, ok := strings.Cut(u, "://")
	if !ok {
		return u
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return scheme + "://***@" + rest[at+1:]
	}
	return u
}
