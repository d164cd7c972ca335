package idem

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// BenchmarkSeal measures sealing a result as a client with WithSealing does before
// storing it, and opening it as a replay does: a small JSON answer with two headers,
// and a 10 KiB body. B-added is what sealing adds to the record idemd keeps: the
// envelope less the plain result's header names, values and body.
func BenchmarkSeal(b *testing.B) {
	ring, err := NewKeyRing(SealKey{ID: "k-2026-11", Key: bytes.Repeat([]byte{7}, sealKeyLen)})
	if err != nil {
		b.Fatal(err)
	}
	small := `{"id":"ch_3Q0","amount":4200,"currency":"eur","email":"ada@example.com","status":"succeeded"}`
	for _, bc := range []struct {
		name string
		resp Response
	}{
		{"small", Response{Status: 201,
			Header: http.Header{"content-type": {"application/json"}, "location": {"/orders/1001"}},
			Body:   []byte(small)}},
		{"10KiB", Response{Status: 200,
			Header: http.Header{"content-type": {"application/json"}},
			Body:   []byte(strings.Repeat("x", 10<<10))}},
	} {
		const tenant, key = "payments", "order-1001"
		plain := len(bc.resp.Body)
		for name, values := range bc.resp.Header {
			plain += len(name)
			for _, v := range values {
				plain += len(v)
			}
		}
		env, err := ring.sealResponse(tenant, key, Completed, bc.resp, cryptoRandom)
		if err != nil {
			b.Fatal(err)
		}
		added := float64(len(env) - plain)
		b.Run(bc.name+"/seal", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(plain))
			for b.Loop() {
				if _, err := ring.sealResponse(tenant, key, Completed, bc.resp, cryptoRandom); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(added, "B-added")
		})
		b.Run(bc.name+"/open", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(plain))
			for b.Loop() {
				if _, err := ring.openResponse(tenant, key, Completed, bc.resp.Status, env); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(added, "B-added")
		})
	}
}
