package idem

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestReplayCacheBoundsMemory(t *testing.T) {
	const maxBytes = 64 << 10
	c := newReplayCache(maxBytes, time.Hour)
	now := time.Now()
	body := make([]byte, 100)
	for i := range 10000 {
		c.put(fmt.Sprintf("key-%d", i), "fp", Completed, 1, now.Add(time.Hour), &Response{Status: 201, Body: body}, now, 0)
		if c.bytes > maxBytes {
			t.Fatalf("after %d entries the cache holds %d bytes, over %d", i+1, c.bytes, maxBytes)
		}
	}
	if len(c.entries) >= 10000 || len(c.entries) != c.order.Len() {
		t.Fatalf("%d entries in the map, %d in the list", len(c.entries), c.order.Len())
	}
	if _, ok := c.get("key-0", "fp", now, false); ok {
		t.Error("the oldest entry survived")
	}
	if _, ok := c.get("key-9999", "fp", now, false); !ok {
		t.Error("the newest entry was dropped")
	}
	c.put("large", "fp", Completed, 1, now.Add(time.Hour), &Response{Status: 201, Body: make([]byte, maxBytes/8)}, now, 0)
	if _, ok := c.get("large", "fp", now, false); ok {
		t.Error("an entry over a sixteenth of the cache was kept")
	}
}

func TestReplayCacheEntries(t *testing.T) {
	now := time.Now()
	c := newReplayCache(1<<20, time.Minute)
	c.put("k", "fp", Completed, 2, now.Add(time.Hour), &Response{Status: 201, Header: http.Header{"Location": {"/1"}}, Body: []byte("one")}, now, 0)

	cl, ok := c.get("k", "fp", now, false)
	if !ok || cl.Outcome != Completed || cl.Attempt != 2 || !cl.ExpiresAt.Equal(now.Add(time.Hour)) || string(cl.Response.Body) != "one" {
		t.Fatalf("get: %+v %v", cl, ok)
	}
	cl.Response.Body[0] = 'X'
	cl.Response.Header.Set("Location", "/changed")
	if again, _ := c.get("k", "fp", now, false); string(again.Response.Body) != "one" || again.Response.Header.Get("Location") != "/1" {
		t.Fatalf("a caller's change reached the cache: %+v", again.Response)
	}
	if _, ok := c.get("k", "other", now, false); ok {
		t.Error("another fingerprint was answered from the cache")
	}
	if _, ok := c.get("k", "fp", now.Add(time.Minute), false); ok {
		t.Error("an entry older than the max age was answered")
	}

	c.put("short", "", Failed, 1, now.Add(time.Second), nil, now, 0)
	if _, ok := c.get("short", "", now.Add(time.Second), false); ok {
		t.Error("an entry was answered at its record's expires_at")
	}
	c.put("gone", "", Completed, 1, now, nil, now, 0)
	if _, ok := c.get("gone", "", now, false); ok {
		t.Error("an expired record was cached")
	}
	c.put("k2", "", Completed, 1, now.Add(time.Hour), nil, now, 0)
	c.remove("k2")
	if _, ok := c.get("k2", "", now, false); ok {
		t.Error("a removed entry was answered")
	}
	if newReplayCache(0, time.Minute) != nil || newReplayCache(1, 0) != nil {
		t.Error("a zero bound did not turn the cache off")
	}
	var off *replayCache
	if _, ok := off.get("k", "", now, false); ok {
		t.Error("a cache that is off answered")
	}
}
