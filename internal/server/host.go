package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/labstack/echo/v4"
)

// hosts is what an open daemon answers to: besides IP literals and localhost, the
// names it was given, lower-case and without the root's dot.
type hosts map[string]bool

func newHosts(names []string) hosts {
	h := hosts{}
	for _, n := range names {
		h[canonicalHost(n)] = true
	}
	return h
}

// canonicalHost is a name as compared: lower-case, without the root's trailing dot.
func canonicalHost(name string) string {
	return strings.TrimSuffix(strings.ToLower(name), ".")
}

// allows reports whether an open daemon answers a request whose Host header is
// hostport. A web page can make a browser send requests to any name its site controls,
// and then point that name at the daemon's address (DNS rebinding); the browser treats
// the answers as the page's own. It cannot do so with an IP literal or localhost, which
// no DNS answer defines, nor with a name the daemon was told, which the page's site does
// not control. An empty Host (HTTP/1.0) comes from no browser.
func (h hosts) allows(hostport string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if name, _, err := net.SplitHostPort(hostport); err == nil {
		host = name
	} else if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		host = hostport[1 : len(hostport)-1]
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	host = canonicalHost(host)
	return host == "localhost" || h[host]
}

// checkHost refuses the requests of an open daemon whose Host it does not answer to
// (hosts.allows). With an Authenticator every request needs a token, which a page
// reaching the daemon by rebinding does not hold, so any Host is answered. The paths
// that answer without a token answer any Host too: they reveal nothing about records,
// and probes and scrapers call the daemon by whatever name their platform gives it.
func (s *Server) checkHost(c echo.Context, endpoint string) error {
	if s.auth != nil || openPaths[c.Path()] || s.hosts.allows(c.Request().Host) {
		return nil
	}
	s.log.Warn("request refused: a Host an open daemon does not answer to", "reason", "host",
		"host", c.Request().Host, "endpoint", endpoint, "remote", c.Request().RemoteAddr)
	return &problem{status: http.StatusForbidden, code: codeForbidden, detail: fmt.Sprintf(
		"Host %q: without an auth file idemd answers only an IP literal, localhost, or a name given to --allowed-hosts", c.Request().Host)}
}
