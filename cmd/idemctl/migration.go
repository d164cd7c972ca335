package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// migrationView is the part of the console's store view that a live move fills in.
type migrationView struct {
	Migration *struct {
		From       string   `json:"from"`
		HandedOver int64    `json:"handed_over"`
		Left       int64    `json:"left"`
		ByCalls    int64    `json:"by_calls"`
		Failed     int64    `json:"failed"`
		PerSecond  float64  `json:"per_second"`
		ToGoS      float64  `json:"to_go_s"`
		Alone      int      `json:"alone_daemons"`
		Waiting    []string `json:"waiting,omitempty"`
		Done       bool     `json:"done"`
	} `json:"migration"`
}

// migration runs `idemctl migration status`: where the live move of the daemon at
// --url stands, as its console's store view says (platform scope).
func (a *app) migration(args []string) int {
	fs := a.flags("idemctl migration status")
	rest, err := a.parse(fs, args, 1, "status")
	if err != nil {
		return a.usageError(err)
	}
	if rest[0] != "status" {
		return a.usageError(fmt.Errorf("migration %s: the command is migration status", rest[0]))
	}
	transport, err := a.transport()
	if err != nil {
		return a.usageError(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(a.url, "/")+"/console/api/store", nil)
	if err != nil {
		return a.usageError(err)
	}
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := (&http.Client{Transport: transport}).Do(req)
	if err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitUnavailable
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(a.stderr, "idemctl: the store view answered %s (it needs the platform scope and --console)\n", resp.Status)
		return exitRefused
	}
	var v migrationView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		fmt.Fprintln(a.stderr, "idemctl:", err)
		return exitRefused
	}
	if a.json {
		a.printJSON(v.Migration)
		return 0
	}
	m := v.Migration
	if m == nil {
		fmt.Fprintln(a.stderr, "idemctl:", errors.New("this daemon moves no records (it was not started with --migrate-from)"))
		return exitRefused
	}
	if m.Done {
		fmt.Fprintf(a.stdout, "from %s: done, %d copied; the old store holds only markers: retire it once no daemon serves it alone and every daemon runs on the new store alone\n", m.From, m.HandedOver)
		return 0
	}
	fmt.Fprintf(a.stdout, "from %s: %d copied, %d left, %.0f/s, about %s to go (%d handed over by calls, %d failed)\n",
		m.From, m.HandedOver, m.Left, m.PerSecond, (time.Duration(m.ToGoS) * time.Second).Round(time.Second), m.ByCalls, m.Failed)
	if m.Alone > 0 {
		fmt.Fprintf(a.stdout, "not done while %d daemons serve the old store alone or connections to it may be daemons that do not know markers: restart them with --migrate-from, or stop them\n", m.Alone)
	}
	for _, w := range m.Waiting {
		fmt.Fprintf(a.stdout, "waiting for: %s\n", w)
	}
	return 0
}
