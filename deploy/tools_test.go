// Package deploy holds no code: its tests check what a platform team deploys next to
// idemd (the Prometheus rules, the Grafana dashboard and the Helm chart) against a
// real daemon and with the tools those teams run.
package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// requireTools is the variable with which CI turns a missing tool into a failure;
// elsewhere a test that needs one says so and skips.
const requireTools = "IDEMD_REQUIRE_DEPLOY_TOOLS"

// tool finds a command the checks of a deploy artefact run, as its users would.
func tool(t *testing.T, name, install string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	if os.Getenv(requireTools) != "" {
		t.Fatalf("%s is not on the PATH (%s=1): %s", name, requireTools, install)
	}
	t.Skipf("%s is not on the PATH; %s (.ci/run does)", name, install)
	return ""
}

// run runs a tool and returns its standard output, or fails the test with all it
// printed.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\n%s%s", name, args, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}
