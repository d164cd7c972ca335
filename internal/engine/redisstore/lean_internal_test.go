package redisstore

import (
	"crypto/sha256"
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
	if got := crc16("123456789"); got != 0x31c3 {
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

// TestRecordKeysAreAgreed: a record's keys are part of the layout that daemons of
// every release share (see layout.go), so they are held to values written down once,
// key for key, slot for slot.
func TestRecordKeysAreAgreed(t *testing.T) {
	for _, c := range []struct {
		id   engine.ID
		keys []string
		slot uint16
	}{
		{engine.ID{Tenant: "default", Key: "order-1"}, []string{
			"idem:default:0bafe22156d2698c143b86040446d366ead863ba600d5c924f3d15c786ef4057",
			"{:\xa1}default:\v\xaf\xe2!V\xd2i\x8c\x14;\x86\x04\x04F\xd3f\xea\xd8c\xba`\r\\\x92O=\x15ǆ\xef@W",
			"{:\xa1}\x00pending:default", "{:\xa1}\x00usage:default"}, 3989},
		{engine.ID{Tenant: "payments", Key: "a{b}c"}, []string{
			"idem:payments:0c81d082effbfc200f529870c4baa760fbb3ea0736a2551caa6b195a7015ed18",
			"{'\r}payments:\f\x81Ђ\xef\xfb\xfc \x0fR\x98pĺ\xa7`\xfb\xb3\xea\a6\xa2U\x1c\xaak\x19Zp\x15\xed\x18",
			"{'\r}\x00pending:payments", "{'\r}\x00usage:payments"}, 3804},
		{engine.ID{Tenant: "t-9", Key: ""}, []string{
			"idem:t-9:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
			"{\x01\xfb}t-9:\xe3\xb0\xc4B\x98\xfc\x1c\x14\x9a\xfb\xf4șo\xb9$'\xaeA\xe4d\x9b\x93L\xa4\x95\x99\x1bxR\xb8U",
			"{\x01\xfb}\x00pending:t-9", "{\x01\xfb}\x00usage:t-9"}, 11589},
	} {
		if got := recordKeys(c.id); !slices.Equal(got, c.keys) {
			t.Errorf("keys of %v: %q, want %q", c.id, got, c.keys)
		}
		for _, k := range c.keys {
			if got := slot(k); got != c.slot {
				t.Errorf("slot of %q: %d, want %d", k, got, c.slot)
			}
		}
	}
}

// TestCRC16AgainstBitwise holds crc16 to CRC-16/XMODEM computed bit by bit.
func TestCRC16AgainstBitwise(t *testing.T) {
	bitwise := func(b []byte) uint16 {
		var crc uint16
		for _, c := range b {
			crc ^= uint16(c) << 8
			for range 8 {
				if crc&0x8000 != 0 {
					crc = crc<<1 ^ 0x1021
				} else {
					crc <<= 1
				}
			}
		}
		return crc
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		b := make([]byte, r.IntN(100))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		if got, want := crc16(string(b)), bitwise(b); got != want {
			t.Fatalf("crc16(%x) = %#x, want %#x", b, got, want)
		}
	}
}

// BenchmarkDigestKeys measures what every script call spends on its keys: the four keys
// and the slot of their hash tag.
// go test -run XXX -bench DigestKeys ./internal/engine/redisstore/
func BenchmarkDigestKeys(b *testing.B) {
	sum := sha256.Sum256([]byte("order-1"))
	b.ReportAllocs()
	for b.Loop() {
		_ = digestKeys(engine.DefaultTenant, sum)
	}
}
