package server

import "testing"

// TestEveryRouteHasAScope guards routeScopes: a route added to the API without a scope
// would be open to any valid token.
func TestEveryRouteHasAScope(t *testing.T) {
	s := New(nil, Config{})
	checked := 0
	for _, r := range s.echo.Routes() {
		if openPaths[r.Path] {
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
