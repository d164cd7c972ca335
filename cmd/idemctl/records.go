package main

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	idem "github.com/idemd/idemd/clients/go"
)

// responseJSON is a stored response as the API writes it: the body in base64.
type responseJSON struct {
	Status  int                 `json:"status"`
	Headers map[string][]string `json:"headers,omitempty"`
	Body    []byte              `json:"body,omitempty"`
	// Sealed is the envelope of a result lookup could not open.
	Sealed []byte `json:"sealed,omitempty"`
}

func responseOut(r *idem.Response) *responseJSON {
	if r == nil {
		return nil
	}
	return &responseJSON{Status: r.Status, Headers: r.Header, Body: r.Body}
}

// recordJSON is a record as the API's lookup writes it.
type recordJSON struct {
	Key            string        `json:"key"`
	State          string        `json:"state"`
	Attempt        int64         `json:"attempt"`
	Fingerprint    string        `json:"fingerprint,omitempty"`
	Owner          string        `json:"owner,omitempty"`
	CreatedAt      time.Time     `json:"created_at"`
	UpdatedAt      time.Time     `json:"updated_at"`
	LeaseExpiresAt *time.Time    `json:"lease_expires_at,omitempty"`
	ExpiresAt      time.Time     `json:"expires_at"`
	Response       *responseJSON `json:"response,omitempty"`
	RecoveryPoint  *pointJSON    `json:"recovery_point,omitempty"`
	// SealError says why a sealed part did not open with the key ring given.
	SealError string `json:"seal_error,omitempty"`
}

// pointJSON is a recovery point as the API writes it: the data in base64.
type pointJSON struct {
	Name       string    `json:"name"`
	Data       []byte    `json:"data,omitempty"`
	Attempt    int64     `json:"attempt"`
	RecordedAt time.Time `json:"recorded_at"`
}

func pointOut(p *idem.RecoveryPoint) *pointJSON {
	if p == nil {
		return nil
	}
	return &pointJSON{Name: p.Name, Data: p.Data, Attempt: p.Attempt, RecordedAt: p.RecordedAt}
}

// claimJSON is a claim's answer as the API writes it, with the claim secret it was made
// with: resending the claim with --secret gets a live lease back.
type claimJSON struct {
	Key            string        `json:"key"`
	Outcome        string        `json:"outcome"`
	LeaseToken     string        `json:"lease_token,omitempty"`
	ClaimSecret    string        `json:"claim_secret,omitempty"`
	Attempt        int64         `json:"attempt"`
	LeaseExpiresAt *time.Time    `json:"lease_expires_at,omitempty"`
	ExpiresAt      *time.Time    `json:"expires_at,omitempty"`
	Recovered      bool          `json:"recovered,omitempty"`
	Response       *responseJSON `json:"response,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// table prints aligned "name value" lines.
type table struct{ w *tabwriter.Writer }

func newTable(w io.Writer) table { return table{tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)} }

func (t table) row(name string, value any) { fmt.Fprintf(t.w, "%s\t%v\n", name, value) }

func (t table) time(name string, v time.Time) {
	if !v.IsZero() {
		t.row(name, v.UTC().Format(time.RFC3339Nano))
	}
}

func (t table) response(r *idem.Response) {
	if r == nil {
		return
	}
	t.row("status", r.Status)
	for name, values := range r.Header {
		for _, v := range values {
			t.row("header", name+": "+v)
		}
	}
	t.row("body", showBody(r.Body))
}

func (t table) flush() { _ = t.w.Flush() }

// shownBodyBytes is the largest body lookup's table shows: a larger one (a result
// kept in the blob store may be 64 MiB) is shown by its size and SHA-256, and --json
// carries it whole.
const shownBodyBytes = 4096

// showBody writes a body as text when it is printable UTF-8, else as base64; one over
// shownBodyBytes by its size and SHA-256.
func showBody(b []byte) string {
	if len(b) == 0 {
		return "(empty)"
	}
	if len(b) > shownBodyBytes {
		sum := sha256.Sum256(b)
		return fmt.Sprintf("%d bytes, sha256 %x (over %d bytes: not shown; --json carries it whole)", len(b), sum, shownBodyBytes)
	}
	printable := utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool {
		return !unicode.IsPrint(r) && r != '\n' && r != '\t'
	})
	if printable {
		return fmt.Sprintf("%q (%d bytes)", b, len(b))
	}
	return fmt.Sprintf("base64:%s (%d bytes)", base64.StdEncoding.EncodeToString(b), len(b))
}

// lookup shows a record. A result or recovery point its client sealed is shown as
// sealed, or opened with the key ring of --seal-keys or $IDEMD_SEAL_KEYS; with a ring,
// a part that does not open is an error (exit 1), after the rest is shown.
func (a *app) lookup(args []string) int {
	fs := a.flags("lookup")
	seal := a.sealFlags(fs)
	pos, err := a.parse(fs, args, 1, "one KEY")
	if err != nil {
		return a.usageError(err)
	}
	sealing, err := seal.options(a.getenv)
	if err != nil {
		return a.usageError(err)
	}
	c, err := a.client(nil, sealing...)
	if err != nil {
		return a.usageError(err)
	}
	ctx := context.Background()
	rec, err := c.Lookup(ctx, pos[0])
	var sealErr error
	var parts sealedParts
	if err != nil {
		if rec == nil || !errors.Is(err, idem.ErrUnsealable) {
			return a.fail(err)
		}
		if sealing != nil {
			sealErr = err
		}
		if parts, err = a.sealedParts(ctx, rec); err != nil {
			return a.fail(err)
		}
	}
	exit := exitOK
	if sealErr != nil {
		exit = exitRefused
	}
	if a.json {
		out := recordJSON{Key: rec.Key, State: rec.State, Attempt: rec.Attempt, Fingerprint: rec.Fingerprint,
			Owner: rec.Owner, CreatedAt: rec.CreatedAt, UpdatedAt: rec.UpdatedAt, LeaseExpiresAt: timePtr(rec.LeaseExpiresAt),
			ExpiresAt: rec.ExpiresAt, Response: responseOut(rec.Response), RecoveryPoint: pointOut(rec.RecoveryPoint)}
		if parts.response != nil {
			out.Response = &responseJSON{Status: parts.status, Sealed: parts.response}
		}
		if p := parts.point; p != nil {
			out.RecoveryPoint = &pointJSON{Name: p.Name, Attempt: p.Attempt, RecordedAt: p.RecordedAt}
			if p.Data != nil {
				out.RecoveryPoint.Data = *p.Data
			}
		}
		if sealErr != nil {
			out.SealError = sealErr.Error()
		}
		a.printJSON(out)
		return exit
	}
	t := newTable(a.stdout)
	t.row("key", rec.Key)
	t.row("state", rec.State)
	t.row("attempt", rec.Attempt)
	if rec.Fingerprint != "" {
		t.row("fingerprint", rec.Fingerprint)
	}
	if rec.Owner != "" {
		t.row("owner", rec.Owner)
	}
	t.time("created", rec.CreatedAt)
	t.time("updated", rec.UpdatedAt)
	t.time("lease until", rec.LeaseExpiresAt)
	t.time("kept until", rec.ExpiresAt)
	t.response(rec.Response)
	if parts.response != nil {
		t.row("status", parts.status)
		t.row("result", describeSealed(parts.response))
	}
	if p := rec.RecoveryPoint; p != nil {
		t.row("recovery point", fmt.Sprintf("%q by attempt %d at %s", p.Name, p.Attempt, p.RecordedAt.UTC().Format(time.RFC3339Nano)))
		if sealing == nil && looksSealed(p.Data) {
			// Without a ring the client hands data on as it is; an envelope's head
			// tells the key that opens it.
			t.row("point data", describeSealed(p.Data))
		} else {
			t.row("point data", showBody(p.Data))
		}
	}
	if p := parts.point; p != nil {
		t.row("recovery point", fmt.Sprintf("%q by attempt %d at %s", p.Name, p.Attempt, p.RecordedAt.UTC().Format(time.RFC3339Nano)))
		if p.Data != nil {
			t.row("point data", describeSealed(*p.Data))
		}
	}
	if sealErr != nil {
		t.row("not opened", sealErr)
	}
	t.flush()
	return exit
}

// abandonedJSON is an abandoned key as the feed writes it.
type abandonedJSON struct {
	Key            string    `json:"key"`
	Attempt        int64     `json:"attempt"`
	Fingerprint    string    `json:"fingerprint,omitempty"`
	Owner          string    `json:"owner,omitempty"`
	LeaseExpiredAt time.Time `json:"lease_expired_at"`
	RecoveryPoint  string    `json:"recovery_point,omitempty"`
}

// abandoned lists the abandoned-keys feed: every page, or one page of --limit keys
// (with the cursor of the next, --cursor, in --json).
func (a *app) abandoned(args []string) int {
	fs := a.flags("abandoned")
	var opts idem.AbandonedOptions
	fs.StringVar(&opts.Prefix, "prefix", "", "only keys that begin with this")
	fs.DurationVar(&opts.OlderThan, "older-than", 0, "only leases that ran out at least this long ago")
	fs.IntVar(&opts.Limit, "limit", 0, "one page of at most this many keys (1 to 1000) instead of every page")
	fs.StringVar(&opts.Cursor, "cursor", "", "the page after the one whose next_cursor this is (with --limit)")
	if _, err := a.parse(fs, args, 0, "no arguments"); err != nil {
		return a.usageError(err)
	}
	if opts.Limit < 0 || opts.Limit > 1000 {
		return a.usageError(fmt.Errorf("--limit is %d; it must be between 1 and 1000", opts.Limit))
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	ctx := context.Background()
	var keys []idem.AbandonedKey
	next := ""
	if opts.Limit > 0 {
		page, err := c.Abandoned(ctx, opts)
		if err != nil {
			return a.fail(err)
		}
		keys, next = page.Keys, page.Next
	} else {
		for k, err := range c.AbandonedKeys(ctx, opts) {
			if err != nil {
				return a.fail(err)
			}
			keys = append(keys, k)
		}
	}
	if a.json {
		out := struct {
			Keys       []abandonedJSON `json:"keys"`
			NextCursor string          `json:"next_cursor,omitempty"`
		}{Keys: []abandonedJSON{}, NextCursor: next}
		for _, k := range keys {
			out.Keys = append(out.Keys, abandonedJSON{Key: k.Key, Attempt: k.Attempt, Fingerprint: k.Fingerprint, Owner: k.Owner,
				LeaseExpiredAt: k.LeaseExpiredAt, RecoveryPoint: k.RecoveryPoint})
		}
		a.printJSON(out)
		return exitOK
	}
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tATTEMPT\tOWNER\tLEASE RAN OUT\tRECOVERY POINT")
	now := time.Now()
	for _, k := range keys {
		fmt.Fprintf(w, "%q\t%d\t%q\t%s ago\t%q\n", k.Key, k.Attempt, k.Owner, now.Sub(k.LeaseExpiredAt).Round(time.Second), k.RecoveryPoint)
	}
	_ = w.Flush()
	if next != "" {
		fmt.Fprintf(a.stdout, "more: --cursor %s\n", next)
	}
	fmt.Fprintf(a.stderr, "%d abandoned keys\n", len(keys))
	return exitOK
}

func (a *app) purge(args []string) int {
	fs := a.flags("purge")
	pos, err := a.parse(fs, args, 1, "one KEY")
	if err != nil {
		return a.usageError(err)
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	if err := c.Purge(context.Background(), pos[0]); err != nil {
		return a.fail(err)
	}
	if a.json {
		a.printJSON(map[string]any{"key": pos[0], "purged": true})
	} else {
		fmt.Fprintf(a.stdout, "purged %s\n", pos[0])
	}
	return exitOK
}

func (a *app) claim(args []string) int {
	fs := a.flags("claim")
	var opts idem.ClaimOptions
	fs.StringVar(&opts.Fingerprint, "fingerprint", "", "digest of the payload")
	fs.DurationVar(&opts.Lease, "lease", 0, "lease (default: the daemon's)")
	fs.DurationVar(&opts.Wait, "wait", 0, "wait this long for a holder to finish")
	fs.StringVar(&opts.Owner, "owner", "", "owner label, shown by lookups; it grants nothing")
	fs.StringVar(&opts.Secret, "secret", "", "claim secret (default: a fresh one); resending a claim with the live lease's secret gets that lease back")
	pos, err := a.parse(fs, args, 1, "one KEY")
	if err != nil {
		return a.usageError(err)
	}
	if opts.Secret == "" {
		opts.Secret = idem.NewSecret()
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	cl, err := c.Claim(context.Background(), pos[0], opts)
	if err != nil {
		return a.fail(err)
	}
	if a.json {
		out := claimJSON{Key: pos[0], Outcome: string(cl.Outcome), LeaseToken: cl.Token, Attempt: cl.Attempt,
			LeaseExpiresAt: timePtr(cl.LeaseExpiresAt), ExpiresAt: timePtr(cl.ExpiresAt), Recovered: cl.Recovered,
			Response: responseOut(cl.Response)}
		if cl.Outcome == idem.Acquired {
			out.ClaimSecret = opts.Secret
		}
		a.printJSON(out)
		return exitOK
	}
	t := newTable(a.stdout)
	t.row("outcome", cl.Outcome)
	t.row("attempt", cl.Attempt)
	if cl.Outcome == idem.Acquired {
		t.row("lease token", cl.Token)
		t.row("claim secret", opts.Secret+" (resend the claim with --secret to get this lease back)")
	}
	t.time("lease until", cl.LeaseExpiresAt)
	t.time("kept until", cl.ExpiresAt)
	if cl.Recovered {
		t.row("recovered", "true (taken over from a holder whose lease ran out)")
	}
	t.response(cl.Response)
	t.flush()
	return exitOK
}

// headerFlag collects repeated --header "Name: value" flags.
type headerFlag http.Header

func (h headerFlag) String() string { return "" }

func (h headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("want \"Name: value\", got %q", v)
	}
	http.Header(h).Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}

// responseFlags are the flags that describe a response to store.
type responseFlags struct {
	status   int
	body     string
	bodyFile string
	header   headerFlag
}

func (r *responseFlags) define(fs *flag.FlagSet, status int) {
	r.header = headerFlag{}
	fs.IntVar(&r.status, "status", status, "HTTP status of the stored response")
	fs.StringVar(&r.body, "body", "", "body of the stored response")
	fs.StringVar(&r.bodyFile, "body-file", "", "read the body from this file (- for stdin)")
	fs.Var(r.header, "header", "a header of the stored response, \"Name: value\"; repeatable")
}

func (r *responseFlags) response(stdin io.Reader) (idem.Response, error) {
	resp := idem.Response{Status: r.status, Header: http.Header(r.header), Body: []byte(r.body)}
	if r.bodyFile != "" {
		if r.body != "" {
			return resp, fmt.Errorf("--body and --body-file exclude each other")
		}
		var err error
		if r.bodyFile == "-" {
			resp.Body, err = io.ReadAll(stdin)
		} else {
			resp.Body, err = os.ReadFile(r.bodyFile)
		}
		if err != nil {
			return resp, fmt.Errorf("--body-file: %w", err)
		}
	}
	if r.status < 100 || r.status > 599 {
		return resp, fmt.Errorf("--status %d is not an HTTP status", r.status)
	}
	return resp, nil
}

func (a *app) complete(args []string) int {
	fs := a.flags("complete")
	var leaseToken string
	var rf responseFlags
	fs.StringVar(&leaseToken, "lease-token", "", "the lease token the claim returned (required)")
	rf.define(fs, http.StatusOK)
	pos, err := a.parse(fs, args, 1, "one KEY")
	if err == nil && leaseToken == "" {
		err = fmt.Errorf("complete needs --lease-token")
	}
	if err != nil {
		return a.usageError(err)
	}
	resp, err := rf.response(os.Stdin)
	if err != nil {
		return a.usageError(err)
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	if err := c.Complete(context.Background(), pos[0], leaseToken, resp); err != nil {
		return a.fail(err)
	}
	a.done(pos[0], "completed")
	return exitOK
}

func (a *app) release(args []string) int {
	fs := a.flags("release")
	var leaseToken, mode string
	var rf responseFlags
	fs.StringVar(&leaseToken, "lease-token", "", "the lease token the claim returned (required)")
	fs.StringVar(&mode, "mode", "retry", "retry frees the key; fail stores a terminal failure")
	rf.define(fs, http.StatusInternalServerError)
	pos, err := a.parse(fs, args, 1, "one KEY")
	switch {
	case err != nil:
	case leaseToken == "":
		err = fmt.Errorf("release needs --lease-token")
	case mode != string(idem.Retry) && mode != string(idem.Fail):
		err = fmt.Errorf("--mode is retry or fail, not %q", mode)
	}
	if err != nil {
		return a.usageError(err)
	}
	var stored *idem.Response
	if mode == string(idem.Fail) {
		resp, err := rf.response(os.Stdin)
		if err != nil {
			return a.usageError(err)
		}
		stored = &resp
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	if err := c.Release(context.Background(), pos[0], leaseToken, idem.ReleaseMode(mode), stored); err != nil {
		return a.fail(err)
	}
	state := "released"
	if mode == string(idem.Fail) {
		state = "failed"
	}
	a.done(pos[0], state)
	return exitOK
}

func (a *app) extend(args []string) int {
	fs := a.flags("extend")
	var leaseToken string
	var lease time.Duration
	fs.StringVar(&leaseToken, "lease-token", "", "the lease token the claim returned (required)")
	fs.DurationVar(&lease, "lease", 30*time.Second, "how long the lease lasts from now")
	pos, err := a.parse(fs, args, 1, "one KEY")
	if err == nil && leaseToken == "" {
		err = fmt.Errorf("extend needs --lease-token")
	}
	if err != nil {
		return a.usageError(err)
	}
	c, err := a.client(nil)
	if err != nil {
		return a.usageError(err)
	}
	until, err := c.Extend(context.Background(), pos[0], leaseToken, lease)
	if err != nil {
		return a.fail(err)
	}
	if a.json {
		a.printJSON(map[string]any{"key": pos[0], "lease_expires_at": until})
	} else {
		fmt.Fprintf(a.stdout, "%s: lease until %s\n", pos[0], until.UTC().Format(time.RFC3339Nano))
	}
	return exitOK
}

// done reports a transition that answers nothing but success.
func (a *app) done(key, state string) {
	if a.json {
		a.printJSON(map[string]any{"key": key, "state": state})
		return
	}
	fmt.Fprintf(a.stdout, "%s: %s\n", key, state)
}
