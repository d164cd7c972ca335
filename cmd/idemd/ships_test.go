package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestShipsNoHarness holds the layout's promise: what the daemon and idemctl are built
// from never includes a package that starts test servers or drives load.
func TestShipsNoHarness(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/idemd/idemd/cmd/idemd", "github.com/idemd/idemd/cmd/idemctl").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, harness := range []string{"github.com/idemd/idemd/internal/testing/", "github.com/idemd/idemd/internal/loadtest/"} {
			if strings.HasPrefix(pkg, harness) {
				t.Errorf("a binary that ships imports %s", pkg)
			}
		}
	}
}
