package main

import (
	"bufio"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// previousRelease builds the daemon of tag from this repository's history, or skips
// the test, saying why, when git, the repository or the tag is missing.
func previousRelease(t *testing.T, tag string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git to build the previous release with")
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git repository: %v", err)
	}
	repo := strings.TrimSpace(string(root))
	if err := exec.Command("git", "-C", repo, "rev-parse", "--verify", "--quiet", tag+"^{commit}").Run(); err != nil {
		t.Skipf("no tag %s in %s", tag, repo)
	}
	src := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("git", "-C", repo, "worktree", "add", "--detach", src, tag).CombinedOutput(); err != nil {
		t.Skipf("git worktree add %s: %v\n%s", tag, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("git", "-C", repo, "worktree", "remove", "--force", src).Run() })
	bin := filepath.Join(t.TempDir(), "idemd-"+tag)
	build := exec.Command("go", "build", "-o", bin, "./cmd/idemd")
	build.Dir = src
	// The release is built as its own module, with the versions its go.mod pins.
	build.Env = append(os.Environ(), "GOWORK=off")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build of %s: %v\n%s", tag, err, out)
	}
	return bin
}

// TestMoveWaitsForDaemonsThatMayNotKnowMarkers: a migrating daemon writes no marker
// into the old store, and is not done, while a daemon of the previous release (which
// writes no heartbeat) serves it, nor while a connection that names no daemon is open
// there; it says what it waits for; and it is done once both are gone.
func TestMoveWaitsForDaemonsThatMayNotKnowMarkers(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two releases, starts Redis servers and daemons")
	}
	t.Parallel()
	old := previousRelease(t, "v0.4.0")
	bin := buildDaemon(t)
	from, to := testredis.Start(t), testredis.Start(t)

	previous := startWith(t, old, "--store", from.URL())
	if code, out := previous.call(t, "/v1/claim", map[string]any{"key": "before"}); code != 201 {
		t.Fatalf("a claim on the previous release: %d %v", code, out)
	}
	// A connection that names nothing, as a daemon of a release before names were.
	conn, err := net.Dial("tcp", from.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING on the unnamed connection: %q %v", line, err)
	}

	migrating := startWith(t, bin, "--store", to.URL(), "--migrate-from", from.URL(), "--console")
	waiting := func() []string {
		var view struct {
			Migration *struct {
				Waiting []string `json:"waiting"`
				Done    bool     `json:"done"`
			} `json:"migration"`
		}
		resp, err := http.Get(migrating.base + "/console/api/store")
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		if json.NewDecoder(resp.Body).Decode(&view) != nil || view.Migration == nil {
			return nil
		}
		return view.Migration.Waiting
	}
	wait.For(t, 60*time.Second, "the copier to say it waits for connections that may not know markers", func() bool {
		w := waiting()
		return len(w) >= 2 && strings.Contains(strings.Join(w, "\n"), "may not know markers")
	})
	// No marker: a key claimed through the migrating daemon is held in the old store,
	// where the previous release sees it held, not moved.
	if code, out := migrating.call(t, "/v1/claim", map[string]any{"key": "during"}); code != 201 {
		t.Fatalf("a claim on the migrating daemon while the previous release serves: %d %v", code, out)
	}
	if code, out := previous.call(t, "/v1/claim", map[string]any{"key": "during"}); code != 409 {
		t.Fatalf("the previous release on a key the migrating daemon holds: %d %v, want 409 (held, no marker)", code, out)
	}
	if code, out := previous.call(t, "/v1/claim", map[string]any{"key": "before"}); code != 409 {
		t.Fatalf("the previous release on its own held key: %d %v, want 409 (held, no marker)", code, out)
	}
	if migrating.metric(t, "idemd_migration_done") == "1" {
		t.Fatal("done while a daemon of the previous release serves the old store")
	}

	previous.kill(t)
	// Still not done: the unnamed connection may be a daemon that does not know markers.
	wait.For(t, 60*time.Second, "the copier to wait for the unnamed connection alone", func() bool {
		w := waiting()
		return len(w) == 1 && strings.Contains(w[0], "no name")
	})
	if migrating.metric(t, "idemd_migration_done") == "1" {
		t.Fatal("done while an unnamed connection is open to the old store")
	}
	_ = conn.Close()
	wait.For(t, 120*time.Second, "the copier to finish once only daemons that know markers are left", func() bool {
		return migrating.metric(t, "idemd_migration_done") == "1"
	})
	// The keys held before and during the wait were handed over with their leases.
	for _, key := range []string{"before", "during"} {
		if code, out := migrating.call(t, "/v1/claim", map[string]any{"key": key}); code != 409 {
			t.Fatalf("%s after the move: %d %v, want 409 (still held)", key, code, out)
		}
	}
}
