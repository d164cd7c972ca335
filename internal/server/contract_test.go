package server_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	contract "github.com/idemd/idemd/api"
	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/server"
)

// TestServesItsContract: a team can generate a client from the running daemon, with
// no token even when the daemon requires one.
func TestServesItsContract(t *testing.T) {
	t.Parallel()
	d := newAuthDaemon(t)
	resp, err := http.Get(d.url + "/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/yaml" || !bytes.Equal(body, onDisk) || !bytes.Equal(body, contract.OpenAPI) {
		t.Fatalf("GET /openapi.yaml: %d %q, %d bytes; want 200 application/yaml and the %d bytes of api/openapi.yaml",
			resp.StatusCode, resp.Header.Get("Content-Type"), len(body), len(onDisk))
	}
}

// TestContractLimitsAreTheEngines holds the contract's limits to the constants the
// daemon enforces, so that the two cannot drift apart. The contract's maxLength counts
// bytes, as its descriptions say.
func TestContractLimitsAreTheEngines(t *testing.T) {
	t.Parallel()
	var spec struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					MinLength *int64 `yaml:"minLength"`
					MaxLength *int64 `yaml:"maxLength"`
					MinItems  *int64 `yaml:"minItems"`
					MaxItems  *int64 `yaml:"maxItems"`
					Minimum   *int64 `yaml:"minimum"`
					Maximum   *int64 `yaml:"maximum"`
					Default   any    `yaml:"default"`
				} `yaml:"properties"`
			} `yaml:"schemas"`
		} `yaml:"components"`
	}
	if err := yaml.Unmarshal(contract.OpenAPI, &spec); err != nil {
		t.Fatal(err)
	}
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	want := []struct {
		schema, property, limit string
		value                   int64
	}{
		{"ClaimRequest", "key", "minLength", 1},
		{"ClaimRequest", "key", "maxLength", engine.MaxKeyBytes},
		{"ClaimRequest", "fingerprint", "maxLength", engine.MaxFingerprintBytes},
		{"ClaimRequest", "owner", "maxLength", engine.MaxOwnerBytes},
		{"ClaimRequest", "claim_secret", "minLength", engine.MinSecretBytes},
		{"ClaimRequest", "claim_secret", "maxLength", engine.MaxSecretBytes},
		{"ClaimRequest", "lease_ms", "minimum", ms(engine.MinLease)},
		{"ClaimRequest", "lease_ms", "maximum", ms(engine.MaxLease)},
		{"ClaimRequest", "wait_ms", "minimum", 0},
		{"ClaimRequest", "wait_ms", "maximum", ms(engine.MaxWait)},
		{"ExtendRequest", "lease_ms", "minimum", ms(engine.MinLease)},
		{"ExtendRequest", "lease_ms", "maximum", ms(engine.MaxLease)},
		{"CompleteRequest", "retention_ms", "minimum", ms(engine.MinRetention)},
		{"CompleteRequest", "retention_ms", "maximum", ms(engine.MaxRetention)},
		{"ReleaseRequest", "retention_ms", "minimum", ms(engine.MinRetention)},
		{"ReleaseRequest", "retention_ms", "maximum", ms(engine.MaxRetention)},
		{"BatchRequest", "items", "minItems", 1},
		{"BatchRequest", "items", "maxItems", server.MaxBatchItems},
	}
	for _, sc := range []string{"CompleteRequest", "ReleaseRequest", "ExtendRequest"} {
		want = append(want,
			struct {
				schema, property, limit string
				value                   int64
			}{sc, "key", "maxLength", engine.MaxKeyBytes},
			struct {
				schema, property, limit string
				value                   int64
			}{sc, "lease_token", "maxLength", engine.MaxLeaseTokenBytes})
	}
	for _, w := range want {
		p, ok := spec.Components.Schemas[w.schema].Properties[w.property]
		if !ok {
			t.Errorf("%s.%s is not in the contract", w.schema, w.property)
			continue
		}
		got := map[string]*int64{"minLength": p.MinLength, "maxLength": p.MaxLength, "minItems": p.MinItems, "maxItems": p.MaxItems,
			"minimum": p.Minimum, "maximum": p.Maximum}[w.limit]
		if got == nil || *got != w.value {
			t.Errorf("%s.%s %s is %s, the daemon enforces %d", w.schema, w.property, w.limit, show(got), w.value)
		}
	}
	// Generators make members with a default required (or fill them in), so request
	// defaults live in descriptions and the daemon applies them.
	for name, s := range spec.Components.Schemas {
		for prop, p := range s.Properties {
			if p.Default != nil {
				t.Errorf("%s.%s has a default in the contract; state it in its description", name, prop)
			}
		}
	}
}

func show(v *int64) string {
	if v == nil {
		return "absent"
	}
	return fmt.Sprint(*v)
}
