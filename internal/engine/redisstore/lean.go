package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sort"
	"strings"

	"github.com/idemd/idemd/internal/engine"
)

// The lean layout (layout 3, lua/prelude.lua) keeps a record in about half the memory of
// the string layout before it. Its key is short and binary, in the same Cluster slot as
// the record's key of earlier releases (RecordKey), so that one script can look at both;
// and the daemon hands the scripts the lease token, the fingerprint, the claim secret's
// digest and the headers in compact forms, which the scripts only store and compare.

// LeanKey is the Redis key of a record in the lean layout: a hash tag of two bytes that
// puts it in RecordKey's Cluster slot, the tenant, and the SHA-256 of the client's key
// as 32 bytes: 44 bytes for the default tenant, where RecordKey takes 77.
func LeanKey(id engine.ID) string { return recordKeys(id)[1] }

// recordKeys are a record's keys: RecordKey, then LeanKey, from one digest of the
// client's key, then the pending index of its slot (indexKey), which the scripts take
// (scriptKeys), and the usage hash the release before this one kept of the tenant there
// (usageKey), which they do not.
func recordKeys(id engine.ID) []string {
	return digestKeys(id.Tenant, sha256.Sum256([]byte(id.Key)))
}

// digestKeys are recordKeys of the key whose SHA-256 is sum. Every call of a script
// makes them, so they are written into one string, of which each key is a part.
func digestKeys(tenant string, sum [32]byte) []string {
	const pending, usage = "}\x00pending:", "}\x00usage:"
	var b strings.Builder
	b.Grow(len("idem:") + len(tenant) + 1 + 2*len(sum) + // the legacy key
		4 + len(tenant) + 1 + len(sum) + // the lean key
		3 + len(pending) + len(tenant) + 3 + len(usage) + len(tenant))
	b.WriteString("idem:")
	b.WriteString(tenant)
	b.WriteByte(':')
	var hexSum [2 * len(sum)]byte
	hex.Encode(hexSum[:], sum[:])
	b.Write(hexSum[:])
	legacyEnd := b.Len()
	// The slot is the legacy key's, computed from what was just written.
	tag := slotTags[slot(b.String())]
	b.WriteByte('{')
	b.Write(tag[:])
	b.WriteByte('}')
	b.WriteString(tenant)
	b.WriteByte(':')
	b.Write(sum[:])
	leanEnd := b.Len()
	b.WriteByte('{')
	b.Write(tag[:])
	b.WriteString(pending)
	b.WriteString(tenant)
	indexEnd := b.Len()
	b.WriteByte('{')
	b.Write(tag[:])
	b.WriteString(usage)
	b.WriteString(tenant)
	all := b.String()
	return []string{all[:legacyEnd], all[legacyEnd:leanEnd], all[leanEnd:indexEnd], all[indexEnd:]}
}

// indexKey is the pending index of a tenant's records in one Cluster slot (see
// lua/prelude.lua). Every deployment has one per slot, a Cluster's scripts being
// unable to reach another slot: a standalone Redis could do with one, but the feed that
// reads the indexes is read seldom. The NUL after the tag keeps it apart from every record key, whose tenant
// names never hold one.
func indexKey(tenant string, slot uint16) string {
	tag := slotTags[slot]
	return "{" + string(tag[:]) + "}\x00pending:" + tenant
}

// slotTags holds, for each of Redis Cluster's 16384 slots, two bytes that hash to it. A
// key whose hash tag is those bytes lives in that slot. CRC16 maps the 65536 values of
// two bytes one to one, so each slot has four; the first without '}' (which would end
// the tag) is kept.
var slotTags = func() [16384][2]byte {
	var tags [16384][2]byte
	var found [16384]bool
	for v := 0; v < 1<<16; v++ {
		b := [2]byte{byte(v >> 8), byte(v)}
		if b[0] == '}' || b[1] == '}' {
			continue
		}
		s := crc16(string(b[:])) % 16384
		if !found[s] {
			tags[s], found[s] = b, true
		}
	}
	for _, ok := range found {
		if !ok {
			panic("redisstore: no two-byte hash tag for a Cluster slot")
		}
	}
	return tags
}()

// slot is the Redis Cluster slot of key: CRC16 of its hash tag (the part between the
// first '{' and the next '}', when not empty) or of the whole key, modulo 16384.
func slot(key string) uint16 {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	return crc16(key) % 16384
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial 0), the CRC Redis Cluster hashes
// keys with, a byte at a time through crcTable.
func crc16(b string) uint16 {
	var crc uint16
	for i := range len(b) {
		c := b[i]
		crc = crc<<8 ^ crcTable[byte(crc>>8)^c]
	}
	return crc
}

// crcTable is the CRC of each byte's value shifted into the top of the register.
var crcTable = func() (t [256]uint16) {
	for v := range t {
		crc := uint16(v) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[v] = crc
	}
	return t
}()

// compact is how the lean layout keeps a token, a fingerprint or a digest: lowercase hex
// as its bytes after 0x01, "sha256:" and lowercase hex (the middleware's fingerprints)
// as the digest's bytes after 0x00, and anything else as it is, after 0x02 when it
// begins with a byte below 0x03. Different values stay different.
func compact(s string) string {
	if h, ok := strings.CutPrefix(s, "sha256:"); ok && lowerHex(h) {
		return decodeHex(0, h)
	}
	if lowerHex(s) {
		return decodeHex(1, s)
	}
	if s != "" && s[0] < 3 {
		return "\x02" + s
	}
	return s
}

// decodeHex is prefix then the bytes of h, lowercase hex of an even length, in one
// allocation.
func decodeHex(prefix byte, h string) string {
	var b strings.Builder
	b.Grow(1 + len(h)/2)
	b.WriteByte(prefix)
	for i := 0; i < len(h); i += 2 {
		b.WriteByte(unhex(h[i])<<4 | unhex(h[i+1]))
	}
	return b.String()
}

// unhex is the value of a lowercase hex digit.
func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// expand undoes compact. A value of an earlier layout, kept as it came, begins with no
// such byte (tokens are hex, and a fingerprint that did is expanded as written).
func expand(s string) string {
	if s == "" {
		return s
	}
	switch s[0] {
	case 0:
		if len(s) > 1 {
			return "sha256:" + hex.EncodeToString([]byte(s[1:]))
		}
	case 1:
		if len(s) > 1 {
			return hex.EncodeToString([]byte(s[1:]))
		}
	case 2:
		return s[1:]
	}
	return s
}

func lowerHex(s string) bool {
	if len(s) < 2 || len(s)%2 != 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// commonHeaders are the header names the lean layout keeps as one byte each: those the
// middlewares store by default, and a few more that answers often carry. 0x0a is left
// out: it separates the entries.
var commonHeaders = []string{"", "content-type", "location", "cache-control", "etag",
	"last-modified", "content-language", "content-disposition", "link", "retry-after"}

// packHeaders is how the lean layout keeps response headers: one entry per value, in the
// order of the sorted names, separated by '\n'; an entry is a common name's byte, or the
// name and ':', then the value. Headers that cannot be written so (a name with ':' or a
// byte below 0x20, a value with '\n', which the API refuses anyway) are kept as JSON,
// which begins with '{' where a packed entry never does.
func packHeaders(h map[string][]string) (string, error) {
	if len(h) == 0 {
		return "", nil
	}
	names := make([]string, 0, len(h))
	for name := range h {
		if name == "" || strings.ContainsAny(name, ":{") || hasControl(name) {
			return encodeHeaders(h)
		}
		if len(h[name]) == 0 {
			return encodeHeaders(h)
		}
		for _, v := range h[name] {
			if strings.IndexByte(v, '\n') >= 0 {
				return encodeHeaders(h)
			}
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		code := -1
		for i, common := range commonHeaders[1:] {
			if name == common {
				code = i + 1
			}
		}
		for _, v := range h[name] {
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			if code > 0 {
				b.WriteByte(byte(code))
			} else {
				b.WriteString(name)
				b.WriteByte(':')
			}
			b.WriteString(v)
		}
	}
	return b.String(), nil
}

// unpackHeaders reads headers as packHeaders or an earlier layout (JSON) keeps them.
func unpackHeaders(s string) (map[string][]string, error) {
	if s == "" {
		return nil, nil
	}
	if s[0] == '{' {
		var h map[string][]string
		if err := json.Unmarshal([]byte(s), &h); err != nil {
			return nil, errors.New("stored headers are not valid JSON")
		}
		return h, nil
	}
	h := make(map[string][]string)
	for _, entry := range strings.Split(s, "\n") {
		var name, value string
		if entry != "" && int(entry[0]) < len(commonHeaders) && entry[0] > 0 {
			name, value = commonHeaders[entry[0]], entry[1:]
		} else {
			var ok bool
			if name, value, ok = strings.Cut(entry, ":"); !ok {
				return nil, errors.New("stored headers are malformed")
			}
		}
		h[name] = append(h[name], value)
	}
	return h, nil
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}
