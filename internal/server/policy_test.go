package server_test

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/auth"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/boltstore"
	"github.com/idemd/idemd/internal/server"
)

// TestTenantCapsUseTheEnginesRetention: a tenant's retention cap clamps the default
// retention the engine actually applies. The HTTP layer used to keep a second copy of
// the default (24 hours unless told otherwise) and clamp that one, so a daemon whose
// engine kept results for one hour kept a capped tenant's results for the cap.
func TestTenantCapsUseTheEnginesRetention(t *testing.T) {
	store, err := boltstore.Open(filepath.Join(t.TempDir(), "idemd.db"), boltstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	cfg, err := auth.Parse([]byte("tenants: {capped: {max_retention: 2h}}\ntokens:\n  - {tenant: capped, scopes: [use], sha256: " + tokenHash("capped-use") + "}\n"))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(server.New(engine.NewService(store, time.Hour, engine.WithStoreTimeout(time.Minute)), server.Config{Auth: cfg}))
	t.Cleanup(hs.Close)
	d := &authDaemon{t: t, url: hs.URL}

	claim := d.call("capped-use", http.MethodPost, "/v1/claim", map[string]any{"key": "k"})
	expectStatus(t, "claim", claim, http.StatusCreated, "")
	done := d.call("capped-use", http.MethodPost, "/v1/complete", map[string]any{"key": "k",
		"lease_token": claim.str("lease_token"), "response": map[string]any{"status": 204}})
	expectStatus(t, "complete", done, http.StatusOK, "")
	for what, a := range map[string]authAnswer{"claim": claim, "completion": done} {
		exp, err := time.Parse(time.RFC3339Nano, a.str("expires_at"))
		if err != nil {
			t.Fatalf("%s: expires_at: %v in %s", what, err, a.raw)
		}
		if until := time.Until(exp); until > time.Hour+time.Minute || until < time.Hour-time.Minute {
			t.Errorf("%s: the record expires in %s, want the engine's hour, within the tenant's 2h cap", what, until)
		}
	}
}
