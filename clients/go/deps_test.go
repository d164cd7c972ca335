package idem_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoServerDependencies keeps the client light: importing it must not pull in
// the daemon's HTTP framework, store drivers or metrics library.
func TestNoServerDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages; it should list the standard library too", len(deps))
	}
	for _, dep := range deps {
		for _, banned := range []string{"github.com/labstack/", "github.com/redis/", "go.etcd.io/", "github.com/prometheus/", "github.com/idemd/idemd/internal/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the client depends on %s", dep)
			}
		}
	}
}
