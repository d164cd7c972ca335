package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// sealing.json pins the envelope for every language (clients/testdata/README.md):
// each seal vector is reproduced byte for byte from its fixed salt and nonce and opens
// again, and each refusal fails with its reason. -update-seal-vectors writes the file
// from the cases below, with this package as the reference.
var updateSealVectors = flag.Bool("update-seal-vectors", false, "write clients/testdata/sealing.json")

type sealVectorKey struct {
	ID        string `json:"id"`
	KeyBase64 string `json:"key_base64"`
}

type sealVector struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	Kind    string `json:"kind"`
	// Outcome is a version 2 result's: completed or failed. Version 1 does not bind it.
	Outcome string `json:"outcome,omitempty"`
	// NoResponse marks a failure without a response, sealed as an empty plaintext.
	NoResponse      bool                `json:"no_response,omitempty"`
	Tenant          string              `json:"tenant"`
	Key             string              `json:"key"`
	Status          int                 `json:"status,omitempty"`
	Headers         map[string][]string `json:"headers,omitempty"`
	BodyBase64      *string             `json:"body_base64,omitempty"`
	Point           string              `json:"point,omitempty"`
	DataBase64      *string             `json:"data_base64,omitempty"`
	KeyID           string              `json:"key_id"`
	RandomBase64    string              `json:"random_base64"`
	PlaintextBase64 string              `json:"plaintext_base64"`
	AADBase64       string              `json:"aad_base64"`
	SealedBase64    string              `json:"sealed_base64"`
}

type sealRefusal struct {
	Name         string `json:"name"`
	Kind         string `json:"kind"`
	Outcome      string `json:"outcome,omitempty"`
	Tenant       string `json:"tenant"`
	Key          string `json:"key"`
	Status       int    `json:"status,omitempty"`
	Point        string `json:"point,omitempty"`
	SealedBase64 string `json:"sealed_base64"`
	Error        string `json:"error"`
	KeyID        string `json:"key_id,omitempty"`
}

// sealRingText is a key ring's text form and what every client reads from it: the
// ids in order, the first of which seals, or an error.
type sealRingText struct {
	Name   string   `json:"name"`
	Text   string   `json:"text"`
	KeyIDs []string `json:"key_ids,omitempty"`
	Error  bool     `json:"error,omitempty"`
}

type sealVectorFile struct {
	Description string          `json:"description"`
	Ring        []sealVectorKey `json:"ring"`
	RingTexts   []sealRingText  `json:"ring_texts"`
	Vectors     []sealVector    `json:"vectors"`
	Refusals    []sealRefusal   `json:"refusals"`
}

// derived gives n bytes that anyone can recompute: SHA-256 of a label, repeated.
func derived(label string, n int) []byte {
	var out []byte
	for i := 0; len(out) < n; i++ {
		sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", label, i))
		out = append(out, sum[:]...)
	}
	return out[:n]
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func b64p(b []byte) *string { s := b64(b); return &s }

func (f *sealVectorFile) ring(t *testing.T) *KeyRing {
	t.Helper()
	var keys []SealKey
	for _, k := range f.Ring {
		key, err := base64.StdEncoding.DecodeString(k.KeyBase64)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, SealKey{ID: k.ID, Key: key})
	}
	r, err := NewKeyRing(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ringSealingWith is the file's ring with id first, so that it seals.
func (f *sealVectorFile) ringSealingWith(t *testing.T, id string) *KeyRing {
	t.Helper()
	r := f.ring(t)
	k, ok := r.keys[id]
	if !ok {
		t.Fatalf("no key %q in the ring", id)
	}
	r.sealWith = SealKey{ID: id, Key: k}
	return r
}

func mustB64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (v sealVector) context() sealContext {
	if v.Kind == "recovery_point" {
		return pointContext(v.Tenant, v.Key, v.Point)
	}
	return resultContext(v.Tenant, v.Key, Outcome(v.Outcome), v.Status)
}

func (v sealVector) plaintext(t *testing.T) []byte {
	switch {
	case v.Kind == "recovery_point":
		return mustB64(t, *v.DataBase64)
	case v.NoResponse:
		return []byte{}
	}
	return responsePlaintext(http.Header(v.Headers), mustB64(t, *v.BodyBase64))
}

// openAs opens a vector's envelope as the result of a record whose outcome is
// outcome, and fails unless it gives the vector's response (or none).
func (v sealVector) openAs(t *testing.T, ring *KeyRing, outcome Outcome, env []byte) {
	t.Helper()
	r, err := ring.openResponse(v.Tenant, v.Key, outcome, v.Status, env)
	switch {
	case err != nil:
		t.Fatalf("open as %s: %v", outcome, err)
	case v.NoResponse:
		if r != nil {
			t.Fatalf("open as %s: %+v, want no response", outcome, r)
		}
		return
	case r == nil || r.Status != v.Status || !bytes.Equal(r.Body, mustB64(t, *v.BodyBase64)) ||
		(len(v.Headers) > 0 || len(r.Header) > 0) && !reflect.DeepEqual(map[string][]string(r.Header), v.Headers):
		t.Fatalf("open as %s: %+v", outcome, r)
	}
}

func TestSealVectors(t *testing.T) {
	path := filepath.Join("..", "testdata", "sealing.json")
	if *updateSealVectors {
		writeSealVectors(t, path)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f sealVectorFile
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) == 0 || len(f.Refusals) == 0 || len(f.RingTexts) == 0 {
		t.Fatal("sealing.json has no vectors, refusals or ring texts")
	}
	for _, rt := range f.RingTexts {
		t.Run("ring text/"+rt.Name, func(t *testing.T) {
			r, err := ParseKeyRing(rt.Text)
			if rt.Error {
				if err == nil {
					t.Fatalf("read %q as a ring sealing with %q", rt.Text, r.SealingKeyID())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.SealingKeyID() != rt.KeyIDs[0] || len(r.keys) != len(rt.KeyIDs) {
				t.Fatalf("a ring of %d keys sealing with %q, want %q", len(r.keys), r.SealingKeyID(), rt.KeyIDs)
			}
			for _, id := range rt.KeyIDs {
				if _, ok := r.keys[id]; !ok {
					t.Fatalf("no key %q in the ring", id)
				}
			}
		})
	}
	for _, v := range f.Vectors {
		t.Run(fmt.Sprintf("v%d/%s", v.Version, v.Name), func(t *testing.T) {
			ring := f.ringSealingWith(t, v.KeyID)
			plain := v.plaintext(t)
			if !bytes.Equal(plain, mustB64(t, v.PlaintextBase64)) {
				t.Fatalf("plaintext %x, want %x", plain, mustB64(t, v.PlaintextBase64))
			}
			want := mustB64(t, v.SealedBase64)
			if aad := v.context().aad(want[:3+len(v.KeyID)]); !bytes.Equal(aad, mustB64(t, v.AADBase64)) {
				t.Fatalf("associated data %x, want %x", aad, mustB64(t, v.AADBase64))
			}
			// Clients write the current version only; a version 1 envelope is opened.
			if v.Version == sealVersion {
				var env []byte
				var err error
				random := bytes.NewReader(mustB64(t, v.RandomBase64))
				switch {
				case v.Kind == "recovery_point":
					env, err = ring.sealPoint(v.Tenant, v.Key, v.Point, plain, random)
				case v.NoResponse:
					env, err = ring.sealNoResponse(v.Tenant, v.Key, random)
				default:
					env, err = ring.sealResponse(v.Tenant, v.Key, Outcome(v.Outcome), Response{Status: v.Status, Header: http.Header(v.Headers), Body: mustB64(t, *v.BodyBase64)}, random)
				}
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(env, want) {
					t.Fatalf("sealed %x\nwant   %x", env, want)
				}
			} else if want[1] != byte(v.Version) {
				t.Fatalf("a version %d vector holds an envelope of version %d", v.Version, want[1])
			}
			// Any ring holding the key opens it, whichever key that ring seals with.
			opener := f.ring(t)
			switch {
			case v.Kind == "recovery_point":
				data, err := opener.openPoint(v.Tenant, v.Key, v.Point, want)
				if err != nil || !bytes.Equal(data, plain) {
					t.Fatalf("open: %q %v", data, err)
				}
			case v.Version == sealV1:
				// Version 1 does not bind the outcome: a result opens as either.
				v.openAs(t, opener, Completed, want)
				v.openAs(t, opener, Failed, want)
			default:
				v.openAs(t, opener, Outcome(v.Outcome), want)
			}
		})
	}
	for _, r := range f.Refusals {
		t.Run("refused/"+r.Name, func(t *testing.T) {
			ring := f.ring(t)
			var err error
			if r.Kind == "recovery_point" {
				_, err = ring.openPoint(r.Tenant, r.Key, r.Point, mustB64(t, r.SealedBase64))
			} else {
				_, err = ring.openResponse(r.Tenant, r.Key, Outcome(r.Outcome), r.Status, mustB64(t, r.SealedBase64))
			}
			var se *SealError
			if !errors.As(err, &se) || se.Reason != r.Error || se.KeyID != r.KeyID || !errors.Is(err, ErrUnsealable) {
				t.Fatalf("open: %v, want %s (key id %q)", err, r.Error, r.KeyID)
			}
		})
	}
}

func writeSealVectors(t *testing.T, path string) {
	f := sealVectorFile{
		Description: "Sealed results and recovery points (docs/sealing.md). Every client seals each vector of version 2, the version clients write, from its ring key and random bytes to exactly sealed_base64, and opens it with the whole ring as a result of its outcome or as a recovery point; it opens each vector of version 1, which clients wrote before, as a completed and as a failed result alike (version 1 does not bind the outcome); it fails each refusal with its error and key id (none when key_id is absent); and it reads each ring text into a ring of key_ids, in order, the first sealing, or refuses it when error is true.",
	}
	for _, id := range []string{"k-2026-11", "k-2026-05", "ops.backup_1"} {
		f.Ring = append(f.Ring, sealVectorKey{ID: id, KeyBase64: b64(derived("key/"+id, 32))})
	}
	f.RingTexts = ringTexts(f.Ring)
	resp := func(name, keyID, tenant, key string, outcome Outcome, status int, h map[string][]string, body []byte) sealVector {
		return sealVector{Name: name, Version: sealVersion, Kind: "response", Outcome: string(outcome), Tenant: tenant, Key: key,
			Status: status, Headers: h, BodyBase64: b64p(body), KeyID: keyID}
	}
	point := func(name, keyID, tenant, key, pt string, data []byte) sealVector {
		return sealVector{Name: name, Version: sealVersion, Kind: "recovery_point", Tenant: tenant, Key: key, Point: pt, DataBase64: b64p(data), KeyID: keyID}
	}
	shared := []sealVector{
		resp("a JSON answer", "k-2026-11", "payments", "order-1001", Completed, 201,
			map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/1001"}},
			[]byte(`{"id":"ch_1","amount":4200,"email":"ada@example.com"}`)),
		resp("no headers, no body", "k-2026-11", "default", "k", Completed, 200, nil, []byte{}),
		resp("a 204 keeps its headers", "k-2026-05", "payments", "refund/77", Completed, 204,
			map[string][]string{"Etag": {`"v7"`}}, []byte{}),
		resp("names in byte order, values in order, non-ASCII", "ops.backup_1", "t\u00e9nant", "cl\u00e9-\u96ea", Failed, 422,
			map[string][]string{"x-b": {"2"}, "X-A": {"one", "two", "caf\u00e9"}, "Set-Cookie": {"a=1", "b=2"}},
			[]byte(`{"error":"card declined"}`)),
		resp("a binary body", "k-2026-11", "default", "blob", Completed, 200,
			map[string][]string{"Content-Type": {"application/octet-stream"}}, derived("body", 300)),
		point("a recovery point", "k-2026-11", "payments", "order-1001", "charged", []byte(`{"charge":"ch_1"}`)),
		point("an empty recovery point", "k-2026-05", "default", "k", "started", []byte{}),
	}
	current := append(slices.Clone(shared),
		resp("a failure", "k-2026-11", "payments", "order-1001", Failed, 402,
			map[string][]string{"Content-Type": {"text/plain"}}, []byte("card declined")),
		sealVector{Name: "a failure without a response", Version: sealVersion, Kind: "response", Outcome: string(Failed), NoResponse: true,
			Tenant: "payments", Key: "order-1001", Status: noResponseStatus, KeyID: "k-2026-11"},
		resp("a 304 with a body", "k-2026-05", "default", "etag/1", Completed, 304,
			map[string][]string{"Etag": {`"v1"`}}, []byte("kept")),
	)
	sealed := func(v sealVector, version byte, random []byte) sealVector {
		ring := f.ringSealingWith(t, v.KeyID)
		v.RandomBase64 = b64(random)
		plain := v.plaintext(t)
		v.PlaintextBase64 = b64(plain)
		env, err := ring.sealInPlace(v.context(), append(ring.envelopeOf(version, len(plain)), plain...), bytes.NewReader(random))
		if err != nil {
			t.Fatal(err)
		}
		v.SealedBase64 = b64(env)
		v.AADBase64 = b64(v.context().aad(env[:3+len(v.KeyID)]))
		return v
	}
	for i, v := range current {
		f.Vectors = append(f.Vectors, sealed(v, sealVersion, derived(fmt.Sprintf("random/v2/%d", i), sealSaltLen+sealNonceLen)))
	}
	for i, v := range shared {
		// Version 1's vectors are those of its time, from the same random bytes.
		v.Version, v.Outcome = sealV1, ""
		if v.Kind == "response" {
			v.Outcome = string(Completed)
		}
		v = sealed(v, sealV1, derived(fmt.Sprintf("random/%d", i), sealSaltLen+sealNonceLen))
		v.Outcome = ""
		f.Vectors = append(f.Vectors, v)
	}
	byName := func(version int, name string) sealVector {
		for _, v := range f.Vectors {
			if v.Version == version && v.Name == name {
				return v
			}
		}
		t.Fatalf("no vector %q of version %d", name, version)
		return sealVector{}
	}
	r0, p0 := byName(sealVersion, "a JSON answer"), byName(sealVersion, "a recovery point")
	f0, n0 := byName(sealVersion, "a failure"), byName(sealVersion, "a failure without a response")
	r1 := byName(sealV1, "a JSON answer")
	r1.Outcome = string(Completed)
	env := mustB64(t, r0.SealedBase64)
	changed := func(at int, to byte) string { b := bytes.Clone(env); b[at] = to; return b64(b) }
	flip := func(at int) string { return changed(at, env[at]^1) }
	sealedBy := func(id, label string) string {
		r, err := NewKeyRing(SealKey{ID: id, Key: derived(label, 32)})
		if err != nil {
			t.Fatal(err)
		}
		e, err := r.seal(r0.context(), mustB64(t, r0.PlaintextBase64), bytes.NewReader(derived("random/v2/"+label, 28)))
		if err != nil {
			t.Fatal(err)
		}
		return b64(e)
	}
	refuse := func(name string, v sealVector, sealed, reason, keyID string) sealRefusal {
		return sealRefusal{Name: name, Kind: v.Kind, Outcome: v.Outcome, Tenant: v.Tenant, Key: v.Key, Status: v.Status, Point: v.Point,
			SealedBase64: sealed, Error: reason, KeyID: keyID}
	}
	moved := func(v sealVector, change func(*sealVector)) sealVector { change(&v); return v }
	f.Refusals = []sealRefusal{
		refuse("a key the ring does not hold", r0, sealedBy("k-2025-01", "key/k-2025-01"), SealUnknownKey, "k-2025-01"),
		refuse("other bytes under a ring key's id", r0, sealedBy("k-2026-11", "key/impostor"), SealInvalid, "k-2026-11"),
		refuse("a flipped ciphertext byte", r0, flip(len(env)-20), SealInvalid, "k-2026-11"),
		refuse("a flipped tag byte", r0, flip(len(env)-1), SealInvalid, "k-2026-11"),
		refuse("a flipped salt byte", r0, flip(3+len(r0.KeyID)), SealInvalid, "k-2026-11"),
		refuse("moved to another key", moved(r0, func(v *sealVector) { v.Key = "order-1002" }), r0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("moved to another tenant", moved(r0, func(v *sealVector) { v.Tenant = "orders" }), r0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("its status changed", moved(r0, func(v *sealVector) { v.Status = 200 }), r0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("a failure's envelope as a completed result", moved(f0, func(v *sealVector) { v.Outcome = string(Completed) }), f0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("a completed result's envelope as a failure", moved(r0, func(v *sealVector) { v.Outcome = string(Failed) }), r0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("a failure without a response as a completed result", moved(n0, func(v *sealVector) { v.Outcome = string(Completed) }), n0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("a recovery point under another name", moved(p0, func(v *sealVector) { v.Point = "published" }), p0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("a recovery point's envelope as a result", sealVector{Kind: "response", Outcome: string(Completed), Tenant: p0.Tenant, Key: p0.Key, Status: 200}, p0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("a result's envelope as a recovery point", sealVector{Kind: "recovery_point", Tenant: r0.Tenant, Key: r0.Key, Point: "charged"}, r0.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("its version changed to the previous one", r0, changed(1, sealV1), SealInvalid, "k-2026-11"),
		refuse("a result whose plaintext does not read", r0, func() string {
			// Sealed with a ring key, but one header name and nothing after its count.
			ring := f.ringSealingWith(t, r0.KeyID)
			e, err := ring.seal(r0.context(), []byte{0, 1}, bytes.NewReader(derived("random/v2/unreadable", 28)))
			if err != nil {
				t.Fatal(err)
			}
			return b64(e)
		}(), SealInvalid, "k-2026-11"),
		refuse("the previous version moved to another key", moved(r1, func(v *sealVector) { v.Key = "order-1002" }), r1.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("the previous version with its status changed", moved(r1, func(v *sealVector) { v.Status = 200 }), r1.SealedBase64, SealInvalid, "k-2026-11"),
		refuse("cut short", r0, b64(env[:3+len(r0.KeyID)+sealSaltLen+sealNonceLen+sealTagLen-1]), SealInvalid, ""),
		refuse("a later version", r0, changed(1, sealVersion+1), SealInvalid, ""),
		refuse("not an envelope", r0, b64([]byte(`{"id":"ch_1"}`)), SealInvalid, ""),
	}
	out, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(out, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// ringTexts are the text forms of rings every client reads alike, made of ring's keys.
func ringTexts(ring []sealVectorKey) []sealRingText {
	a, b, c := ring[0], ring[1], ring[2]
	entry := func(k sealVectorKey) string { return k.ID + "=" + k.KeyBase64 }
	ok := func(name, text string, ids ...string) sealRingText {
		return sealRingText{Name: name, Text: text, KeyIDs: ids}
	}
	bad := func(name, text string) sealRingText { return sealRingText{Name: name, Text: text, Error: true} }
	key := a.KeyBase64
	return []sealRingText{
		ok("entries by commas and line feeds, the first sealing", entry(a)+","+entry(b)+"\n"+entry(c), a.ID, b.ID, c.ID),
		ok("CRLF, blank lines, comments, and spaces and tabs around lines, entries, ids and keys",
			"# the ring\r\n\r\n \t"+a.ID+" = "+a.KeyBase64+" ,\r\n# "+entry(c)+"\r\n\t"+b.ID+"\t=\t"+b.KeyBase64+"\t,,\r\n", a.ID, b.ID),
		bad("no key", "# none yet\n\n"),
		bad("a '#' after an entry is not a comment", entry(a)+" # the current key"),
		bad("base64 without its padding", a.ID+"="+strings.TrimRight(key, "=")),
		bad("URL-safe base64", a.ID+"="+strings.NewReplacer("+", "-", "/", "_").Replace(key)),
		bad("base64 whose pad bits are not zero", a.ID+"="+key[:len(key)-2]+string(key[len(key)-2]+1)+"="),
		bad("a space inside the key", a.ID+"="+key[:8]+" "+key[8:]),
		bad("a carriage return inside the key", a.ID+"="+key[:8]+"\r"+key[8:]),
		bad("a lone carriage return does not end a line", entry(a)+"\r"+entry(b)),
		bad("a no-break space is not space", "\u00a0"+entry(a)),
		bad("a key of 31 bytes", a.ID+"="+b64(derived("short", 31))),
		bad("a non-ASCII letter in a key id", "k\u00e9="+key),
		bad("a key id of 33 characters", strings.Repeat("k", 33)+"="+key),
		bad("an empty key id", "="+key),
		bad("an entry without '='", entry(a)+","+b.ID),
		bad("an id given twice", entry(a)+"\n"+a.ID+"="+b.KeyBase64),
	}
}
