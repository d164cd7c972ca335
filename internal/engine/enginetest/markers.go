package enginetest

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/testing/wait"
)

// Markers is how a test reaches into a store below engine.Store, to write the markers
// a live move leaves (engine.StateMoving, engine.StateMoved) as that move writes them,
// and to read what the store keeps of a key, byte for byte.
type Markers struct {
	// Put replaces whatever the store holds of id with a marker of phase, kept until
	// expires, in the store's own form of it.
	Put func(t *testing.T, id engine.ID, phase engine.State, expires time.Time)
	// Raw is everything the store keeps of id (its record, in whatever form, and any
	// index entry), as bytes to compare: the same before and after means unchanged.
	Raw func(t *testing.T, id engine.ID) []byte
}

// RunMarkers holds a store to the refusal of markers: on a key whose record is a
// marker of either phase, every transition (a claim of any kind, a claim that waits,
// complete, release either way, extend, mark, lookup, purge, watch, import, export)
// answers engine.ErrStoreMoved, acquires nothing, and leaves what the store keeps of
// the key exactly as it was; a marker never reads as a free key. An expired marker is
// absent, as any expired record is. markers gives the hooks of the store that
// newStore made.
func RunMarkers(t *testing.T, newStore NewStore, markers func(s engine.Store) Markers) {
	s := newStore(t)
	t.Cleanup(func() { _ = s.Close() })
	m := markers(s)
	c := ctx(t)
	tenant := fmt.Sprintf("markers-%d", time.Now().UnixNano())

	for _, phase := range []engine.State{engine.StateMoving, engine.StateMoved} {
		for _, before := range []string{"none", "pending", "completed"} {
			t.Run(fmt.Sprintf("%s over %s", phase, before), func(t *testing.T) {
				id := engine.ID{Tenant: tenant, Key: fmt.Sprintf("%s %s ✓", phase, before)}
				holder := engine.NewLeaseToken()
				secret := engine.HashSecret("the holder's claim secret, long enough")
				switch before {
				case "pending":
					mustAcquire(t, s, claim(id, func(c *engine.Claim) { c.Token, c.Secret = holder, secret }))
				case "completed":
					mustAcquire(t, s, claim(id, func(c *engine.Claim) { c.Token = holder }))
					complete(t, s, id, holder, response("done"))
				}
				m.Put(t, id, phase, time.Now().Add(time.Hour))
				raw := m.Raw(t, id)
				if len(raw) == 0 {
					t.Fatal("Raw reads nothing of the marker Put wrote")
				}

				refused := func(what string, err error) {
					t.Helper()
					if !errors.Is(err, engine.ErrStoreMoved) {
						t.Errorf("%s on a %s marker: %v, want ErrStoreMoved", what, phase, err)
					}
					if got := m.Raw(t, id); !bytes.Equal(got, raw) {
						t.Fatalf("%s on a %s marker changed what the store keeps:\n%q\nwas\n%q", what, phase, got, raw)
					}
				}
				res, err := s.Claim(c, claim(id))
				refused("a new claim", err)
				if res.Outcome != "" {
					t.Errorf("a new claim on a marker answered %q", res.Outcome)
				}
				_, err = s.Claim(c, claim(id, func(c *engine.Claim) { c.Token = holder }))
				refused("the holder's claim resent", err)
				_, err = s.Claim(c, claim(id, func(c *engine.Claim) { c.Secret = secret }))
				refused("a claim with the holder's secret", err)
				_, err = s.Claim(c, claim(id, func(c *engine.Claim) { c.Waiting = true }))
				refused("a claim that waits", err)
				_, err = s.Claim(c, claim(id, func(c *engine.Claim) { c.Fingerprint = "another" }))
				refused("a claim with another fingerprint", err)
				_, err = s.Complete(c, engine.Completion{ID: id, LeaseToken: holder, Response: response("second"), Retention: time.Hour})
				refused("complete", err)
				_, err = s.Release(c, engine.Release{ID: id, LeaseToken: holder, Mode: engine.ReleaseRetry, Retention: time.Hour})
				refused("release for a retry", err)
				_, err = s.Release(c, engine.Release{ID: id, LeaseToken: holder, Mode: engine.ReleaseFail, Retention: time.Hour})
				refused("release as failed", err)
				_, err = s.Extend(c, engine.Extension{ID: id, LeaseToken: holder, Lease: time.Minute})
				refused("extend", err)
				_, err = s.Mark(c, engine.Mark{ID: id, LeaseToken: holder, Name: "charged", Data: []byte("x")})
				refused("mark", err)
				_, err = s.Lookup(c, id)
				refused("lookup", err)
				refused("purge", s.Purge(c, id))
				w, err := s.Watch(c, id)
				if err == nil {
					// A store whose waiters live in the process watches without reading
					// the record; the claim that follows a wake-up refuses.
					w.Close()
					if got := m.Raw(t, id); !bytes.Equal(got, raw) {
						t.Fatalf("watch on a %s marker changed what the store keeps", phase)
					}
				} else {
					refused("watch", err)
				}
				if p, ok := s.(engine.Porter); ok {
					now := time.Now()
					_, err = p.Import(c, engine.Exported{KeyDigest: engine.KeyDigest(id.Key), Entry: engine.Entry{Record: engine.Record{
						ID: id, State: engine.StateCompleted, Attempt: 1, LeaseToken: engine.NewLeaseToken(),
						CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour),
						Response: &engine.Response{Status: 200, Body: []byte("imported")}}}})
					refused("import", err)
					err = p.Export(c, func(e engine.Exported) error {
						if e.ID.Tenant == tenant && e.KeyDigest == engine.KeyDigest(id.Key) {
							return fmt.Errorf("export handed the %s marker over as a %s record", phase, e.State)
						}
						return nil
					})
					refused("export", err)
				}
				// Still refused after all of that.
				_, err = s.Claim(c, claim(id))
				refused("a claim after every other transition", err)

				// The abandoned-keys feed never lists a marker, even one whose pending
				// entry a store left behind, and does not fail on it.
				var listed []string
				q := engine.AbandonedQuery{Tenant: tenant, Before: time.Now().Add(48 * time.Hour), Limit: engine.MaxAbandonedLimit}
				for {
					page, err := s.Abandoned(c, q)
					if err != nil {
						t.Fatalf("the abandoned-keys feed beside a %s marker: %v", phase, err)
					}
					for _, k := range page.Keys {
						listed = append(listed, k.Key)
					}
					if page.Next == "" {
						break
					}
					q.Cursor = page.Next
				}
				for _, k := range listed {
					if k == id.Key {
						t.Fatalf("the abandoned-keys feed lists the %s marker of %q", phase, k)
					}
				}
			})
		}
	}

	t.Run("an expired marker is absent", func(t *testing.T) {
		id := engine.ID{Tenant: tenant, Key: "expired marker"}
		m.Put(t, id, engine.StateMoved, time.Now().Add(300*time.Millisecond))
		if _, err := s.Lookup(c, id); !errors.Is(err, engine.ErrStoreMoved) {
			t.Fatalf("lookup of a live marker: %v", err)
		}
		err := wait.Until(20*time.Second, func() error {
			_, err := s.Claim(c, claim(id))
			if err != nil && !errors.Is(err, engine.ErrStoreMoved) {
				t.Fatalf("a claim on an expiring marker: %v", err)
			}
			return err
		})
		if err != nil {
			t.Fatalf("a claim once the marker expired: %v", err)
		}
	})
}
