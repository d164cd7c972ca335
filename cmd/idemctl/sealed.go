package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/idemapi"
)

// sealFlags are lookup's flags for opening sealed results (docs/sealing.md).
type sealFlags struct {
	keysFile string
	tenant   string
}

func (a *app) sealFlags(fs *flag.FlagSet) *sealFlags {
	s := &sealFlags{tenant: a.getenv("IDEMD_SEAL_TENANT")}
	if s.tenant == "" {
		s.tenant = "default"
	}
	fs.StringVar(&s.keysFile, "seal-keys", "", "a key ring file that opens sealed results (default $IDEMD_SEAL_KEYS, the ring itself)")
	fs.StringVar(&s.tenant, "seal-tenant", s.tenant, "the tenant name the results were sealed under (default $IDEMD_SEAL_TENANT, else default)")
	return s
}

// options gives the client the ring, when --seal-keys or $IDEMD_SEAL_KEYS names one.
func (s *sealFlags) options(getenv func(string) string) ([]idem.Option, error) {
	text := getenv("IDEMD_SEAL_KEYS")
	if s.keysFile != "" {
		b, err := os.ReadFile(s.keysFile)
		if err != nil {
			return nil, fmt.Errorf("--seal-keys: %w", err)
		}
		text = string(b)
	}
	if strings.TrimSpace(text) == "" {
		return nil, nil
	}
	ring, err := idem.ParseKeyRing(text)
	if err != nil {
		return nil, fmt.Errorf("the key ring: %w", err)
	}
	return []idem.Option{idem.WithSealing(s.tenant, ring)}, nil
}

// rawRecord is the record as idemd answers it, sealed parts as they are: what lookup
// shows of what the client could not open.
func (a *app) rawRecord(ctx context.Context, key string) (*idemapi.KeyRecord, error) {
	transport, err := a.transport()
	if err != nil {
		return nil, err
	}
	api, err := idemapi.NewClient(strings.TrimSuffix(a.url, "/"), idemapi.WithHTTPClient(&http.Client{Transport: transport, Timeout: a.timeout}))
	if err != nil {
		return nil, err
	}
	resp, err := api.Lookup(ctx, key, func(_ context.Context, req *http.Request) error {
		if a.token != "" {
			req.Header.Set("Authorization", "Bearer "+a.token)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("lookup answered %s", resp.Status)
	}
	var rec idemapi.KeyRecord
	if err := json.NewDecoder(resp.Body).Decode(&rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// looksSealed says whether b begins as an envelope does: its marker, version 1 or 2,
// and a key id of 1 to 32 bytes, followed by at least the salt, nonce and tag.
func looksSealed(b []byte) bool {
	return len(b) > 3 && b[0] == 0xC1 && (b[1] == 1 || b[1] == 2) && b[2] >= 1 && b[2] <= 32 && len(b) >= 3+int(b[2])+16+12+16
}

// describeSealed says what an envelope's head tells: the key that opens it, and its size.
func describeSealed(env []byte) string {
	if looksSealed(env) {
		return fmt.Sprintf("sealed with key %q (envelope version %d, %d bytes)", env[3:3+int(env[2])], env[1], len(env))
	}
	return fmt.Sprintf("sealed (%d bytes)", len(env))
}

// sealedParts fills in what the client did not open, from the record as idemd keeps it.
type sealedParts struct {
	status   int
	response []byte // the result's envelope, when it was not opened
	point    *idemapi.RecoveryPoint
}

func (a *app) sealedParts(ctx context.Context, rec *idem.Record) (sealedParts, error) {
	var p sealedParts
	raw, err := a.rawRecord(ctx, rec.Key)
	if err != nil {
		return p, err
	}
	if rec.Response == nil && raw.Response != nil && raw.Response.Sealed != nil {
		p.status, p.response = raw.Response.Status, *raw.Response.Sealed
	}
	if rec.RecoveryPoint == nil {
		p.point = raw.RecoveryPoint
	}
	return p, nil
}
