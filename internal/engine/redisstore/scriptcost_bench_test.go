package redisstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// BenchmarkScriptCost measures what the scripts cost inside Redis: the microseconds
// Redis spends in each EVALSHA (INFO commandstats, usec_per_call, commands called from
// the script included) for the transitions of a request's usual cycle, a claim on a
// fresh key and its complete, and for a claim replayed from a completed record and a
// lookup, in each layout a daemon writes. Each call runs alone, so pipelines do not
// count; a script that does nothing (return 1) gives the cost of EVALSHA itself.
//
//	go test -run XXX -bench ScriptCost -benchtime 20000x ./internal/engine/redisstore/
func BenchmarkScriptCost(b *testing.B) {
	ctx := context.Background()
	// Each layout has a Redis of its own: a layout key only moves forward.
	start := func(b *testing.B) (*testredis.Server, *redis.Client) {
		srv := testredis.Start(b)
		admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
		b.Cleanup(func() { _ = admin.Close() })
		return srv, admin
	}
	// evalsha is the calls and microseconds of EVALSHA since the last reset.
	evalsha := func(b *testing.B, admin *redis.Client) (calls, usec float64) {
		info, err := admin.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		for line := range strings.Lines(info) {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
			if !ok {
				continue
			}
			for _, f := range strings.Split(rest, ",") {
				name, v, _ := strings.Cut(f, "=")
				switch name {
				case "calls":
					calls, _ = strconv.ParseFloat(v, 64)
				case "usec":
					usec, _ = strconv.ParseFloat(v, 64)
				}
			}
		}
		return calls, usec
	}
	// measure runs each of b.N calls of step, and reports Redis's microseconds a
	// script call as metric.
	measure := func(b *testing.B, admin *redis.Client, metric string, step func(i int)) {
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		for i := range b.N {
			step(i)
		}
		calls, usec := evalsha(b, admin)
		if calls == 0 {
			b.Fatal("no EVALSHA counted")
		}
		b.ReportMetric(usec/calls, metric)
	}
	b.Run("empty", func(b *testing.B) {
		_, admin := start(b)
		nothing := redis.NewScript("return 1")
		if err := nothing.Load(ctx, admin).Err(); err != nil {
			b.Fatal(err)
		}
		measure(b, admin, "µs/call", func(int) {
			if err := nothing.EvalSha(ctx, admin, []string{"k"}).Err(); err != nil {
				b.Fatal(err)
			}
		})
	})
	layouts := []redisstore.Layout{redisstore.LayoutLeanOnly, redisstore.LayoutLean, redisstore.LayoutStrings, redisstore.LayoutHashes}
	for _, layout := range layouts {
		b.Run(string(layout), func(b *testing.B) {
			srv, admin := start(b)
			s, err := redisstore.OpenWith(srv.URL(), redisstore.Options{Layout: layout, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			if a, err := s.AgreeLayout(ctx); err != nil || a.Layout != layout {
				b.Fatalf("layout %v, %v; want %s", a.Layout, err, layout)
			}
			tenant := fmt.Sprintf("cost-%s-%d", layout, time.Now().UnixNano())
			id := func(i int) engine.ID { return engine.ID{Tenant: tenant, Key: "order-" + strconv.Itoa(i)} }
			tokens := make([]string, b.N)
			claim := func(i int) engine.ClaimResult {
				res, err := s.Claim(ctx, engine.Claim{ID: id(i), Fingerprint: "sha256:" + strings.Repeat("ab", 32),
					Lease: time.Minute, Retention: time.Hour, Token: tokens[i]})
				if err != nil {
					b.Fatal(err)
				}
				return res
			}
			for i := range tokens {
				tokens[i] = engine.NewLeaseToken()
			}
			measure(b, admin, "µs/claim", func(i int) {
				if res := claim(i); res.Outcome != engine.OutcomeAcquired {
					b.Fatalf("claim: %v", res.Outcome)
				}
			})
			measure(b, admin, "µs/complete", func(i int) {
				_, err := s.Complete(ctx, engine.Completion{ID: id(i), LeaseToken: tokens[i], Retention: time.Hour,
					Response: engine.Response{Status: 201, Headers: map[string][]string{"Content-Type": {"application/json"}},
						Body: []byte(`{"id":"` + strconv.Itoa(i) + `","status":"accepted"}`)}})
				if err != nil {
					b.Fatal(err)
				}
			})
			measure(b, admin, "µs/replay", func(i int) {
				if res := claim(i); res.Outcome != engine.OutcomeCompleted {
					b.Fatalf("replayed claim: %v", res.Outcome)
				}
			})
			measure(b, admin, "µs/lookup", func(i int) {
				if _, err := s.Lookup(ctx, id(i)); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}
