package idem

import (
	"net"
	"net/http"
	"time"
)

// maxIdleConns is how many idle connections to idemd the default transport keeps. A
// service with many requests in flight sends as many calls at once; with net/http's
// default of two idle connections per host, most of them would open a fresh TCP
// connection and close it again.
const maxIdleConns = 256

// newTransport is the default client's transport: net/http's defaults (proxy from the
// environment, dial and TLS timeouts, HTTP/2 when offered) with room to keep
// connections to idemd open.
func newTransport() *http.Transport {
	var t *http.Transport
	if d, ok := http.DefaultTransport.(*http.Transport); ok {
		t = d.Clone()
	} else {
		// The program replaced http.DefaultTransport with a wrapper; start from the
		// same defaults net/http's has.
		t = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			ForceAttemptHTTP2:     true,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	t.MaxIdleConns = maxIdleConns
	t.MaxIdleConnsPerHost = maxIdleConns
	t.IdleConnTimeout = 90 * time.Second
	return t
}
