// Command idemctl is the operator's command for idemd: it looks records up and purges
// them, claims, completes and releases keys by hand, makes API tokens and checks auth
// files, and measures a running daemon with bench. It talks to idemd through the Go SDK.
//
// Exit codes: 0 success; 1 idemd refused the call (its problem details are printed), a
// checked file is invalid, or a bench request failed; 2 bad usage; 3 no record for the
// key; 4 idemd or its store unavailable, or unreachable.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	idem "github.com/idemd/idemd/clients/go"
)

// The exit codes.
const (
	exitOK          = 0
	exitRefused     = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitUnavailable = 4
)

const usage = `idemctl talks to an idemd.

Usage: idemctl [flags] COMMAND [flags] [ARGS]

Records:
  lookup KEY                      show the record of KEY; a result its client sealed shows as
                                  sealed, or opened with --seal-keys FILE (default
                                  $IDEMD_SEAL_KEYS) and --seal-tenant (default
                                  $IDEMD_SEAL_TENANT, else default)
  purge KEY                       delete the record of KEY (needs the admin scope)
  claim KEY                       claim KEY: --fingerprint, --lease, --wait, --owner
  complete KEY --lease-token T    store a result: --status, --body or --body-file, --header
  release KEY --lease-token T     free the key (--mode retry) or store a failure (--mode fail)
  extend KEY --lease-token T      renew the lease for --lease
  abandoned [--prefix P]          list the keys left pending by a holder whose lease ran
                                  out: --older-than, --limit (default: every page)
  usage                           each tenant's records and bytes in the store against its
                                  quota, and how full the store is (from /metrics)

Operations:
  export [--out FILE]             write the records as a record stream (admin scope; every
                                  tenant's with platform): to FILE, checked whole before it
                                  takes the name, with its SHA-256 printed; - is stdout
  import FILE                     check a record stream whole, then import it: each record is
                                  written where the store holds none of its key (admin scope)
  backup --out FILE [--blob-dir DIR]
                                  copy a running idemd's embedded store, consistent as of one
                                  moment, checked, with FILE.sha256 beside it (admin and
                                  platform scopes), and the blobs its records refer to from
                                  the daemon's blob directory DIR to FILE.blobs, each checked
  backup verify FILE              check a copy: its digest (FILE.sha256, or --sha256 HEX),
                                  every page, and every blob in FILE.blobs against its record;
                                  without a digest it refuses, since pages alone miss a
                                  changed byte of data, unless told --pages-only
  restore FILE --data-dir DIR     check a copy as verify does and make it DIR's database, its
                                  blobs DIR/blobs (--blob-dir), for an idemd started after;
                                  --replace keeps a database there
  copy --from STORE --to STORE    copy every record, lease tokens and all, into another store
                                  while no idemd serves either (bolt:///abs/path/idemd.db or
                                  a Redis URL); run again after an interruption to finish
  migration status                where the live move of the daemon at --url stands: records
                                  copied, left, the rate, about how long to go (platform
                                  scope; the daemon serves --console)
  token new --tenant T --scopes use,admin [--name N]
                                  make a token; print it once, and its auth-file entry
  auth check FILE                 check an auth file as idemd does at start-up and on SIGHUP
  bench                           measure a running idemd: --mode cycle|replay, --concurrency,
                                  --requests, --duration
  version                         print idemctl's version

Flags of every command:
  --url URL        idemd's base URL (default $IDEMD_URL, else http://127.0.0.1:8080)
  --token TOKEN    API token (default $IDEMD_TOKEN)
  --ca-file FILE   PEM certificates to trust for an https URL (default $IDEMD_CA_FILE)
  --timeout D      bound on each call (default 10s)
  --json           print JSON instead of text; errors become problem details on stdout

Exit codes: 0 success; 1 idemd refused the call, a file is invalid, or bench saw
errors; 2 bad usage; 3 no record for the key; 4 idemd unavailable or unreachable.
`

// app is one invocation: where it writes, and the flags every command shares.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string

	url     string
	token   string
	caFile  string
	timeout time.Duration
	json    bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run executes one command line and returns the exit code.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv, timeout: 10 * time.Second,
		url: getenv("IDEMD_URL"), token: getenv("IDEMD_TOKEN"), caFile: getenv("IDEMD_CA_FILE")}
	if a.url == "" {
		a.url = "http://127.0.0.1:8080"
	}
	root := a.flags("idemctl")
	if err := root.Parse(args); err != nil {
		return a.usageError(err)
	}
	if root.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return exitUsage
	}
	cmd, rest := root.Arg(0), root.Args()[1:]
	switch cmd {
	case "lookup":
		return a.lookup(rest)
	case "purge":
		return a.purge(rest)
	case "claim":
		return a.claim(rest)
	case "complete":
		return a.complete(rest)
	case "release":
		return a.release(rest)
	case "extend":
		return a.extend(rest)
	case "abandoned":
		return a.abandoned(rest)
	case "export":
		return a.export(rest)
	case "import":
		return a.importCmd(rest)
	case "backup":
		return a.backupCmd(rest)
	case "restore":
		return a.restore(rest)
	case "migration":
		return a.migration(rest)
	case "copy":
		return a.copyCmd(rest)
	case "usage":
		return a.runUsage(rest)
	case "token":
		return a.tokenCmd(rest)
	case "auth":
		return a.authCmd(rest)
	case "bench":
		return a.bench(rest)
	case "version":
		fmt.Fprintln(stdout, "idemctl", buildVersion())
		return exitOK
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	return a.usageError(fmt.Errorf("unknown command %q", cmd))
}

// flags is a flag set holding the flags every command shares, with the values set so
// far as defaults: they may come before the command or after it.
func (a *app) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&a.url, "url", a.url, "idemd's base URL")
	fs.StringVar(&a.token, "token", a.token, "API token")
	fs.StringVar(&a.caFile, "ca-file", a.caFile, "PEM certificates to trust")
	fs.DurationVar(&a.timeout, "timeout", a.timeout, "bound on each call")
	fs.BoolVar(&a.json, "json", a.json, "print JSON")
	return fs
}

// parse reads a command's flags, which may come before, between or after its n
// positional arguments (anything after "--" is positional).
func (a *app) parse(fs *flag.FlagSet, args []string, n int, names string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	if len(positional) != n {
		return nil, fmt.Errorf("%s takes %s", fs.Name(), names)
	}
	return positional, nil
}

func (a *app) usageError(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(a.stdout, usage)
		return exitOK
	}
	fmt.Fprintf(a.stderr, "idemctl: %v\nRun idemctl help for the commands and their flags.\n", err)
	return exitUsage
}

// transport is an HTTP transport trusting --ca-file, when given.
func (a *app) transport() (*http.Transport, error) {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	if a.caFile != "" {
		pem, err := os.ReadFile(a.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", a.caFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	return transport, nil
}

// client is the SDK's client for the flags given, over transport (nil: a default one).
func (a *app) client(transport *http.Transport, opts ...idem.Option) (*idem.Client, error) {
	if transport == nil {
		var err error
		if transport, err = a.transport(); err != nil {
			return nil, err
		}
	}
	// No replay cache: an operator's command shows what idemd says, and bench measures
	// idemd, not the client's memory.
	base := []idem.Option{idem.WithHTTPClient(&http.Client{Transport: transport}), idem.WithTimeout(a.timeout),
		idem.WithReplayCache(0, 0)}
	if a.token != "" {
		base = append(base, idem.WithToken(a.token))
	}
	return idem.New(strings.TrimSuffix(a.url, "/"), append(base, opts...)...)
}

// problemJSON is an RFC 9457 problem as idemctl prints it with --json.
type problemJSON struct {
	Type         string `json:"type,omitempty"`
	Title        string `json:"title"`
	Status       int    `json:"status,omitempty"`
	Detail       string `json:"detail,omitempty"`
	Code         string `json:"code,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
}

// fail reports an error of a call to idemd and returns its exit code: the problem
// details idemd answered, or why there was no answer.
func (a *app) fail(err error) int {
	code := exitRefused
	switch {
	case errors.Is(err, idem.ErrNotFound):
		code = exitNotFound
	case errors.Is(err, idem.ErrUnavailable):
		code = exitUnavailable
	}
	var p *idem.Problem
	isProblem := errors.As(err, &p)
	if a.json {
		out := problemJSON{Title: "idemd is unreachable", Detail: err.Error()}
		if isProblem {
			out = problemJSON{Type: p.Type, Title: p.Title, Status: p.Status, Detail: p.Detail, Code: p.Code, RetryAfterMs: p.RetryAfter.Milliseconds()}
		}
		a.printJSON(out)
		return code
	}
	msg := err.Error()
	if isProblem {
		msg = p.Error()
		if p.RetryAfter > 0 {
			msg += fmt.Sprintf(" (retry after %s)", p.RetryAfter)
		}
	}
	fmt.Fprintln(a.stderr, "idemctl:", msg)
	return code
}

func (a *app) printJSON(v any) {
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
