package server

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemd/idemd/internal/api"
	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
)

// Console configures the operator's console: a page served from the binary at
// /console/, which signs in with a bearer token and calls the API and the console's
// own endpoints under /console/api/.
type Console struct {
	// Enabled serves the console; without it /console/ is not found.
	Enabled bool
	// Store describes the store for the console's store view.
	Store StoreInfo
}

// StoreInfo is what the console shows of the store. The daemon fills it in, since it
// is the one that knows how the store was opened.
type StoreInfo struct {
	// Kind is embedded, redis, sentinel or cluster.
	Kind string
	// Layout is how the store keeps records (for Redis, --redis-record-layout).
	Layout string
	// AgreedLayout, when set, says the layout the daemons sharing the store agreed on
	// and why (for Redis told auto, or none): the console shows it beside Layout.
	AgreedLayout func(ctx context.Context) (layout, why string, err error)
	// Location is where the records are: the embedded store's file, or the Redis
	// addresses without a password.
	Location string
	// Stats, when set, is the store's own collector; the console reads the
	// idemd_redis_* series from it, per master.
	Stats prometheus.Collector
	// Topology, when set, reads the store's masters and their replicas now, with
	// their round trips from this daemon.
	Topology func(ctx context.Context) ([]StoreNode, error)
	// Migration, when set, says where this daemon's live move out of another store
	// (--migrate-from) stands.
	Migration func() Migration
}

// Migration is a live move's progress as the store view shows it.
type Migration struct {
	// From is the old store, without a password.
	From string `json:"from"`
	// HandedOver counts the keys the copier handed over, Left those its pass has left
	// to hand over, ByCalls those calls handed over (or found sealed) first.
	HandedOver int64 `json:"handed_over"`
	Left       int64 `json:"left"`
	ByCalls    int64 `json:"by_calls"`
	Failed     int64 `json:"failed"`
	// PerSecond is the copier's rate, ToGoS about how long what is left takes.
	PerSecond float64 `json:"per_second"`
	ToGoS     float64 `json:"to_go_s"`
	// AloneDaemons counts the daemons still serving the old store alone, once
	// nothing else is left: the move is not done while there are any.
	AloneDaemons int `json:"alone_daemons"`
	// Waiting names what the move waits for, one line each: connections to the old store
	// that may be daemons that do not know markers (the move writes no marker and is
	// not done while there are any), daemons serving it alone (it is not done).
	Waiting []string `json:"waiting,omitempty"`
	// Done: the old store holds only markers; it can be retired once no daemon serves
	// it alone and every daemon is restarted on the new store alone.
	Done bool `json:"done"`
}

// StoreNode is one master of the store, as StoreInfo.Topology reads it.
type StoreNode struct {
	Address   string
	RoundTrip time.Duration
	// Err says why the master did not answer.
	Err      error
	Replicas []StoreReplica
}

// StoreReplica is one replica of a master: the link as its master reports it, and a
// round trip from this daemon.
// Its fields are those of redisstore.Replica, in the same order, so that the daemon
// converts one into the other.
type StoreReplica struct {
	Address   string
	State     string
	LagBytes  int64
	SinceAck  time.Duration
	RoundTrip time.Duration
	// Err says why the replica did not answer a PING.
	Err error
}

// consoleCSP lets the page load its own script and style sheet and call its own
// origin, and nothing else: no inline script or style, no framing, no form posts. Even
// a record whose data were turned into markup by mistake could then run nothing.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"

// consoleFiles are the page, its style sheet and its script, written by hand and
// served as they are: no framework, no build step, nothing fetched from elsewhere.
//
//go:embed console
var consoleFiles embed.FS

type consoleAsset struct {
	contentType string
	body        []byte
}

// consoleTypes are the media types of the console's files, fixed here rather than
// read from the system's table, which may name JavaScript otherwise.
var consoleTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
}

// consoleAssets are the files of consoleFiles by name, read once.
var consoleAssets = func() map[string]consoleAsset {
	assets := make(map[string]consoleAsset)
	entries, err := fs.ReadDir(consoleFiles, "console")
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		body, err := fs.ReadFile(consoleFiles, "console/"+e.Name())
		if err != nil {
			panic(err)
		}
		ct, ok := consoleTypes[path.Ext(e.Name())]
		if !ok {
			panic("server: the console file " + e.Name() + " has no known media type")
		}
		assets[e.Name()] = consoleAsset{contentType: ct, body: body}
	}
	return assets
}()

// ConsoleAssetBytes is the size of the console's files together, as docs/operations.md
// states it.
func ConsoleAssetBytes() int {
	n := 0
	for _, a := range consoleAssets {
		n += len(a.body)
	}
	return n
}

// consoleRoute is one of the console's JSON endpoints and the scope it needs in the
// tenant it acts in ("" for any valid token). The store view acts in no tenant: its
// ScopePlatform is checked by its handler.
type consoleRoute struct {
	method, path string
	scope        auth.Scope
	handle       func(s *Server, c echo.Context) error
}

var consoleRoutes = []consoleRoute{
	{http.MethodGet, "/console/api/whoami", "", (*Server).consoleWhoami},
	{http.MethodGet, "/console/api/tenants", "", (*Server).consoleTenants},
	{http.MethodGet, "/console/api/derive", "", (*Server).consoleDerive},
	{http.MethodGet, "/console/api/records", auth.ScopeUse, (*Server).consoleLookup},
	{http.MethodGet, "/console/api/result", auth.ScopeUse, (*Server).consoleResult},
	{http.MethodDelete, "/console/api/records", auth.ScopeAdmin, (*Server).consolePurge},
	{http.MethodGet, "/console/api/abandoned", auth.ScopeUse, (*Server).consoleAbandoned},
	{http.MethodGet, "/console/api/traffic", auth.ScopeUse, (*Server).consoleTraffic},
	{http.MethodGet, "/console/api/overview", "", (*Server).consoleOverview},
	{http.MethodGet, "/console/api/store", auth.ScopePlatform, (*Server).consoleStore},
}

// consolePaths are the console's routes that answer without a token: the page and its
// files, which hold nothing but code. Every call the page makes carries the token.
var consolePaths = map[string]bool{"/console": true, "/console/*": true}

// consoleState is what the console's endpoints read besides the engine.
type consoleState struct {
	store   StoreInfo
	tenants func() []string
	// scopes is consoleRoutes' scope by endpoint, as the handlers look theirs up.
	scopes map[string]auth.Scope
	// stats gathers the store's collector alone, so that the store view never runs
	// the other collectors of the daemon's registry (the abandoned-keys count reads
	// the store).
	stats *prometheus.Registry
	// limits are a tenant's limits in the auth file, nil without one.
	limits func(string) (auth.Limits, bool)
}

// registerConsole adds the console's routes to e. The security headers go on before
// routing, so that every answer under /console carries them, refusals included.
func (s *Server) registerConsole(e *echo.Echo, cfg Console, tenants func() []string) {
	s.traffic = newTraffic()
	s.console = &consoleState{store: cfg.Store, tenants: tenants, scopes: make(map[string]auth.Scope, len(consoleRoutes))}
	if cfg.Store.Stats != nil {
		s.console.stats = prometheus.NewRegistry()
		s.console.stats.MustRegister(cfg.Store.Stats)
	}
	e.Pre(consoleHeaders)
	e.GET("/console", func(c echo.Context) error {
		setOutcome(c, "ok")
		return c.Redirect(http.StatusMovedPermanently, "/console/")
	})
	e.GET("/console/*", s.consoleAsset)
	for _, r := range consoleRoutes {
		s.console.scopes[r.method+" "+r.path] = r.scope
		e.Add(r.method, r.path, func(c echo.Context) error { return r.handle(s, c) })
	}
}

// registerConsoleOff makes everything under /console not found when the console is
// off, before authentication (consolePaths): a 401 would say that a token opens
// something there.
func registerConsoleOff(e *echo.Echo) {
	for _, p := range []string{"/console", "/console/*"} {
		e.RouteNotFound(p, func(echo.Context) error { return echo.ErrNotFound })
	}
}

func consoleHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if p := c.Request().URL.Path; p == "/console" || strings.HasPrefix(p, "/console/") {
			h := c.Response().Header()
			h.Set("Content-Security-Policy", consoleCSP)
			h.Set("X-Content-Type-Options", "nosniff")
			h.Set("Referrer-Policy", "no-referrer")
			// The answers hold tenants' records; no cache keeps them.
			h.Set("Cache-Control", "no-store")
		}
		return next(c)
	}
}

// consoleAsset serves the page and its files.
func (s *Server) consoleAsset(c echo.Context) error {
	name := c.Param("*")
	if name == "" {
		name = "index.html"
	}
	a, ok := consoleAssets[name]
	if !ok {
		return echo.ErrNotFound
	}
	setOutcome(c, "ok")
	return c.Blob(http.StatusOK, a.contentType, a.body)
}

// onlyParams refuses a query parameter the endpoint does not take, or one given twice,
// naming it, so that a misspelt filter is not silently ignored.
func onlyParams(c echo.Context, allowed ...string) error {
	for name, values := range c.QueryParams() {
		if !slices.Contains(allowed, name) {
			if len(allowed) == 0 {
				return invalid("%s: this endpoint takes no query parameters", name)
			}
			return invalid("%s is not a parameter of this endpoint; it takes %s", name, strings.Join(allowed, ", "))
		}
		if len(values) > 1 {
			return invalid("%s is given %d times; give it once", name, len(values))
		}
	}
	return nil
}

// consoleTenant is the tenant a console call acts in, the tenant parameter or else the
// token's own, once the principal is allowed the route's scope there: another tenant
// needs the platform scope, and then must be one the auth file declares. A refusal is
// counted and logged as the API's are.
func (s *Server) consoleTenant(c echo.Context) (string, error) {
	p := principalOf(c)
	endpoint := s.endpointOf(c)
	scope, ok := s.console.scopes[endpoint]
	if !ok {
		panic("server: the console endpoint " + endpoint + " has no entry in consoleRoutes")
	}
	tenant := c.QueryParam("tenant")
	if tenant == "" {
		tenant = p.Tenant.Name
	}
	if !auth.ValidTenant(tenant) {
		return "", invalid("tenant is %q; a tenant name is 1 to 64 of a-z 0-9 _ -, starting with a letter or digit", tenant)
	}
	if err := p.AuthorizeIn(tenant, scope); err != nil {
		s.refuseConsole(c, tenant, err)
		return "", err
	}
	if tenant != p.Tenant.Name && !slices.Contains(s.console.tenants(), tenant) {
		return "", &problem{status: http.StatusNotFound, code: codeNotFound, detail: fmt.Sprintf("tenant: the auth file declares no tenant %q", tenant)}
	}
	return tenant, nil
}

// refuseConsole counts and logs a console call refused for a missing scope, as the
// API's are.
func (s *Server) refuseConsole(c echo.Context, askedTenant string, err error) {
	p := principalOf(c)
	s.metrics.authFailures.WithLabelValues("forbidden").Inc()
	s.log.Warn("console request refused: missing scope", "reason", "forbidden", "tenant", p.Tenant.Name,
		"token", p.Name, "asked_tenant", askedTenant, "endpoint", s.endpointOf(c), "remote", c.Request().RemoteAddr)
}

// consoleWho is who the console is signed in as.
type consoleWho struct {
	Tenant string       `json:"tenant"`
	Token  string       `json:"token"`
	Scopes []auth.Scope `json:"scopes"`
	// Open is true when idemd runs without an auth file: every request works in the
	// default tenant with every scope, token or not.
	Open bool `json:"open"`
}

func (s *Server) consoleWhoami(c echo.Context) error {
	if err := onlyParams(c); err != nil {
		return err
	}
	p := principalOf(c)
	return s.reply(c, answer{http.StatusOK, "ok", consoleWho{Tenant: p.Tenant.Name, Token: p.Name, Scopes: p.Scopes(), Open: s.auth == nil}})
}

// consoleTenants lists the tenants the token may choose: every tenant of the auth file
// for a platform token, its own otherwise.
func (s *Server) consoleTenants(c echo.Context) error {
	if err := onlyParams(c); err != nil {
		return err
	}
	p := principalOf(c)
	tenants := []string{p.Tenant.Name}
	if p.Can(auth.ScopePlatform) {
		tenants = s.console.tenants()
		slices.Sort(tenants)
	}
	return s.reply(c, answer{http.StatusOK, "ok", map[string]any{"tenants": tenants, "own": p.Tenant.Name}})
}

// middlewareKeyNamespace starts every key a middleware derives (docs/middleware.md).
const middlewareKeyNamespace = "idempotency-key:v1:"

// middlewareKey is the idemd key under which a middleware keeps the request of scope
// that carried Idempotency-Key key, after prefix: the SDKs' derivation, which the
// shared vectors in clients/testdata/idemd_key.json pin. It is done here, in Go, so that
// the page needs no hashing of its own.
func middlewareKey(prefix, scope, key string) string {
	h := sha256.New()
	var n [8]byte
	for _, part := range []string{scope, key} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		h.Write(n[:])
		h.Write([]byte(part))
	}
	return prefix + middlewareKeyNamespace + hex.EncodeToString(h.Sum(nil))
}

// maxIdempotencyKeyBytes is the longest Idempotency-Key a middleware takes.
const maxIdempotencyKeyBytes = 255

func (s *Server) consoleDerive(c echo.Context) error {
	if err := onlyParams(c, "scope", "idempotency_key", "prefix"); err != nil {
		return err
	}
	scope, key, prefix := c.QueryParam("scope"), c.QueryParam("idempotency_key"), c.QueryParam("prefix")
	derivedLen := len(middlewareKey("", "", ""))
	switch {
	case scope == "":
		return invalid("scope is required: what the middleware's scope function returned for the request")
	case !utf8.ValidString(scope):
		return invalid("scope is not valid UTF-8")
	case key == "":
		return invalid("idempotency_key is required: the Idempotency-Key header's value, without its quotes")
	case len(key) > maxIdempotencyKeyBytes:
		return invalid("idempotency_key is %d bytes; a middleware takes at most %d", len(key), maxIdempotencyKeyBytes)
	case !utf8.ValidString(prefix):
		return invalid("prefix is not valid UTF-8")
	case len(prefix)+derivedLen > engine.MaxKeyBytes:
		return invalid("prefix is %d bytes; with the %d of a derived key it must fit in %d", len(prefix), derivedLen, engine.MaxKeyBytes)
	}
	return s.reply(c, answer{http.StatusOK, "ok", map[string]string{"key": middlewareKey(prefix, scope, key)}})
}

// consoleRecord is a record as the console shows it: the API's KeyRecord, the tenant,
// whether the current lease was taken over from a holder whose lease ran out (which
// the API's lookup does not say), and the daemon's clock, against which the page counts
// the lease down.
type consoleRecord struct {
	api.KeyRecord
	Tenant    string `json:"tenant"`
	Recovered bool   `json:"recovered"`
	// PointSealed says that the recovery point's data is a sealed envelope by the
	// check a sealed result passes (validEnvelope): a recovery point has no mark of its
	// own, and plain data may start with the envelope's marker.
	PointSealed bool `json:"recovery_point_sealed"`
	// ByReference describes a result kept in the blob store: the record shows its
	// status (and its headers unless sealed) but not its bytes, which
	// /console/api/result answers.
	ByReference *consoleBlob `json:"response_by_reference,omitempty"`
	ServerTime  time.Time    `json:"server_time"`
}

// consoleBlob is what the console shows of a result kept in the blob store: its size
// and SHA-256 as the record's reference names them, and whether it is a sealed
// envelope.
type consoleBlob struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	Sealed bool   `json:"sealed"`
}

// consoleKey reads the key a console call names, in the tenant it may work in.
func (s *Server) consoleKey(c echo.Context) (engine.ID, error) {
	if err := onlyParams(c, "tenant", "key"); err != nil {
		return engine.ID{}, err
	}
	tenant, err := s.consoleTenant(c)
	if err != nil {
		return engine.ID{}, err
	}
	key := c.QueryParam("key")
	if err := validKey("key", key); err != nil {
		return engine.ID{}, err
	}
	return engine.ID{Tenant: tenant, Key: key}, nil
}

func (s *Server) consoleLookup(c echo.Context) error {
	id, err := s.consoleKey(c)
	if err != nil {
		return err
	}
	// A result kept in the blob store is not read back: the page shows its size and
	// offers it for download, which reads it back and checks it.
	rec, err := s.engine.Inspect(c.Request().Context(), id)
	if err != nil {
		return err
	}
	byRef := byReference(&rec)
	sealed := rec.RecoveryPoint != nil && validEnvelope(rec.RecoveryPoint.Data) == nil
	out := consoleRecord{KeyRecord: apiRecord(rec), Tenant: id.Tenant,
		Recovered: rec.Recovered, PointSealed: sealed, ByReference: byRef, ServerTime: time.Now().UTC()}
	if byRef != nil {
		out.Response.Body = nil
	}
	return s.reply(c, answer{http.StatusOK, "ok", out})
}

// byReference takes out of rec's response the reference to a result kept in the blob
// store, and answers what the console shows of it; nil for a result kept in the record.
func byReference(rec *engine.Record) *consoleBlob {
	ref, ok := rec.Response.Blob()
	if !ok {
		return nil
	}
	resp := *rec.Response
	resp.Headers = maps.Clone(resp.Headers)
	delete(resp.Headers, engine.BlobHeader)
	mark, sealed := resp.Headers[engine.SealedHeader]
	sealed = sealed && len(resp.Headers) == 1 && len(mark) == 1 && mark[0] == "1"
	if sealed || len(resp.Headers) == 0 {
		// A sealed envelope's headers are inside it.
		resp.Headers = nil
	}
	resp.Body = nil
	rec.Response = &resp
	return &consoleBlob{Size: ref.Size, SHA256: ref.SHA256, Sealed: sealed}
}

// consoleResult answers a key's stored result raw, for the page to download: the
// checks of GET /v1/keys/{key}/result (sendResult), in the tenant the console call
// may work in.
func (s *Server) consoleResult(c echo.Context) error {
	id, err := s.consoleKey(c)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Content-Disposition", `attachment; filename="result.bin"`)
	err = s.sendResult(c, id)
	if err != nil && !c.Response().Committed {
		// The problem the error becomes is no file.
		c.Response().Header().Del("Content-Disposition")
	}
	return err
}

func (s *Server) consolePurge(c echo.Context) error {
	id, err := s.consoleKey(c)
	if err != nil {
		return err
	}
	if err := s.engine.Purge(c.Request().Context(), id); err != nil {
		return err
	}
	s.logPurge(c, id.Tenant, id.Key, "console")
	setOutcome(c, "ok")
	return c.NoContent(http.StatusNoContent)
}

// logPurge says who purged which key: a purge destroys a result that retries would
// have been answered with, so it is on record whichever way it came.
func (s *Server) logPurge(c echo.Context, tenant, key, via string) {
	p := principalOf(c)
	s.log.Info("record purged", "tenant", tenant, "key", key, "token", p.Name, "token_tenant", p.Tenant.Name,
		"via", via, "remote", c.Request().RemoteAddr)
}

func (s *Server) consoleAbandoned(c echo.Context) error {
	if err := onlyParams(c, "tenant", "prefix", "cursor", "limit", "older_than_ms"); err != nil {
		return err
	}
	tenant, err := s.consoleTenant(c)
	if err != nil {
		return err
	}
	var params api.ListAbandonedParams
	if v := c.QueryParam("prefix"); v != "" {
		params.Prefix = &v
	}
	if v := c.QueryParam("cursor"); v != "" {
		params.Cursor = &v
	}
	if params.OlderThanMs, err = queryInt(c, "older_than_ms"); err != nil {
		return err
	}
	limit, err := queryInt(c, "limit")
	if err != nil {
		return err
	}
	if limit != nil {
		// abandonedQuery bounds it; an int holds whatever passes.
		n := int(max(min(*limit, engine.MaxAbandonedLimit+1), 0))
		params.Limit = &n
	}
	q, err := abandonedQuery(tenant, params, time.Now())
	if err != nil {
		return err
	}
	page, err := s.engine.Abandoned(c.Request().Context(), q)
	if err != nil {
		return err
	}
	return s.reply(c, answer{http.StatusOK, "ok", abandonedKeys(page)})
}

// queryInt reads an optional whole-number query parameter.
func queryInt(c echo.Context, name string) (*int64, error) {
	v := c.QueryParam(name)
	if v == "" {
		return nil, nil
	}
	x, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return nil, invalid("%s is %q, not a whole number", name, v)
	}
	return &x, nil
}

func (s *Server) consoleTraffic(c echo.Context) error {
	if err := onlyParams(c, "tenant"); err != nil {
		return err
	}
	tenant, err := s.consoleTenant(c)
	if err != nil {
		return err
	}
	host, _ := os.Hostname()
	// The daemon is named, since the counts are its own: behind a load balancer, the
	// page's reader sees one daemon's share of the tenant's claims.
	return s.reply(c, answer{http.StatusOK, "ok", struct {
		trafficSeries
		Daemon string `json:"daemon"`
	}{s.traffic.series(tenant, time.Now()), host}})
}

// consoleMaster is one Redis master as the store view shows it.
type consoleMaster struct {
	Address string `json:"address"`
	// RoundTripMs is the shortest round trip of a pipeline to it lately; nil before
	// the first.
	RoundTripMs *float64 `json:"round_trip_ms"`
	Pipelines   *float64 `json:"pipelines"`
	QueuedCalls *float64 `json:"queued_calls"`
	// PingMs is the time a PING took as the view was read; nil when it failed (Error)
	// or the store reads no topology.
	PingMs   *float64         `json:"ping_ms"`
	Error    string           `json:"error,omitempty"`
	Replicas []consoleReplica `json:"replicas"`
}

type consoleReplica struct {
	Address   string   `json:"address"`
	State     string   `json:"state"`
	LagBytes  int64    `json:"lag_bytes"`
	SinceAckS float64  `json:"since_ack_s"`
	PingMs    *float64 `json:"ping_ms"`
	Error     string   `json:"error,omitempty"`
}

func millisOf(d time.Duration) *float64 {
	ms := float64(d) / float64(time.Millisecond)
	return &ms
}

type consoleStoreView struct {
	Kind       string          `json:"kind"`
	Layout     string          `json:"layout"`
	Location   string          `json:"location"`
	Ready      bool            `json:"ready"`
	ReadyError string          `json:"ready_error,omitempty"`
	Masters    []consoleMaster `json:"masters"`
	// TopologyError says why the masters and replicas could not all be read.
	TopologyError string `json:"topology_error,omitempty"`
	// Migration is where a live move into this store stands, when one runs.
	Migration *Migration `json:"migration,omitempty"`
}

// consoleStore is the store view. It says where the store is (the data file's path,
// the Redis addresses) and how it replicates: the platform's business, not a tenant's,
// so it needs the platform scope, or a daemon running open, where whoever reaches it
// runs it.
func (s *Server) consoleStore(c echo.Context) error {
	if err := onlyParams(c); err != nil {
		return err
	}
	if s.auth != nil {
		if err := principalOf(c).Authorize(auth.ScopePlatform); err != nil {
			s.refuseConsole(c, "", err)
			return err
		}
	}
	st := s.console.store
	out := consoleStoreView{Kind: st.Kind, Layout: st.Layout, Location: st.Location, Ready: true, Masters: []consoleMaster{}}
	if st.Migration != nil {
		mig := st.Migration()
		out.Migration = &mig
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := s.engine.Ready(ctx); err != nil {
		out.Ready, out.ReadyError = false, toProblem(err).detail
	}
	if st.AgreedLayout != nil {
		if layout, why, err := st.AgreedLayout(ctx); err == nil {
			out.Layout = fmt.Sprintf("%s (%s: %s)", layout, st.Layout, why)
		}
	}
	if s.console.stats != nil {
		masters, err := s.gatherMasters()
		if err != nil {
			return err
		}
		out.Masters = masters
	}
	if st.Topology != nil {
		nodes, err := st.Topology(ctx)
		if err != nil {
			out.TopologyError = err.Error()
		}
		out.Masters = mergeTopology(out.Masters, nodes, st.Kind != "cluster")
	}
	return s.reply(c, answer{http.StatusOK, "ok", out})
}

// mergeTopology adds each master's PING and replicas to the row of its series, or a
// row of its own. single says the store has one master, whose series may carry
// another name for it (a Sentinel's failover client calls its master FailoverClient).
func mergeTopology(masters []consoleMaster, nodes []StoreNode, single bool) []consoleMaster {
	for _, n := range nodes {
		i := slices.IndexFunc(masters, func(m consoleMaster) bool { return m.Address == n.Address })
		if i < 0 && single && len(nodes) == 1 && len(masters) == 1 {
			i = 0
			masters[0].Address = n.Address
		}
		if i < 0 {
			masters = append(masters, consoleMaster{Address: n.Address})
			i = len(masters) - 1
		}
		m := &masters[i]
		if n.Err != nil {
			m.Error = n.Err.Error()
		} else {
			m.PingMs = millisOf(n.RoundTrip)
		}
		m.Replicas = []consoleReplica{}
		for _, r := range n.Replicas {
			cr := consoleReplica{Address: r.Address, State: r.State, LagBytes: r.LagBytes, SinceAckS: r.SinceAck.Seconds()}
			if r.Err != nil {
				cr.Error = r.Err.Error()
			} else {
				cr.PingMs = millisOf(r.RoundTrip)
			}
			m.Replicas = append(m.Replicas, cr)
		}
	}
	slices.SortFunc(masters, func(a, b consoleMaster) int { return strings.Compare(a.Address, b.Address) })
	return masters
}

// gatherMasters reads the store's per-master series: idemd_redis_round_trip_seconds,
// idemd_redis_pipeline_slots and idemd_redis_queued_calls, labelled by master.
func (s *Server) gatherMasters() ([]consoleMaster, error) {
	families, err := s.console.stats.Gather()
	if err != nil {
		return nil, err
	}
	byAddr := map[string]*consoleMaster{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var addr string
			for _, l := range m.GetLabel() {
				if l.GetName() == "master" {
					addr = l.GetValue()
				}
			}
			if addr == "" || m.GetGauge() == nil {
				continue
			}
			cm := byAddr[addr]
			if cm == nil {
				cm = &consoleMaster{Address: addr}
				byAddr[addr] = cm
			}
			v := m.GetGauge().GetValue()
			switch f.GetName() {
			case "idemd_redis_round_trip_seconds":
				ms := v * 1000
				cm.RoundTripMs = &ms
			case "idemd_redis_pipeline_slots":
				cm.Pipelines = &v
			case "idemd_redis_queued_calls":
				cm.QueuedCalls = &v
			}
		}
	}
	out := make([]consoleMaster, 0, len(byAddr))
	for _, m := range byAddr {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b consoleMaster) int { return strings.Compare(a.Address, b.Address) })
	return out, nil
}
