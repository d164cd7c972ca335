package server

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/api"
)

// encoded is what json.Encoder writes for v, or nil where it refuses v.
func encoded(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		return nil
	}
	return buf.Bytes()
}

// checkAnswer holds appendAnswer to json.Encoder: the same bytes, or false where
// encoding/json refuses the value or where appendAnswer leaves it to encoding/json.
func checkAnswer(t *testing.T, v any, mustTake bool) {
	t.Helper()
	want := encoded(t, v)
	got, ok := appendAnswer([]byte("prefix"), v)
	switch {
	case ok && want == nil:
		t.Fatalf("appendAnswer takes %+v, which encoding/json refuses", v)
	case ok && !bytes.Equal(got, append([]byte("prefix"), want...)):
		t.Fatalf("appendAnswer of %+v:\n got %s\nwant prefix%s", v, got, want)
	case !ok && mustTake:
		t.Fatalf("appendAnswer leaves %+v to encoding/json", v)
	}
}

func TestAppendAnswer(t *testing.T) {
	now := time.Date(2026, 11, 28, 13, 45, 1, 123456789, time.UTC)
	whole := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	zone := time.Date(2026, 1, 2, 3, 4, 5, 600, time.FixedZone("", -(3*3600+30*60)))
	fp, owner, odd := "load", "go-0123", "<a & b>\u2028\x00\"\\é\xff"
	for _, tc := range []struct {
		name     string
		v        any
		mustTake bool
	}{
		{"acquired", api.ClaimAcquired{Attempt: 1, ExpiresAt: now, LeaseExpiresAt: now, LeaseToken: "0123456789abcdef", Outcome: "acquired"}, true},
		{"acquired recovered", api.ClaimAcquired{Attempt: 7, ExpiresAt: whole, LeaseExpiresAt: zone, LeaseToken: odd, Outcome: "acquired", Recovered: true}, true},
		{"acquired zero times", api.ClaimAcquired{}, true},
		{"acquired with a point", api.ClaimAcquired{RecoveryPoint: &api.RecoveryPoint{Name: "p"}}, false},
		{"record", api.KeyRecord{Attempt: 1, CreatedAt: now, ExpiresAt: now, UpdatedAt: now, Key: "orders/42", State: "completed", Fingerprint: &fp}, true},
		{"record every member", api.KeyRecord{Attempt: -3, CreatedAt: zone, ExpiresAt: whole, UpdatedAt: now, Key: odd, State: odd,
			Fingerprint: &odd, Owner: &owner, LeaseExpiresAt: &now}, true},
		{"record with a response", api.KeyRecord{Response: &api.StoredResponse{Status: 200}}, false},
		{"extended", api.LeaseExtended{ExpiresAt: now, LeaseExpiresAt: zone}, true},
		{"year 10000", api.LeaseExtended{ExpiresAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, false},
		{"year -1", api.KeyRecord{CreatedAt: time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC)}, false},
		{"zone of 24 hours", api.ClaimAcquired{ExpiresAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 24*3600))}, false},
		{"another type", api.Health{Status: "up"}, false},
		{"batch", api.BatchResults{Results: []api.BatchItemResult{
			{Status: 201, Acquired: &api.ClaimAcquired{Attempt: 1, ExpiresAt: now, LeaseExpiresAt: now, LeaseToken: "t", Outcome: "acquired"}},
			{Status: 200, Record: &api.KeyRecord{Attempt: 1, CreatedAt: now, ExpiresAt: now, UpdatedAt: now, Key: odd, State: "completed"}},
			{Status: 200, Extended: &api.LeaseExtended{ExpiresAt: now, LeaseExpiresAt: zone}},
			{Status: 204},
		}}, true},
		{"batch of none", api.BatchResults{Results: []api.BatchItemResult{}}, true},
		{"batch without results", api.BatchResults{}, false},
		{"batch with a replay", api.BatchResults{Results: []api.BatchItemResult{{Status: 200, Finished: &api.ClaimFinished{Outcome: "completed"}}}}, false},
		{"batch with a problem", api.BatchResults{Results: []api.BatchItemResult{{Status: 409, Problem: &api.Problem{Code: "in_progress"}}}}, false},
		{"batch with a bad time", api.BatchResults{Results: []api.BatchItemResult{{Status: 200,
			Extended: &api.LeaseExtended{ExpiresAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) { checkAnswer(t, tc.v, tc.mustTake) })
	}
}

// FuzzAppendAnswer holds appendAnswer to json.Encoder on arbitrary strings, numbers and
// times. go test -run XXX -fuzz FuzzAppendAnswer -fuzztime 2m ./internal/server/
func FuzzAppendAnswer(f *testing.F) {
	f.Add("0123456789abcdef", "orders/42", int64(1), int64(1764337501123456789), int64(0), true)
	f.Add("<&>\u2028\u2029", "\xff\xfe\x00\x1f", int64(-1), int64(-62135596800000000), int64(-86399), false)
	f.Add("", "é鍵\U0001F600", int64(1<<62), int64(253402300800000000), int64(86400), false)
	f.Fuzz(func(t *testing.T, s1, s2 string, n, nanos, offset int64, flag bool) {
		at := time.Unix(0, nanos).In(time.FixedZone("", int(offset%(48*3600))))
		checkAnswer(t, api.ClaimAcquired{Attempt: n, ExpiresAt: at, LeaseExpiresAt: at.Add(time.Duration(n)), LeaseToken: s1,
			Outcome: api.ClaimAcquiredOutcome(s2), Recovered: flag}, false)
		rec := api.KeyRecord{Attempt: n, CreatedAt: at, ExpiresAt: at, UpdatedAt: at.UTC(), Key: s1, State: s2}
		checkAnswer(t, rec, false)
		if flag {
			rec.Fingerprint, rec.Owner, rec.LeaseExpiresAt = &s2, &s1, &at
		}
		checkAnswer(t, rec, false)
		checkAnswer(t, api.LeaseExtended{ExpiresAt: at, LeaseExpiresAt: at.Local()}, false)
		checkAnswer(t, api.BatchResults{Results: []api.BatchItemResult{
			{Status: int(n), Acquired: &api.ClaimAcquired{Attempt: n, ExpiresAt: at, LeaseToken: s1, Outcome: api.ClaimAcquiredOutcome(s2)}},
			{Status: int(offset), Record: &rec, Extended: &api.LeaseExtended{ExpiresAt: at}},
		}}, false)
	})
}
