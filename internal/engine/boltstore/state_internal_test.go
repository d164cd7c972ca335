package boltstore

import (
	"encoding/json"
	"testing"

	"github.com/idemd/idemd/internal/engine"
)

// TestDecodeStateAgreesWithJSON: the state read from an encoded record without
// decoding it is the one encoding/json reads, whatever the key, the tenant, the
// headers, the body and the recovery point hold, a moving marker's included.
func TestDecodeStateAgreesWithJSON(t *testing.T) {
	tricky := []string{"plain", `a,"st":"completed"`, `\`, `\\",\"st\":\"failed`, `"st":"x"`, "", "é\u2028<>&"}
	states := []engine.State{engine.StatePending, engine.StateReleased, engine.StateCompleted, engine.StateFailed, "moving"}
	for _, key := range tricky {
		for _, tenant := range tricky[:3] {
			for _, st := range states {
				r := stored{Key: key, Tenant: tenant, State: st, Fingerprint: key, Owner: key, Token: "tok",
					Headers: map[string][]string{"st": {key}, key: {`"st":"completed"`}}, Body: []byte(key),
					PointName: key, PointData: []byte(key), Held: engine.StateCompleted}
				v, err := json.Marshal(&r)
				if err != nil {
					t.Fatal(err)
				}
				got, err := decodeState(v)
				if err != nil {
					t.Fatalf("%s: %v", v, err)
				}
				if got != st {
					t.Fatalf("decodeState(%s) = %q, want %q", v, got, st)
				}
			}
		}
	}
	if _, err := decodeState([]byte(`{"k":"a","t":"b","st":`)); err == nil {
		t.Fatal("a record cut short decoded without an error")
	}
}
