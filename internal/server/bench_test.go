package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/loadtest/loadgen"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/lua"
)

// BenchmarkHTTPCycles measures claim+complete cycles on fresh keys from 32 concurrent
// clients, in one run and with one load generator, against:
//
//   - idemd: the real server over the Redis store;
//   - idemd-bolt: the real server over the embedded store, every transition synced;
//   - minimal: the least a server of this design can do, an echo handler that decodes
//     the JSON body and runs exactly one EVALSHA of the same script per request;
//   - redis-benchmark: the claim and complete scripts run by redis-benchmark itself with
//     32 connections, reported as cycles (two EVALSHAs each).
//
// Run it with: go test -run XXX -bench HTTPCycles -benchtime 20000x ./internal/server/
func BenchmarkHTTPCycles(b *testing.B) {
	r := testredis.Start(b)
	b.Run("idemd", func(b *testing.B) {
		store, err := redisstore.Open(r.URL())
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		srv := server.New(engine.NewService(store, time.Hour), server.Config{})
		runLoad(b, srv)
	})
	b.Run("idemd-bolt", func(b *testing.B) {
		store, err := boltstore.Open(filepath.Join(b.TempDir(), "idemd.db"), boltstore.Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer store.Close()
		srv := server.New(engine.NewService(store, time.Hour), server.Config{})
		runLoad(b, srv)
	})
	b.Run("minimal", func(b *testing.B) {
		client := redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer client.Close()
		runLoad(b, minimalHandler(b, client))
	})
	b.Run("redis-benchmark", func(b *testing.B) {
		redisBenchmark(b, r)
	})
}

func runLoad(b *testing.B, h http.Handler) {
	hs := httptest.NewServer(h)
	defer hs.Close()
	b.ResetTimer()
	res, err := loadgen.Run(context.Background(), loadgen.Config{
		BaseURL: hs.URL, Clients: 32, Cycles: b.N, KeyPrefix: fmt.Sprintf("bench-%d", time.Now().UnixNano()),
	})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	if res.Errors > 0 {
		b.Fatalf("%d cycles failed", res.Errors)
	}
	b.ReportMetric(res.CyclesPerSecond(), "cycles/s")
	b.ReportMetric(float64(res.ClaimP99.Microseconds())/1000, "claim-p99-ms")
}

// minimalHandler answers claim and complete with one EVALSHA each and no validation,
// metrics or error mapping.
func minimalHandler(b *testing.B, client *redis.Client) http.Handler {
	claimSrc, err := lua.Source("claim", lua.LeanRecords, false)
	if err != nil {
		b.Fatal(err)
	}
	completeSrc, err := lua.Source("complete", lua.LeanRecords, false)
	if err != nil {
		b.Fatal(err)
	}
	claim, complete := redis.NewScript(claimSrc), redis.NewScript(completeSrc)
	e := echo.New()
	e.POST("/v1/claim", func(c echo.Context) error {
		var req struct {
			Key         string `json:"key"`
			Fingerprint string `json:"fingerprint"`
			LeaseMs     int64  `json:"lease_ms"`
		}
		if err := json.NewDecoder(c.Request().Body).Decode(&req); err != nil {
			return err
		}
		token := engine.NewLeaseToken()
		id := engine.ID{Tenant: engine.DefaultTenant, Key: req.Key}
		// The values go as they are in the lean layout's places too: the scripts store
		// and compare them, whatever their form.
		if err := claim.Run(c.Request().Context(), client, []string{redisstore.RecordKey(id), redisstore.LeanKey(id)},
			token, req.Fingerprint, "", req.LeaseMs, 86400000, req.Key, id.Tenant, "", "", token, req.Fingerprint, "").Err(); err != nil {
			return err
		}
		return c.JSON(http.StatusCreated, map[string]string{"outcome": "acquired", "lease_token": token})
	})
	e.POST("/v1/complete", func(c echo.Context) error {
		var req struct {
			Key        string `json:"key"`
			LeaseToken string `json:"lease_token"`
			Response   struct {
				Status  int                 `json:"status"`
				Headers map[string][]string `json:"headers"`
				Body    []byte              `json:"body"`
			} `json:"response"`
		}
		if err := json.NewDecoder(c.Request().Body).Decode(&req); err != nil {
			return err
		}
		headers, _ := json.Marshal(req.Response.Headers)
		id := engine.ID{Tenant: engine.DefaultTenant, Key: req.Key}
		if err := complete.Run(c.Request().Context(), client, []string{redisstore.RecordKey(id), redisstore.LeanKey(id)},
			req.LeaseToken, req.Response.Status, headers, req.Response.Body, 86400000, req.LeaseToken, headers).Err(); err != nil {
			return err
		}
		return c.JSON(http.StatusOK, map[string]string{"state": "completed"})
	})
	return e
}

// rpsLine finds the requests per second in redis-benchmark's CSV row: the first of the
// eight numeric columns that end the row (the command column itself contains quotes).
var rpsLine = regexp.MustCompile(`"([0-9.]+|inf)"(?:,"[0-9.]+"){6}\s*$`)

// redisBenchmark runs the claim script, then the complete script, b.N times each
// through redis-benchmark with 32 connections and random keys. redis-benchmark cannot
// feed a claim's token to a complete, so most of its completes answer not_found after
// a read: the figure is an upper bound for the store's side of a cycle.
func redisBenchmark(b *testing.B, r *testredis.Server) {
	if _, err := exec.LookPath("redis-benchmark"); err != nil {
		b.Skip("redis-benchmark not installed")
	}
	client := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer client.Close()
	var seconds float64
	for _, step := range []struct {
		transition string
		args       []string
	}{
		{"claim", []string{"tok", "load", "", "30000", "86400000", "key", "default", "", "", "tok", "load", ""}},
		{"complete", []string{"tok", "201", `{"Content-Type":["application/json"]}`, `{"order":42}`, "86400000",
			"tok", "\x01application/json"}},
	} {
		src, err := lua.Source(step.transition, lua.LeanRecords, false)
		if err != nil {
			b.Fatal(err)
		}
		sha, err := client.ScriptLoad(context.Background(), src).Result()
		if err != nil {
			b.Fatal(err)
		}
		args := append([]string{"-p", strconv.Itoa(r.Port), "-c", "32", "-n", strconv.Itoa(b.N), "-r", "100000000", "--csv",
			"EVALSHA", sha, "2", "idem:default:__rand_int__", "{lean}default:__rand_int__"}, step.args...)
		out, err := exec.Command("redis-benchmark", args...).CombinedOutput()
		if err != nil {
			b.Fatalf("redis-benchmark: %v\n%s", err, out)
		}
		m := rpsLine.FindSubmatch(bytes.TrimSpace(out))
		if m == nil {
			b.Fatalf("no requests per second in redis-benchmark output:\n%s", out)
		}
		rps, _ := strconv.ParseFloat(string(m[1]), 64)
		seconds += float64(b.N) / rps
	}
	b.ReportMetric(float64(b.N)/seconds, "cycles/s")
}
