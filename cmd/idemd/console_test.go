package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

func get(t *testing.T, url string) (int, http.Header, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, body
}

// TestConsoleFlag: the console is off unless --console (or IDEMD_CONSOLE) turns it on,
// and its store view shows the store the daemon opened.
func TestConsoleFlag(t *testing.T) {
	t.Run("off by default", func(t *testing.T) {
		m, _, _ := startMain(t, "--data-dir", t.TempDir())
		if status, _, _ := get(t, "http://"+m.Addr()+"/console/"); status != http.StatusNotFound {
			t.Errorf("/console/ without --console: %d", status)
		}
	})
	t.Run("on from the environment", func(t *testing.T) {
		lookupEnv = func(k string) (string, bool) {
			if k == "IDEMD_CONSOLE" {
				return "true", true
			}
			return "", false
		}
		t.Cleanup(func() { lookupEnv = os.LookupEnv })
		dir := t.TempDir()
		m, _, _ := startMain(t, "--data-dir", dir)
		status, header, _ := get(t, "http://"+m.Addr()+"/console/")
		if status != http.StatusOK || header.Get("Content-Security-Policy") == "" {
			t.Fatalf("/console/ with IDEMD_CONSOLE: %d, CSP %q", status, header.Get("Content-Security-Policy"))
		}
		status, _, body := get(t, "http://"+m.Addr()+"/console/api/store")
		var store map[string]any
		if err := json.Unmarshal(body, &store); err != nil || status != http.StatusOK {
			t.Fatalf("store view: %d %s", status, body)
		}
		want, _ := filepath.Abs(filepath.Join(dir, "idemd.db"))
		if store["kind"] != "embedded" || store["layout"] != "bbolt" || store["location"] != want || store["ready"] != true {
			t.Errorf("store view: %s", body)
		}
	})
}

func TestStoreKind(t *testing.T) {
	for url, want := range map[string]string{
		"bolt:///var/lib/idemd/idemd.db":               "embedded",
		"redis://127.0.0.1:6379/0":                     "redis",
		"rediss://cache:6380":                          "redis",
		"redis+sentinel://s1:26379,s2:26379/idemd":     "sentinel",
		"rediss+sentinel://s1:26379/idemd":             "sentinel",
		"redis+cluster://n1:7000,n2:7000":              "cluster",
		"redis+cluster://u:p@n1:7000,n2:7000?tls=true": "cluster",
	} {
		if got := storeKind(url); got != want {
			t.Errorf("storeKind(%q) = %s, want %s", url, got, want)
		}
	}
}

// TestConsoleShowsTheAgreedLayout: over Redis, told no layout, the console's store view
// shows the layout the daemons agreed on, and why, beside what the flag said.
func TestConsoleShowsTheAgreedLayout(t *testing.T) {
	r := testredis.Start(t)
	m, _, _ := startMain(t, "--store", r.URL(), "--console")
	status, _, body := get(t, "http://"+m.Addr()+"/console/api/store")
	var store map[string]any
	if err := json.Unmarshal(body, &store); err != nil || status != http.StatusOK {
		t.Fatalf("store view: %d %s", status, body)
	}
	layout, _ := store["layout"].(string)
	if store["kind"] != "redis" || !strings.HasPrefix(layout, "lean-only (auto: ") {
		t.Errorf("store view of an empty Redis, told no layout: %s", body)
	}
}

// TestConsoleShowsReplicas: over Sentinel, the store view names the master the
// Sentinels chose, by its own address, with its PING, and its replica with the state of
// its link, its lag and its PING.
func TestConsoleShowsReplicas(t *testing.T) {
	sen := testredis.StartSentinel(t)
	m, _, _ := startMain(t, "--store", sen.URL(), "--console")
	var view struct {
		Kind    string
		Masters []struct {
			Address  string
			PingMs   *float64 `json:"ping_ms"`
			Replicas []struct {
				Address  string
				State    string
				LagBytes *int64   `json:"lag_bytes"`
				PingMs   *float64 `json:"ping_ms"`
			}
		}
	}
	var body []byte
	wait.For(t, 20*time.Second, "the replica shown online", func() bool {
		var status int
		status, _, body = get(t, "http://"+m.Addr()+"/console/api/store")
		if err := json.Unmarshal(body, &view); err != nil || status != http.StatusOK {
			t.Fatalf("store view: %d %s", status, body)
		}
		return len(view.Masters) == 1 && len(view.Masters[0].Replicas) == 1 && view.Masters[0].Replicas[0].State == "online"
	})
	master := view.Masters[0]
	replica := master.Replicas[0]
	if view.Kind != "sentinel" || master.Address != sen.Master.Addr() || master.PingMs == nil || *master.PingMs <= 0 {
		t.Errorf("master: %s, want %s with its PING", body, sen.Master.Addr())
	}
	if replica.Address != sen.Replica.Addr() || replica.LagBytes == nil || replica.PingMs == nil || *replica.PingMs <= 0 {
		t.Errorf("replica: %s, want %s with its lag and PING", body, sen.Replica.Addr())
	}
}
