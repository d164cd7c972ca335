package redisstore

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/idemd/idemd/internal/engine"
)

// CRC-16/XMODEM's check value, which the Redis Cluster specification quotes.
func TestCRC16(t *testing.T) {
	if got := crc16([]byte("123456789")); got != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3", got)
	}
}

func TestLeanKeyIsInTheEarlierKeysSlot(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		id := engine.ID{Tenant: []string{engine.DefaultTenant, "payments", "t-9"}[i%3], Key: fmt.Sprintf("key-%d-%d", i, r.Int())}
		lean, legacy := LeanKey(id), RecordKey(id)
		if slot(lean) != slot(legacy) {
			t.Fatalf("%q: lean key in slot %d, earlier key in slot %d", id.Key, slot(lean), slot(legacy))
		}
		if id.Tenant == engine.DefaultTenant && len(lean) != 44 {
			t.Fatalf("a lean key of the default tenant is %d bytes, want 44", len(lean))
		}
	}
	for s, tag := range slotTags {
		if tag[0] == '}' || tag[1] == '}' || slot("{"+string(tag[:])+"}") != uint16(s) {
			t.Fatalf("slot %d has tag %q", s, tag)
		}
	}
}

func TestCompactKeepsValuesApart(t *testing.T) {
	values := []string{"", "a", "ab", "AB", "0f", "0F", "sha256:", "sha256:0f", "sha256:0F", "\x00", "\x01", "\x02",
		"\x00ab", "\x01ab", "\x02ab", "\x03", "0123456789abcdef0123456789abcdef", "f",
		"sha256:" + strings.Repeat("ab", 32), strings.Repeat("9", 64), "token with spaces"}
	r := rand.New(rand.NewPCG(3, 4))
	for range 5000 {
		b := make([]byte, r.IntN(40))
		for i := range b {
			b[i] = "0123456789abcdefABsha:\x00\x01\x02\x03"[r.IntN(26)]
		}
		values = append(values, string(b))
	}
	seen := map[string]string{}
	for _, v := range values {
		c := compact(v)
		if back := expand(c); back != v {
			t.Fatalf("expand(compact(%q)) = %q", v, back)
		}
		if other, ok := seen[c]; ok && other != v {
			t.Fatalf("%q and %q compact alike", v, other)
		}
		seen[c] = v
	}
	if got := len(compact(engine.NewLeaseToken())); got != 17 {
		t.Fatalf("a lease token compacts to %d bytes, want 17", got)
	}
	if got := len(compact("sha256:" + strings.Repeat("ab", 32))); got != 33 {
		t.Fatalf("a middleware fingerprint compacts to %d bytes, want 33", got)
	}
}

func TestPackedHeadersReadBack(t *testing.T) {
	for _, h := range []map[string][]string{
		nil,
		{"content-type": {"application/json"}, "location": {"/orders/1"}},
		{"Content-Type": {"text/plain; charset=utf-8"}, "x-trace": {"a", "b", ""}, "etag": {`"v1"`}},
		{"link": {"<a>; rel=next", "<b>; rel=prev"}, "retry-after": {"3"}, "vary": {"accept"}},
		// Kept as JSON: what the packed form cannot hold.
		{"x": {"line\nbreak"}},
		{"empty": {}},
		{"odd:name": {"v"}},
	} {
		packed, err := packHeaders(h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := unpackHeaders(packed)
		if err != nil {
			t.Fatalf("%q: %v", packed, err)
		}
		if len(h) == 0 && len(got) == 0 {
			continue
		}
		if !maps.EqualFunc(got, h, slices.Equal) {
			t.Fatalf("headers %v came back as %v (packed %q)", h, got, packed)
		}
	}
	packed, _ := packHeaders(map[string][]string{"content-type": {"application/json"}, "location": {"/orders/0123456789"}})
	if len(packed) != 37 {
		t.Fatalf("the default headers pack into %d bytes (%q), want 37", len(packed), packed)
	}
}
