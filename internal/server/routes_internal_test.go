package server

import (
	"testing"

	"github.com/labstack/echo/v4"
)

// TestEveryRouteHasAScope guards routeScopes: a route added to the API without a scope
// would be open to any valid token.
func TestEveryRouteHasAScope(t *testing.T) {
	s := New(nil, Config{})
	checked := 0
	for _, r := range s.echo.Routes() {
		// Without the console, /console answers 404 to everyone, before authentication.
		if openPaths[r.Path] || r.Method == echo.RouteNotFound && consolePaths[r.Path] {
			continue
		}
		checked++
		if _, ok := routeScopes[r.Method+" "+r.Path]; !ok {
			t.Errorf("%s %s has no entry in routeScopes", r.Method, r.Path)
		}
	}
	if checked != len(routeScopes) {
		t.Errorf("checked %d routes, routeScopes lists %d", checked, len(routeScopes))
	}
}

// TestEveryConsoleRouteIsChecked: with the console on, a route is open (the probes,
// the page and its files), an API route with its scope, or a console endpoint whose
// handler checks the scope consoleRoutes gives it, in the tenant it acts in.
func TestEveryConsoleRouteIsChecked(t *testing.T) {
	s := New(nil, Config{Console: Console{Enabled: true}})
	console := 0
	for _, r := range s.echo.Routes() {
		endpoint := r.Method + " " + r.Path
		_, api := routeScopes[endpoint]
		_, con := s.console.scopes[endpoint]
		switch {
		case openPaths[r.Path] || consolePaths[r.Path]:
		case api:
		case con:
			console++
		default:
			t.Errorf("%s is neither open, nor an API route with a scope, nor in consoleRoutes", endpoint)
		}
	}
	if console != len(consoleRoutes) {
		t.Errorf("found %d console endpoints, consoleRoutes lists %d", console, len(consoleRoutes))
	}
}
