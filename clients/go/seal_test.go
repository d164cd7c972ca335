package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// The tests below seal results and recovery points (WithSealing, docs/sealing.md)
// through a real idemd, and look at what it keeps with plain HTTP.

// sealKey is a key anyone can recompute for id.
func sealKey(id string) idem.SealKey {
	sum := sha256.Sum256([]byte("test key/" + id))
	return idem.SealKey{ID: id, Key: sum[:]}
}

// ring is a key ring of the keys of ids, the first of which seals.
func ring(t *testing.T, ids ...string) *idem.KeyRing {
	t.Helper()
	var keys []idem.SealKey
	for _, id := range ids {
		keys = append(keys, sealKey(id))
	}
	r, err := idem.NewKeyRing(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// sealing is a client of the shared daemon's tenant that seals with r.
func sealing(t *testing.T, r *idem.KeyRing, opts ...idem.Option) *idem.Client {
	t.Helper()
	return newClient(t, append(opts, idem.WithSealing("default", r))...)
}

// stored is a record as idemd answers a lookup, read without the client.
type stored struct {
	State    string `json:"state"`
	Response *struct {
		Status  int                 `json:"status"`
		Headers map[string][]string `json:"headers"`
		Body    []byte              `json:"body"`
		Sealed  []byte              `json:"sealed"`
	} `json:"response"`
	RecoveryPoint *struct {
		Name string `json:"name"`
		Data []byte `json:"data"`
	} `json:"recovery_point"`
	raw []byte
}

// lookUp reads the record of key from idemd over plain HTTP.
func lookUp(t *testing.T, key string) stored {
	t.Helper()
	resp, err := http.Get(daemonURL + "/v1/records/" + url.PathEscape(key))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("lookup of %q: %d %s %v", key, resp.StatusCode, raw, err)
	}
	rec := stored{raw: raw}
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// envelopeKeyID is the key id an envelope names, or "" for what is not one.
func envelopeKeyID(env []byte) string {
	if len(env) < 3 || env[0] != 0xC1 || (env[1] != 1 && env[1] != 2) || len(env) < 3+int(env[2]) {
		return ""
	}
	return string(env[3 : 3+int(env[2])])
}

// sealedAs fails unless what idemd keeps of key is a result of status sealed with
// keyID, holding none of secrets in clear.
func sealedAs(t *testing.T, key string, status int, keyID string, secrets ...string) stored {
	t.Helper()
	rec := lookUp(t, key)
	r := rec.Response
	if r == nil || r.Status != status || r.Headers != nil || r.Body != nil || envelopeKeyID(r.Sealed) != keyID {
		t.Fatalf("idemd keeps %s, want a result of status %d sealed with %q, without headers or body", rec.raw, status, keyID)
	}
	for _, s := range secrets {
		if bytes.Contains(rec.raw, []byte(s)) || bytes.Contains(r.Sealed, []byte(s)) {
			t.Fatalf("idemd keeps %q in clear: %s", s, rec.raw)
		}
	}
	return rec
}

// refusedWith fails unless err is a *SealError of reason naming keyID.
func refusedWith(t *testing.T, what string, err error, reason, keyID string) {
	t.Helper()
	var se *idem.SealError
	if !errors.As(err, &se) || !errors.Is(err, idem.ErrUnsealable) || se.Reason != reason || se.KeyID != keyID {
		t.Fatalf("%s: %v, want a SealError %s naming %q", what, err, reason, keyID)
	}
}

func sameResponse(got *idem.Response, want idem.Response) bool {
	return got != nil && got.Status == want.Status && bytes.Equal(got.Body, want.Body) && reflect.DeepEqual(got.Header, want.Header)
}

func TestParseKeyRing(t *testing.T) {
	b64 := func(id string) string { return base64.StdEncoding.EncodeToString(sealKey(id).Key) }
	for _, tc := range []struct {
		name, text, seals, err string
	}{
		{name: "one key", text: "k1=" + b64("k1"), seals: "k1"},
		{name: "commas, the first seals", text: "k2=" + b64("k2") + ", k1=" + b64("k1"), seals: "k2"},
		{name: "lines, comments and blank lines", text: "# rotated 2026-11\n\nk.new_2 = " + b64("k.new_2") + "\r\n# old\nk-1=" + b64("k-1") + ",\n", seals: "k.new_2"},
		{name: "nothing", text: "# no keys\n\n", err: "at least one key"},
		{name: "no equals sign", text: "k1", err: "not id=base64"},
		{name: "not base64", text: "k1=not base64!", err: "not standard base64"},
		{name: "a short key", text: "k1=" + base64.StdEncoding.EncodeToString(make([]byte, 31)), err: "31 bytes"},
		{name: "a long key", text: "k1=" + base64.StdEncoding.EncodeToString(make([]byte, 33)), err: "33 bytes"},
		{name: "a space in the id", text: "k 1=" + b64("k1"), err: "only letters"},
		{name: "an empty id", text: "=" + b64("k1"), err: "1 to 32"},
		{name: "an id over 32 bytes", text: strings.Repeat("k", 33) + "=" + b64("k1"), err: "1 to 32"},
		{name: "an id twice", text: "k1=" + b64("k1") + ",k1=" + b64("k2"), err: "twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := idem.ParseKeyRing(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseKeyRing: %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil || r.SealingKeyID() != tc.seals {
				t.Fatalf("ParseKeyRing: %v, want a ring that seals with %q", err, tc.seals)
			}
		})
	}
}

func TestNewRefusesSealingWithoutRingOrTenant(t *testing.T) {
	r := ring(t, "k1")
	if _, err := idem.New(daemonURL, idem.WithSealing("", r)); err == nil || !strings.Contains(err.Error(), "tenant") {
		t.Fatalf("New with an empty tenant: %v", err)
	}
	if _, err := idem.New(daemonURL, idem.WithSealing("default", nil)); err == nil || !strings.Contains(err.Error(), "key ring") {
		t.Fatalf("New without a ring: %v", err)
	}
}

// TestSealedRoundTrip: a result completed by a sealing client is kept sealed (its
// status readable, no headers or body, nothing of them in clear), and every client
// whose ring holds the key gets it back exactly, by claim and by lookup. A client
// without a ring, or of another tenant's name, cannot read it. A failure stored by a
// release is sealed alike.
func TestSealedRoundTrip(t *testing.T) {
	ctx := t.Context()
	r := ring(t, "k-2026-11")
	c := sealing(t, r)
	key := freshKey("seal-round-trip")
	want := idem.Response{Status: 201,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/7"}, "X-Multi": {"one", "two"}},
		Body:   []byte(`{"email":"ada@example.com","amount":4200}`)}
	cl, err := c.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp"})
	if err != nil || cl.Outcome != idem.Acquired {
		t.Fatalf("claim: %+v %v", cl, err)
	}
	if err := c.Complete(ctx, key, cl.Token, want); err != nil {
		t.Fatal(err)
	}
	sealedAs(t, key, 201, "k-2026-11", "ada@example.com", "/orders/7", "application/json")

	// Fresh clients, so that nothing comes from a replay cache.
	replay, err := sealing(t, r).Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp"})
	if err != nil || replay.Outcome != idem.Completed || !sameResponse(replay.Response, want) {
		t.Fatalf("the replay: %+v %v, want %+v", replay, err, want)
	}
	rec, err := sealing(t, r).Lookup(ctx, key)
	if err != nil || rec.State != "completed" || !sameResponse(rec.Response, want) {
		t.Fatalf("the lookup: %+v %v", rec, err)
	}

	plain := newClient(t)
	cl, err = plain.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp"})
	refusedWith(t, "a claim without a ring", err, idem.SealUnknownKey, "k-2026-11")
	if cl == nil || cl.Outcome != idem.Completed || cl.Response != nil {
		t.Fatalf("a claim without a ring: %+v, want the completed claim without its response", cl)
	}
	rec, err = plain.Lookup(ctx, key)
	refusedWith(t, "a lookup without a ring", err, idem.SealUnknownKey, "k-2026-11")
	if rec == nil || rec.State != "completed" || rec.Response != nil {
		t.Fatalf("a lookup without a ring: %+v", rec)
	}
	_, err = newClient(t, idem.WithSealing("orders", r)).Claim(ctx, key, idem.ClaimOptions{Fingerprint: "fp"})
	refusedWith(t, "a claim under another tenant's name", err, idem.SealInvalid, "k-2026-11")

	failed := freshKey("seal-failed")
	decline := idem.Response{Status: 402, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("card-4242-declined")}
	cl, err = c.Claim(ctx, failed, idem.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Release(ctx, failed, cl.Token, idem.Fail, &decline); err != nil {
		t.Fatal(err)
	}
	sealedAs(t, failed, 402, "k-2026-11", "card-4242-declined")
	if again, err := sealing(t, r).Claim(ctx, failed, idem.ClaimOptions{}); err != nil || again.Outcome != idem.Failed || !sameResponse(again.Response, decline) {
		t.Fatalf("the failure replayed: %+v %v", again, err)
	}
}

// wire is a transport to the real daemon that keeps every request's path and body,
// and holds the first request until hold is closed.
type wire struct {
	mu       sync.Mutex
	paths    []string
	bodies   [][]byte
	answers  [][]byte
	hold     chan struct{}
	released sync.Once
	first    atomic.Bool
}

func (w *wire) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	if w.first.CompareAndSwap(false, true) {
		<-w.hold
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(answer))
	w.mu.Lock()
	defer w.mu.Unlock()
	w.paths, w.bodies, w.answers = append(w.paths, req.URL.Path), append(w.bodies, body), append(w.answers, answer)
	return resp, nil
}

// batches are the bodies of the batches sent, and their answers.
func (w *wire) batches() (bodies, answers [][]byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, p := range w.paths {
		if p == "/v1/batch" {
			bodies, answers = append(bodies, w.bodies[i]), append(answers, w.answers[i])
		}
	}
	return bodies, answers
}

// TestSealedInBatches: completes and releases gathered into a batch send each result
// as {status, sealed} only, and the claims of a batch whose answers carry sealed
// results open them.
func TestSealedInBatches(t *testing.T) {
	ctx := t.Context()
	r := ring(t, "k1")
	keys := []string{freshKey("seal-batch"), freshKey("seal-batch"), freshKey("seal-batch")}
	results := []idem.Response{
		{Status: 201, Header: http.Header{"Location": {"/a"}}, Body: []byte("secret-a")},
		{Status: 200, Header: http.Header{}, Body: []byte("secret-b")},
		{Status: 409, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"code":"secret-c"}`)},
	}
	var tokens []string
	for _, k := range keys {
		cl, err := newClient(t).Claim(ctx, k, idem.ClaimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, cl.Token)
	}

	// The first call is held, and the calls made meanwhile go out as one batch.
	send := func(w *wire, c *idem.Client, calls ...func() error) {
		t.Helper()
		errs := make(chan error, len(calls))
		go func() { errs <- calls[0]() }()
		testenv.WaitFor(t, 10*time.Second, "the first call to be sent", w.first.Load)
		for i, call := range calls[1:] {
			queue(t, c, i+1, func() { errs <- call() })
		}
		close(w.hold)
		for range calls {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
	w := &wire{hold: make(chan struct{})}
	c := sealing(t, r, idem.WithHTTPClient(&http.Client{Transport: w}))
	send(w, c,
		func() error { return c.Complete(ctx, keys[0], tokens[0], results[0]) },
		func() error { return c.Complete(ctx, keys[1], tokens[1], results[1]) },
		func() error { return c.Release(ctx, keys[2], tokens[2], idem.Fail, &results[2]) },
	)
	bodies, _ := w.batches()
	if len(bodies) != 1 {
		t.Fatalf("%d batches sent, want 1", len(bodies))
	}
	var batch struct {
		Items []map[string]struct {
			Response map[string]json.RawMessage `json:"response"`
		} `json:"items"`
	}
	if err := json.Unmarshal(bodies[0], &batch); err != nil || len(batch.Items) != 2 {
		t.Fatalf("the batch %s: %v, want the two calls held back", bodies[0], err)
	}
	for _, item := range batch.Items {
		for op, call := range item {
			_, hasSealed := call.Response["sealed"]
			if len(call.Response) != 2 || !hasSealed || call.Response["status"] == nil {
				t.Fatalf("a %s in the batch sends the response %v, want status and sealed only", op, call.Response)
			}
		}
	}
	for i, k := range keys {
		sealedAs(t, k, results[i].Status, "k1", "secret")
	}

	w = &wire{hold: make(chan struct{})}
	c = sealing(t, r, idem.WithHTTPClient(&http.Client{Transport: w}))
	claims := make([]*idem.Claim, len(keys))
	claim := func(i int) func() error {
		return func() error {
			cl, err := c.Claim(ctx, keys[i], idem.ClaimOptions{})
			claims[i] = cl
			return err
		}
	}
	send(w, c, claim(0), claim(1), claim(2))
	if _, answers := w.batches(); len(answers) != 1 || !bytes.Contains(answers[0], []byte(`"sealed"`)) {
		t.Fatalf("the claims' batch was answered %q, want sealed results", answers)
	}
	for i, cl := range claims {
		if !sameResponse(cl.Response, results[i]) {
			t.Fatalf("claim %d replays %+v, want %+v", i, cl.Response, results[i])
		}
	}
}

// TestSealingRotation: a result sealed with the old key replays through a ring that
// put a new key first and kept the old one; what the new key seals does not open in a
// ring that lacks it, nor does the old result once the old key is dropped. Do, Once
// and Consume then run nothing.
func TestSealingRotation(t *testing.T) {
	ctx := t.Context()
	old, rotated, dropped := ring(t, "k-old"), ring(t, "k-new", "k-old"), ring(t, "k-new")
	key, newer := freshKey("seal-rotate"), freshKey("seal-rotate")
	first := idem.Response{Status: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte("order one")}
	runs := 0
	work := func(r idem.Response) func(context.Context) (idem.Response, error) {
		return func(context.Context) (idem.Response, error) { runs++; return r, nil }
	}
	if _, err := sealing(t, old).Do(ctx, key, "", work(first)); err != nil {
		t.Fatal(err)
	}
	sealedAs(t, key, 201, "k-old", "order one")

	res, err := sealing(t, rotated).Do(ctx, key, "", work(idem.Response{Status: 500}))
	if err != nil || !res.Replayed || !sameResponse(&res.Response, first) || runs != 1 {
		t.Fatalf("Do through the rotated ring: %+v %v, %d runs; want the replay of the first", res, err, runs)
	}
	if _, err := sealing(t, rotated).Do(ctx, newer, "", work(idem.Response{Status: 200, Body: []byte("order two")})); err != nil {
		t.Fatal(err)
	}
	sealedAs(t, newer, 200, "k-new", "order two")
	_, err = sealing(t, old).Claim(ctx, newer, idem.ClaimOptions{})
	refusedWith(t, "the old ring claiming what the new key sealed", err, idem.SealUnknownKey, "k-new")

	runs = 0
	res, err = sealing(t, dropped).Do(ctx, key, "", work(idem.Response{Status: 200}))
	refusedWith(t, "Do once the old key is dropped", err, idem.SealUnknownKey, "k-old")
	if runs != 0 || !res.Replayed {
		t.Fatalf("Do with a ring that lacks the key: %+v, %d runs; want a replay that does not open and no run", res, runs)
	}
	err = sealing(t, dropped).Once(ctx, key, func(context.Context) error { runs++; return nil })
	refusedWith(t, "Once once the old key is dropped", err, idem.SealUnknownKey, "k-old")
	v := sealing(t, dropped).Consume(ctx, key, func(context.Context) error { runs++; return nil })
	refusedWith(t, "Consume once the old key is dropped", v.Err, idem.SealUnknownKey, "k-old")
	if runs != 0 || v.Ran || v.Action != idem.Requeue {
		t.Fatalf("Consume with a ring that lacks the key: %+v, %d runs; want a requeue without a run", v, runs)
	}
	if rec := lookUp(t, key); rec.State != "completed" {
		t.Fatalf("the key after the refusals: %s", rec.raw)
	}
}

// TestRequireSealedRefusesPlain: a ring that requires sealing refuses a plain result
// and a plain recovery point; a ring that does not passes them through.
func TestRequireSealedRefusesPlain(t *testing.T) {
	ctx := t.Context()
	r := ring(t, "k1")
	strict := sealing(t, r.RequireSealed())
	plain := newClient(t)
	key := freshKey("seal-require")
	want := idem.Response{Status: 200, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("plain")}
	if _, err := plain.Do(ctx, key, "", func(context.Context) (idem.Response, error) { return want, nil }); err != nil {
		t.Fatal(err)
	}
	_, err := strict.Claim(ctx, key, idem.ClaimOptions{})
	refusedWith(t, "a plain result under require sealed", err, idem.SealMissing, "")
	_, err = strict.Lookup(ctx, key)
	refusedWith(t, "a plain result looked up under require sealed", err, idem.SealMissing, "")
	ran := false
	_, err = strict.Do(ctx, key, "", func(context.Context) (idem.Response, error) { ran = true; return want, nil })
	refusedWith(t, "Do of a plain result under require sealed", err, idem.SealMissing, "")
	if ran {
		t.Fatal("Do ran the work of a key that is done")
	}
	if cl, err := sealing(t, r).Claim(ctx, key, idem.ClaimOptions{}); err != nil || !sameResponse(cl.Response, want) {
		t.Fatalf("a ring that allows plain results: %+v %v", cl, err)
	}

	// A plain recovery point, left by a release for a retry.
	pointed := freshKey("seal-require-point")
	_, err = plain.Do(ctx, pointed, "", func(ctx context.Context) (idem.Response, error) {
		l, _ := idem.LeaseFrom(ctx)
		if err := l.Checkpoint(ctx, "charged", []byte("ch_1")); err != nil {
			return idem.Response{}, err
		}
		return idem.Response{}, errors.New("published nothing")
	})
	if err == nil || !strings.Contains(err.Error(), "published nothing") {
		t.Fatalf("the plain holder's Do: %v", err)
	}
	_, err = strict.Do(ctx, pointed, "", func(context.Context) (idem.Response, error) { ran = true; return want, nil })
	refusedWith(t, "Do from a plain point under require sealed", err, idem.SealMissing, "")
	if ran {
		t.Fatal("Do ran from a point that it refused")
	}
	var point *idem.RecoveryPoint
	if _, err := sealing(t, r).Do(ctx, pointed, "", func(ctx context.Context) (idem.Response, error) {
		l, _ := idem.LeaseFrom(ctx)
		point = l.RecoveryPoint
		return want, nil
	}); err != nil || point == nil || point.Name != "charged" || string(point.Data) != "ch_1" {
		t.Fatalf("a ring that allows plain points: %+v %v", point, err)
	}
}

// TestSealedRecoveryPoints: a point recorded by a sealing holder is kept sealed, and
// is opened by the next holder, after a release for a retry and after a takeover, and
// by a completer, which stores its result sealed. A holder without the key runs
// nothing from it: Do gives the key back, a completer leaves it pending.
func TestSealedRecoveryPoints(t *testing.T) {
	ctx := t.Context()
	r := ring(t, "k1")
	data := []byte("charge ch_secret_1\x00\xff")
	pointIs := func(what string, p *idem.RecoveryPoint, name string, data []byte) {
		t.Helper()
		if p == nil || p.Name != name || !bytes.Equal(p.Data, data) {
			t.Fatalf("%s: the point %+v, want %q %q", what, p, name, data)
		}
	}
	sealedPoint := func(key, name string) {
		t.Helper()
		rec := lookUp(t, key)
		p := rec.RecoveryPoint
		if p == nil || p.Name != name || envelopeKeyID(p.Data) != "k1" || bytes.Contains(rec.raw, []byte("ch_secret")) ||
			bytes.Contains(p.Data, []byte("ch_secret")) {
			t.Fatalf("idemd keeps the point %s, want %q sealed with k1", rec.raw, name)
		}
	}

	t.Run("after a retry release", func(t *testing.T) {
		key := freshKey("seal-point-retry")
		_, err := sealing(t, r).Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
			l, _ := idem.LeaseFrom(ctx)
			if err := l.Checkpoint(ctx, "charged", data); err != nil {
				return idem.Response{}, err
			}
			return idem.Response{}, errors.New("the publish failed")
		})
		if err == nil || !strings.Contains(err.Error(), "the publish failed") {
			t.Fatalf("the first Do: %v", err)
		}
		sealedPoint(key, "charged")
		rec, err := sealing(t, r).Lookup(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		pointIs("the lookup", rec.RecoveryPoint, "charged", data)

		ran := false
		_, err = sealing(t, ring(t, "k-other")).Do(ctx, key, "", func(context.Context) (idem.Response, error) { ran = true; return idem.Response{Status: 200}, nil })
		refusedWith(t, "Do without the key", err, idem.SealUnknownKey, "k1")
		if ran {
			t.Fatal("Do without the key ran from a sealed point")
		}
		if rec := lookUp(t, key); rec.State != "released" {
			t.Fatalf("the key after Do without the key: %s, want it released for a retry", rec.raw)
		}

		// A client without a ring cannot tell a sealed point from plain data that starts
		// with the same byte: it hands the data on as it is.
		var raw *idem.RecoveryPoint
		if _, err := newClient(t).Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
			l, _ := idem.LeaseFrom(ctx)
			raw = l.RecoveryPoint
			return idem.Response{}, errors.New("looked only")
		}); err == nil || raw == nil || envelopeKeyID(raw.Data) != "k1" {
			t.Fatalf("Do without a ring: %v, the point %+v, want the envelope as it is", err, raw)
		}

		var point *idem.RecoveryPoint
		if _, err := sealing(t, r).Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
			l, _ := idem.LeaseFrom(ctx)
			point = l.RecoveryPoint
			return idem.Response{Status: 200}, nil
		}); err != nil {
			t.Fatal(err)
		}
		pointIs("the next holder's lease", point, "charged", data)
	})

	t.Run("an empty point under require sealed", func(t *testing.T) {
		key := freshKey("seal-point-empty")
		strict := sealing(t, r.RequireSealed())
		cl, err := strict.Claim(ctx, key, idem.ClaimOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := strict.RecordRecoveryPoint(ctx, key, cl.Token, "started", nil); err != nil {
			t.Fatal(err)
		}
		if rec := lookUp(t, key); rec.RecoveryPoint == nil || envelopeKeyID(rec.RecoveryPoint.Data) != "k1" {
			t.Fatalf("idemd keeps %s, want the empty point sealed", rec.raw)
		}
		rec, err := strict.Lookup(ctx, key)
		if err != nil || rec.RecoveryPoint == nil || rec.RecoveryPoint.Name != "started" || rec.RecoveryPoint.Data != nil {
			t.Fatalf("the lookup: %+v %v, want the point without data", rec, err)
		}
	})

	t.Run("after a takeover, and by a completer", func(t *testing.T) {
		prefix := freshKey("seal-point-completer") + "/"
		taken, left1, left2 := prefix+"taken", prefix+"left-1", prefix+"left-2"
		holder := sealing(t, r)
		for _, k := range []string{taken, left1, left2} {
			cl, err := holder.Claim(ctx, k, idem.ClaimOptions{Lease: 150 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if err := holder.RecordRecoveryPoint(ctx, k, cl.Token, "charged", data); err != nil {
				t.Fatal(err)
			}
			sealedPoint(k, "charged")
		}
		l, _ := takeOver(t, sealing(t, r), taken)
		pointIs("the takeover's lease", l.RecoveryPoint, "charged", data)
		waitAbandoned(t, holder, prefix, left1, left2)

		// Without the key, a completer runs nothing and leaves the keys pending, listed
		// again once its own short lease runs out.
		var mu sync.Mutex
		var failures []error
		handled := 0
		plain := newCompleter(t, sealing(t, ring(t, "k-other")), idem.CompleterOptions{Prefix: prefix, Concurrency: 1, Lease: 150 * time.Millisecond,
			Handler: func(context.Context) (idem.Response, error) { handled++; return idem.Response{Status: 200}, nil },
			OnError: func(_ string, err error) { mu.Lock(); defer mu.Unlock(); failures = append(failures, err) }})
		stats, err := plain.RunOnce(ctx)
		if err != nil || stats.Errors != 2 || handled != 0 || len(failures) != 2 {
			t.Fatalf("a completer without the key: %+v %v, %d handled, errors %v", stats, err, handled, failures)
		}
		for _, f := range failures {
			refusedWith(t, "a completer without the key", f, idem.SealUnknownKey, "k1")
		}
		waitAbandoned(t, holder, prefix, left1, left2)

		seen := map[string]*idem.RecoveryPoint{}
		cp := newCompleter(t, sealing(t, r), idem.CompleterOptions{Prefix: prefix, Concurrency: 1,
			Handler: func(ctx context.Context) (idem.Response, error) {
				l, _ := idem.LeaseFrom(ctx)
				seen[l.Key] = l.RecoveryPoint
				return idem.Response{Status: 201, Header: http.Header{"Location": {"/refunds/ch_secret_1"}}, Body: []byte("refunded ch_secret_1")}, nil
			}})
		stats, err = cp.RunOnce(ctx)
		if err != nil || stats.Finished != 2 {
			t.Fatalf("the completer: %+v %v", stats, err)
		}
		for _, k := range []string{left1, left2} {
			pointIs("the completer's lease of "+k, seen[k], "charged", data)
			sealedAs(t, k, 201, "k1", "ch_secret_1")
			rec, err := sealing(t, r).Lookup(ctx, k)
			if err != nil || rec.Response == nil || string(rec.Response.Body) != "refunded ch_secret_1" {
				t.Fatalf("the completed %s: %+v %v", k, rec, err)
			}
		}
	})
}

// TestMiddlewareSealed: an answer the middleware stores is sealed and replays as
// stored (P1) through every middleware whose ring holds the key; one whose client has
// no ring, or not the key, answers 502 stored_response_unsealable without running the
// handler (P5). The response_not_stored failure of an answer too large to keep is
// sealed too (P4).
func TestMiddlewareSealed(t *testing.T) {
	r := ring(t, "k-mw")
	h := &orders{}
	url := serveWith(t, sealing(t, r), h)
	key := freshKey("mw-sealed")
	first := send(t, url, "POST", key, "application/json", `{"item":"book"}`)
	if first.status != 201 || first.replayed() {
		t.Fatalf("first request: %+v", first)
	}
	sealedAs(t, idem.MiddlewareKey("alice", key), 201, "k-mw", `"user"`, "/orders/1")

	for _, via := range []string{url, serveWith(t, sealing(t, ring(t, "k-next", "k-mw")), h)} {
		again := send(t, via, "POST", key, "application/json", `{"item":"book"}`)
		if again.status != first.status || again.body != first.body || !again.replayed() ||
			again.header.Get("Location") != first.header.Get("Location") || again.header.Get("Content-Type") != first.header.Get("Content-Type") {
			t.Fatalf("the replay differs:\nfirst  %+v\nreplay %+v", first, again)
		}
	}

	for name, c := range map[string]*idem.Client{"without a ring": newClient(t), "without the key": sealing(t, ring(t, "k-other"))} {
		t.Run(name, func(t *testing.T) {
			var inc incidents
			refused := send(t, serveWith(t, c, h, inc.option()), "POST", key, "application/json", `{"item":"book"}`)
			if refused.status != 502 || refused.problemCode() != "stored_response_unsealable" || refused.replayed() {
				t.Fatalf("answer: %+v", refused)
			}
			testenv.WaitFor(t, 10*time.Second, "the replay_unsealable incident", func() bool { return inc.count(idem.IncidentReplayUnsealable) == 1 })
			inc.mu.Lock()
			err := inc.seen[0].Err
			inc.mu.Unlock()
			refusedWith(t, "the incident", err, idem.SealUnknownKey, "k-mw")
			if n := h.runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times", n)
			}
		})
	}

	t.Run("response_not_stored", func(t *testing.T) {
		h := &orders{}
		c := sealing(t, r)
		var inc incidents
		url := serveWith(t, c, h, idem.WithMaxStoredBytes(20), inc.option())
		key := freshKey("mw-sealed-too-large")
		if first := send(t, url, "POST", key, "application/json", `{}`); first.status != 201 {
			t.Fatalf("first request: %+v", first)
		}
		testenv.WaitFor(t, 10*time.Second, "the result_not_stored incident", func() bool { return inc.count(idem.IncidentResultNotStored) == 1 })
		sealedAs(t, idem.MiddlewareKey("alice", key), 409, "k-mw", "response_not_stored")
		again := send(t, serveWith(t, sealing(t, r), h), "POST", key, "application/json", `{}`)
		if again.status != 409 || again.problemCode() != "response_not_stored" || !again.replayed() || h.runs.Load() != 1 {
			t.Fatalf("the replay: %+v, %d runs", again, h.runs.Load())
		}
	})
}

// A sealing client's recovery point made from a lease in a handler behind the
// middleware reaches the next request, which runs the handler from it.
func TestMiddlewareSealedRecoveryPoint(t *testing.T) {
	r := ring(t, "k-mw")
	var mu sync.Mutex
	var points []string
	h := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		l, _ := idem.LeaseFrom(req.Context())
		mu.Lock()
		defer mu.Unlock()
		if l.RecoveryPoint == nil {
			points = append(points, "")
			if err := l.Checkpoint(req.Context(), "charged", []byte("ch_secret_9")); err != nil {
				http.Error(w, err.Error(), http.StatusTeapot)
				return
			}
			http.Error(w, "publish failed", http.StatusServiceUnavailable)
			return
		}
		points = append(points, fmt.Sprintf("%s=%s", l.RecoveryPoint.Name, l.RecoveryPoint.Data))
		w.WriteHeader(http.StatusCreated)
	})
	url := serveWith(t, sealing(t, r), h)
	key := freshKey("mw-sealed-point")
	if first := send(t, url, "POST", key, "application/json", `{}`); first.status != 503 {
		t.Fatalf("first request: %+v", first)
	}
	rec := lookUp(t, idem.MiddlewareKey("alice", key))
	if rec.RecoveryPoint == nil || envelopeKeyID(rec.RecoveryPoint.Data) != "k-mw" || bytes.Contains(rec.raw, []byte("ch_secret")) {
		t.Fatalf("idemd keeps %s, want the point sealed", rec.raw)
	}
	var inc incidents
	if refused := send(t, serveWith(t, sealing(t, ring(t, "k-other")), h, inc.option()), "POST", key, "application/json", `{}`); refused.status != 502 ||
		refused.problemCode() != "stored_response_unsealable" {
		t.Fatalf("a middleware without the key: %+v", refused)
	}
	testenv.WaitFor(t, 10*time.Second, "the replay_unsealable incident", func() bool { return inc.count(idem.IncidentReplayUnsealable) == 1 })
	if second := send(t, url, "POST", key, "application/json", `{}`); second.status != 201 {
		t.Fatalf("second request: %+v", second)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"", "charged=ch_secret_9"}; !reflect.DeepEqual(points, want) {
		t.Fatalf("the handler ran from %q, want %q", points, want)
	}
}

// rewrite plays whoever can write the store: it replaces the record of key by one of
// the same fingerprint finished as finish says ("complete" or "fail") with response
// (nil for none), the envelope of a sealed one copied as it is.
func rewrite(t *testing.T, key, finish string, response map[string]any) {
	t.Helper()
	post := func(path string, body map[string]any) map[string]any {
		t.Helper()
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(daemonURL+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var out map[string]any
		if resp.StatusCode/100 != 2 || json.Unmarshal(raw, &out) != nil {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, raw)
		}
		return out
	}
	var was struct {
		Fingerprint string `json:"fingerprint"`
	}
	if err := json.Unmarshal(lookUp(t, key).raw, &was); err != nil {
		t.Fatal(err)
	}
	if err := newClient(t).Purge(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	claim := map[string]any{"key": key}
	if was.Fingerprint != "" {
		claim["fingerprint"] = was.Fingerprint
	}
	token, _ := post("/v1/claim", claim)["lease_token"].(string)
	req := map[string]any{"key": key, "lease_token": token}
	if response != nil {
		req["response"] = response
	}
	if finish == "fail" {
		req["mode"] = "fail"
		post("/v1/release", req)
	} else {
		post("/v1/complete", req)
	}
}

// TestSealedOutcomeIsBound: a failed result's envelope stored as a completed result
// of the same key and status, or a completed one's as a failure, does not open: the
// envelope binds the outcome.
func TestSealedOutcomeIsBound(t *testing.T) {
	ctx := t.Context()
	r := ring(t, "k1")
	decline := idem.Response{Status: 402, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("declined")}
	made := idem.Response{Status: 201, Body: []byte("order made")}
	for _, tc := range []struct {
		name          string
		stored        func(context.Context) (idem.Response, error)
		status        int
		state, swapTo string
	}{
		{"a failure stored as a success", func(context.Context) (idem.Response, error) {
			return idem.Response{}, idem.Permanent(errors.New("declined"), decline)
		}, 402, "failed", "complete"},
		{"a success stored as a failure", func(context.Context) (idem.Response, error) { return made, nil }, 201, "completed", "fail"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := freshKey("seal-outcome")
			_, _ = sealing(t, r).Do(ctx, key, "", tc.stored)
			env := sealedAs(t, key, tc.status, "k1").Response.Sealed
			rewrite(t, key, tc.swapTo, map[string]any{"status": tc.status, "sealed": env})
			if rec := lookUp(t, key); rec.State == tc.state || !bytes.Equal(rec.Response.Sealed, env) {
				t.Fatalf("the rewritten record: %s", rec.raw)
			}
			for name, c := range map[string]*idem.Client{"require sealed": sealing(t, r.RequireSealed()), "plain allowed": sealing(t, r)} {
				ran := false
				res, err := c.Do(ctx, key, "", func(context.Context) (idem.Response, error) { ran = true; return made, nil })
				refusedWith(t, "Do, "+name, err, idem.SealInvalid, "k1")
				if ran || !res.Replayed || res.Body != nil {
					t.Fatalf("Do, %s: %+v, ran %v; want a refused replay and no run", name, res, ran)
				}
				_, err = c.Lookup(ctx, key)
				refusedWith(t, "Lookup, "+name, err, idem.SealInvalid, "k1")
			}
		})
	}
}

// TestRequireSealedRefusesUnsealedFailure: a sealing client stores a failure without
// a response sealed, which a ring requiring sealing replays as that failure; a
// failure without an envelope put in place of a sealed result is refused as
// not_sealed, by Do, Once, Consume, Lookup and the middleware.
func TestRequireSealedRefusesUnsealedFailure(t *testing.T) {
	ctx := t.Context()
	r := ring(t, "k1")
	strict := sealing(t, r.RequireSealed())

	bare := freshKey("seal-bare-failure")
	cl, err := sealing(t, r).Claim(ctx, bare, idem.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := sealing(t, r).Release(ctx, bare, cl.Token, idem.Fail, nil); err != nil {
		t.Fatal(err)
	}
	sealedAs(t, bare, 500, "k1")
	ran := false
	work := func(context.Context) (idem.Response, error) { ran = true; return idem.Response{Status: 200}, nil }
	res, err := strict.Do(ctx, bare, "", work)
	if !errors.Is(err, idem.ErrFailed) || errors.Is(err, idem.ErrUnsealable) || ran || res.Status != 0 || res.Body != nil {
		t.Fatalf("Do of a sealed failure without a response: %+v %v, ran %v; want ErrFailed without a response", res, err, ran)
	}
	if rec, err := strict.Lookup(ctx, bare); err != nil || rec.State != "failed" || rec.Response != nil {
		t.Fatalf("Lookup of a sealed failure without a response: %+v %v", rec, err)
	}

	key := freshKey("seal-unsealed-failure")
	if _, err := sealing(t, r).Do(ctx, key, "", func(context.Context) (idem.Response, error) {
		return idem.Response{Status: 201, Body: []byte("order made")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	sealedAs(t, key, 201, "k1")
	rewrite(t, key, "fail", nil)
	if rec := lookUp(t, key); rec.State != "failed" || rec.Response != nil {
		t.Fatalf("the rewritten record: %s", rec.raw)
	}
	_, err = strict.Claim(ctx, key, idem.ClaimOptions{})
	refusedWith(t, "Claim", err, idem.SealMissing, "")
	res, err = strict.Do(ctx, key, "", work)
	refusedWith(t, "Do", err, idem.SealMissing, "")
	if ran || !res.Replayed {
		t.Fatalf("Do: %+v, ran %v; want a refused replay and no run", res, ran)
	}
	err = strict.Once(ctx, key, func(context.Context) error { ran = true; return nil })
	refusedWith(t, "Once", err, idem.SealMissing, "")
	v := strict.Consume(ctx, key, func(context.Context) error { ran = true; return nil })
	refusedWith(t, "Consume", v.Err, idem.SealMissing, "")
	if ran || v.Ran || v.Action != idem.Requeue {
		t.Fatalf("Consume: %+v, ran %v; want a requeue without a run", v, ran)
	}
	_, err = strict.Lookup(ctx, key)
	refusedWith(t, "Lookup", err, idem.SealMissing, "")
	if _, err := sealing(t, r).Do(ctx, key, "", work); !errors.Is(err, idem.ErrFailed) || ran {
		t.Fatalf("Do with a ring that allows plain results: %v, ran %v; want the plain failure", err, ran)
	}

	h := &orders{}
	mwKey := freshKey("mw-unsealed-failure")
	url := serveWith(t, sealing(t, r), h)
	if first := send(t, url, "POST", mwKey, "application/json", `{"item":"book"}`); first.status != 201 {
		t.Fatalf("first request: %+v", first)
	}
	rewrite(t, idem.MiddlewareKey("alice", mwKey), "fail", nil)
	var inc incidents
	refused := send(t, serveWith(t, strict, h, inc.option()), "POST", mwKey, "application/json", `{"item":"book"}`)
	if refused.status != 502 || refused.problemCode() != "stored_response_unsealable" || h.runs.Load() != 1 {
		t.Fatalf("the middleware under require sealed: %+v, %d runs", refused, h.runs.Load())
	}
}
