package main

import (
	"fmt"
	"runtime"
	"slices"
	"strings"

	"github.com/idemd/idemd/internal/auth"
	release "github.com/idemd/idemd/internal/version"
)

// tokenCmd is `token new`: a fresh token, printed once, and the auth-file entry that
// holds only its hash. The entry's format and checks are internal/auth's own.
func (a *app) tokenCmd(args []string) int {
	if len(args) == 0 || args[0] != "new" {
		return a.usageError(fmt.Errorf("token takes the subcommand new"))
	}
	fs := a.flags("token new")
	var tenant, scopes, name string
	fs.StringVar(&tenant, "tenant", "", "the tenant the token works in (required)")
	fs.StringVar(&scopes, "scopes", "use", "comma-separated scopes: use, admin or use,admin; add platform for an operator whose console acts in every tenant")
	fs.StringVar(&name, "name", "", "a name for the token, shown in idemd's logs")
	if _, err := a.parse(fs, args[1:], 0, "no arguments"); err != nil {
		return a.usageError(err)
	}
	if tenant == "" {
		return a.usageError(fmt.Errorf("token new needs --tenant"))
	}
	var list []auth.Scope
	for s := range strings.SplitSeq(scopes, ",") {
		if s = strings.TrimSpace(s); s != "" {
			list = append(list, auth.Scope(s))
		}
	}
	token := auth.NewToken()
	hash := auth.HashToken(token)
	entry, err := auth.TokenEntry(name, tenant, list, hash)
	if err != nil {
		return a.usageError(err)
	}
	if a.json {
		a.printJSON(map[string]any{"token": token, "sha256": hash, "tenant": tenant, "scopes": list, "name": name, "entry": entry})
		return exitOK
	}
	fmt.Fprintf(a.stdout, `Token, shown only this once; give it to the team that calls idemd:

  %s

Entry for the auth file's tokens list (it holds only the hash; tenant %q must be
declared under tenants). Add it, then reload idemd with SIGHUP:

%s`, token, tenant, entry)
	return exitOK
}

// authCmd is `auth check FILE`: it loads the file with the very function the daemon
// calls at start-up and on SIGHUP, so it accepts and refuses exactly what idemd does.
func (a *app) authCmd(args []string) int {
	if len(args) == 0 || args[0] != "check" {
		return a.usageError(fmt.Errorf("auth takes the subcommand check"))
	}
	fs := a.flags("auth check")
	pos, err := a.parse(fs, args[1:], 1, "one FILE")
	if err != nil {
		return a.usageError(err)
	}
	keyring, err := auth.Load(pos[0])
	if err != nil {
		if a.json {
			a.printJSON(map[string]any{"file": pos[0], "valid": false, "error": err.Error()})
		} else {
			fmt.Fprintf(a.stderr, "idemctl: %s is not a valid auth file: %v\n", pos[0], err)
		}
		return exitRefused
	}
	cfg := keyring.Config()
	tenants := cfg.Tenants()
	slices.Sort(tenants)
	if a.json {
		a.printJSON(map[string]any{"file": pos[0], "valid": true, "tenants": tenants, "tokens": cfg.Tokens()})
		return exitOK
	}
	fmt.Fprintf(a.stdout, "%s: valid, %d tokens in %d tenants (%s)\n", pos[0], cfg.Tokens(), len(tenants), strings.Join(tenants, ", "))
	return exitOK
}

// version may be stamped by a build with -ldflags "-X main.version=0.5.1-rc.1";
// otherwise it is the release the tree is (internal/version).
var version string

func buildVersion() string {
	v := version
	if v == "" {
		v = release.Release
	}
	return v + " (" + runtime.Version() + ")"
}
