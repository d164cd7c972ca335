package idem_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoServerDependencies keeps the client light: importing it, or its generated
// client, must not pull in the daemon's HTTP framework, store drivers or metrics
// library, nor a YAML parser (the contract's YAML is for generating clients, not for a
// service's calls).
func TestNoServerDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages; it should list the standard library too", len(deps))
	}
	for _, dep := range deps {
		for _, banned := range []string{"github.com/labstack/", "github.com/redis/", "go.etcd.io/", "github.com/prometheus/", "github.com/idemd/idemd/internal/", "go.yaml.in/", "gopkg.in/yaml", "sigs.k8s.io/yaml"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the client depends on %s", dep)
			}
		}
	}
}
