// Package appbench measures what idempotency costs a Go service: one net/http handler
// served bare, behind a middleware that talks to Redis directly, and behind
// idem.Middleware talking to idemd (over Redis, and over the embedded store). Every part
// is its own process on loopback, so that the CPU each spends per request can be read
// from /proc: the app, idemd, redis-server and the load generator.
package appbench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	idem "github.com/idemd/idemd/clients/go"
)

// The app's modes, one per configuration of the benchmark.
const (
	ModeBare   = "bare"   // no middleware
	ModeDirect = "direct" // the direct-Redis middleware below
	ModeIdemd  = "idemd"  // idem.Middleware in front of an idemd
)

// AppConfig is one app process.
type AppConfig struct {
	Mode     string
	Listen   string
	RedisURL string // ModeDirect
	IdemdURL string // ModeIdemd
	// SDKOptions are added to the idem client's options (ModeIdemd), to measure the
	// SDK's settings one by one.
	SDKOptions []idem.Option
}

// ServeApp serves the benchmark's handler in the given mode until ctx ends. Besides
// POST /orders it answers GET /executions with how many times the handler ran, so that
// the load generator can check that no replay ran it.
func ServeApp(ctx context.Context, cfg AppConfig) error {
	var executions atomic.Int64
	orders := ordersHandler(&executions)
	var h http.Handler
	switch cfg.Mode {
	case ModeBare:
		h = orders
	case ModeDirect:
		opts, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return err
		}
		client := redis.NewClient(opts)
		defer client.Close()
		h = DirectMiddleware(client, 30*time.Second, 24*time.Hour)(orders)
	case ModeIdemd:
		client, err := idem.New(cfg.IdemdURL, cfg.SDKOptions...)
		if err != nil {
			return err
		}
		h = idem.Middleware(client, idem.WithScope(user))(orders)
	default:
		return fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", h)
	mux.HandleFunc("GET /executions", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, executions.Load())
	})
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// user is the scope of both middlewares: the user the request says it is (a real
// service takes it from its authentication).
func user(r *http.Request) string { return r.Header.Get("X-User") }

// ordersHandler is the service's own work, the same in every configuration: decode a
// small JSON order, answer 201 with its ID.
func ordersHandler(executions *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Amount int64 `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := executions.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/"+strconv.FormatInt(id, 10))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"amount":%d}`, id, in.Amount)
	})
}

// storeIfHeld writes the completed record only while the claim is still the one this
// request made: a request whose claim ran out and was taken over must not overwrite
// the new holder's work. The same check guards the release of a failed request.
var storeIfHeld = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1`)

// DirectMiddleware is the idempotency middleware a service writes when it talks to
// Redis itself, done right: a claim is SET NX with a lease, carrying a random token and
// the request's fingerprint; a duplicate GETs the value and replays a completed answer,
// refuses a different request with 422 and a running one with 409; the answer is stored
// with SET only while the claim is still this request's (storeIfHeld), and a 5xx frees
// the key. Keys are kept per user, with the same fingerprint and key derivation as
// idem.Middleware. It is the yardstick of the
// benchmark, not a product: no lease renewal, no waiting, no tenants.
func DirectMiddleware(client *redis.Client, lease, retention time.Duration) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get(idem.HeaderIdempotencyKey)
			if key == "" || user(r) == "" {
				next.ServeHTTP(w, r)
				return
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 10<<20))
			if err != nil {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			fp := idem.Fingerprint(r, body)
			rkey := "direct:" + idem.MiddlewareKey(user(r), key)
			var tok [16]byte
			_, _ = rand.Read(tok[:])
			claim := "p|" + fp + "|" + hex.EncodeToString(tok[:])
			ctx := r.Context()

			ok, err := client.SetNX(ctx, rkey, claim, lease).Result()
			if err != nil {
				http.Error(w, "idempotency store unavailable", http.StatusServiceUnavailable)
				return
			}
			if !ok {
				directDuplicate(ctx, w, client, rkey, fp)
				return
			}
			rec := &directRecorder{ResponseWriter: w}
			next.ServeHTTP(rec, r)
			if rec.status == 0 {
				rec.WriteHeader(http.StatusOK)
			}
			stored := ""
			if rec.status < 500 {
				b, _ := json.Marshal(directStored{Status: rec.status, Header: rec.kept, Body: rec.body.Bytes()})
				stored = "c|" + fp + "|" + string(b)
			}
			// Stored after the answer went out, as a middleware must (the handler wrote
			// it); a failure leaves the claim to run out, so a retry runs again.
			_ = storeIfHeld.Run(context.WithoutCancel(ctx), client, []string{rkey}, claim, stored, retention.Milliseconds()).Err()
		})
	}
}

type directStored struct {
	Status int         `json:"s"`
	Header http.Header `json:"h,omitempty"`
	Body   []byte      `json:"b"`
}

func directDuplicate(ctx context.Context, w http.ResponseWriter, client *redis.Client, rkey, fp string) {
	v, err := client.Get(ctx, rkey).Result()
	switch {
	case errors.Is(err, redis.Nil):
		// The holder failed and freed the key a moment ago: the client retries.
		w.Header().Set("Retry-After", "1")
		http.Error(w, "retry", http.StatusConflict)
		return
	case err != nil:
		http.Error(w, "idempotency store unavailable", http.StatusServiceUnavailable)
		return
	}
	state, rest, _ := strings.Cut(v, "|")
	storedFP, rest, _ := strings.Cut(rest, "|")
	if storedFP != fp {
		http.Error(w, "Idempotency-Key reused with another request", http.StatusUnprocessableEntity)
		return
	}
	if state != "c" {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "in progress", http.StatusConflict)
		return
	}
	var s directStored
	if err := json.Unmarshal([]byte(rest), &s); err != nil {
		http.Error(w, "stored answer unreadable", http.StatusInternalServerError)
		return
	}
	for k, vs := range s.Header {
		w.Header()[k] = vs
	}
	w.Header().Set(idem.HeaderReplayed, "true")
	w.WriteHeader(s.Status)
	_, _ = w.Write(s.Body)
}

// directRecorder passes the answer through and keeps what is stored: the status, the
// Content-Type and Location headers, and the body.
type directRecorder struct {
	http.ResponseWriter
	status int
	kept   http.Header
	body   bytes.Buffer
}

func (rec *directRecorder) WriteHeader(status int) {
	if rec.status != 0 {
		return
	}
	rec.status = status
	rec.kept = http.Header{}
	for _, k := range []string{"Content-Type", "Location"} {
		if vs := rec.Header().Values(k); len(vs) > 0 {
			rec.kept[k] = slices.Clone(vs)
		}
	}
	rec.ResponseWriter.WriteHeader(status)
}

func (rec *directRecorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.WriteHeader(http.StatusOK)
	}
	rec.body.Write(b)
	return rec.ResponseWriter.Write(b)
}
