package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/clients/go/internal/testenv"
)

// The examples run against a real idemd at daemonURL (see TestMain); in a service it
// is the address of your idemd, e.g. http://idemd.internal:8080.

func ExampleClient_Claim() {
	ctx := context.Background()
	client, err := idem.New(daemonURL, idem.WithOwner("billing-worker-1"))
	if err != nil {
		panic(err)
	}
	key := freshKey("charge")

	claim, err := client.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "sha256-of-the-payload", Lease: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println("first claim:", claim.Outcome, "attempt", claim.Attempt)

	// Run the operation, then store its result under the lease.
	err = client.Complete(ctx, key, claim.Token, idem.Response{Status: 201, Body: []byte(`{"charge":"ch_1"}`)})
	if err != nil {
		panic(err)
	}

	again, err := client.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "sha256-of-the-payload"})
	if err != nil {
		panic(err)
	}
	fmt.Println("second claim:", again.Outcome, again.Response.Status, string(again.Response.Body))

	_, err = client.Claim(ctx, key, idem.ClaimOptions{Fingerprint: "another-payload"})
	fmt.Println("another payload refused:", errors.Is(err, idem.ErrFingerprintMismatch))
	// Output:
	// first claim: acquired attempt 1
	// second claim: completed 201 {"charge":"ch_1"}
	// another payload refused: true
}

func ExampleClient_Do() {
	ctx := context.Background()
	client, _ := idem.New(daemonURL)
	key := freshKey("send-welcome-email")

	send := func(ctx context.Context) (idem.Response, error) {
		// Send the email here; return what to replay to later callers.
		return idem.Response{Status: 202, Body: []byte("queued")}, nil
	}
	for range 3 {
		res, err := client.Do(ctx, key, "", send)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.Status, string(res.Body), "replayed:", res.Replayed)
	}
	// Output:
	// 202 queued replayed: false
	// 202 queued replayed: true
	// 202 queued replayed: true
}

func ExampleClient_Once() {
	ctx := context.Background()
	client, _ := idem.New(daemonURL)
	// A broker redelivers the same message: derive the key from its stable fields.
	key := idem.MessageKey("orders", "partition-0", freshKey("offset"))

	handled := 0
	for range 2 {
		err := client.Once(ctx, key, func(ctx context.Context) error {
			handled++
			return nil
		})
		if err != nil {
			panic(err) // leave the message for redelivery
		}
	}
	fmt.Println("handled", handled, "time(s)")
	// Output:
	// handled 1 time(s)
}

type userKey struct{}

// authenticate stands for the service's own authentication: it puts the caller's
// user ID in the request's context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.Header.Get("X-Demo-User") // a real service checks a token or a session
		if user == "" {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

func ExampleMiddleware() {
	client, _ := idem.New(daemonURL)
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/42")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":42}`)
	})
	// The scope says whose request it is: here the user that authentication in front of
	// the middleware put in the request's context. Keys are kept per scope, so that one
	// user never gets another's answer.
	scope := idem.WithScope(func(r *http.Request) string {
		user, _ := r.Context().Value(userKey{}).(string)
		return user
	})
	// net/http: wrap the handler. Echo: e.Use(echo.WrapMiddleware(idem.Middleware(client, scope))),
	// then a middleware that renders returned errors with c.Error (see Middleware).
	srv := httptest.NewServer(authenticate(idem.Middleware(client, scope)(createOrder)))
	defer srv.Close()

	key := freshKey("order")
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Demo-User", "user-42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, string(body), "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	// Output:
	// 201 {"id":42} replayed: false
	// 201 {"id":42} replayed: true
}

// The function given to Do finds its lease with LeaseFrom: its attempt fences the
// writes it makes, and Recovered says that a holder whose lease ran out may have made
// them already (docs/effects.md).
func ExampleLeaseFrom() {
	ctx := context.Background()
	client, _ := idem.New(daemonURL)
	key := freshKey("charge:order-42")

	res, err := client.Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
		lease, _ := idem.LeaseFrom(ctx)
		// In one transaction of your database: refuse the write if the key's fence is at
		// lease.Attempt or above, else move it there, look the charge up, and charge.
		fmt.Println("attempt", lease.Attempt, "recovered", lease.Recovered)
		return idem.Response{Status: 201}, nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status)
	// Output:
	// attempt 1 recovered false
	// 201
}

func ExampleLease_Remaining() {
	ctx := context.Background()
	client, _ := idem.New(daemonURL)
	key := freshKey("export-report")

	res, err := client.Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
		lease, _ := idem.LeaseFrom(ctx)
		// A provider that takes a deadline of its own gets the time the lease is known
		// to last, less a margin to store the result: its work then ends while this call
		// still holds the key, rather than after another caller took it over. The
		// context ends at the lease's deadline anyway; the provider cannot see that.
		budget := lease.Remaining() - time.Second
		if budget <= 0 {
			return idem.Response{}, errors.New("too little of the lease left to start")
		}
		fmt.Println("the provider may take at most the lease:", budget < 30*time.Second)
		return idem.Response{Status: 200}, nil
	}, idem.DoOptions{Lease: 30 * time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status)
	// Output:
	// the provider may take at most the lease: true
	// 200
}

// Work that makes an effect it must not make twice records a recovery point right
// after it, with what identifies the effect: should the work fail or its holder die,
// the next run of the key starts from that point instead of making the effect again.
func ExampleLease_Checkpoint() {
	ctx := context.Background()
	client, _ := idem.New(daemonURL)
	key := freshKey("refund:order-42")

	refund := func(ctx context.Context) (idem.Response, error) {
		lease, _ := idem.LeaseFrom(ctx)
		var refundID string
		if p := lease.RecoveryPoint; p != nil && p.Name == "refunded" {
			refundID = string(p.Data) // made by an earlier run: do not refund again
		} else {
			refundID = fmt.Sprintf("re_%d", lease.Attempt) // make the refund at the provider
			if err := lease.Checkpoint(ctx, "refunded", []byte(refundID)); err != nil {
				return idem.Response{}, err
			}
		}
		if lease.Attempt == 1 {
			// A failure after the refund: the key is released for a retry.
			return idem.Response{}, errors.New("the ledger timed out")
		}
		return idem.Response{Status: 200, Body: []byte(refundID)}, nil
	}
	for range 2 {
		res, err := client.Do(ctx, key, "", refund)
		if err != nil {
			fmt.Println("failed:", err)
			continue
		}
		fmt.Println("refund", string(res.Body))
	}
	// Output:
	// failed: the ledger timed out
	// refund re_1
}

// A Completer finishes the work whose holders died: here a refund whose worker
// recorded that the refund was made, then died before storing its result. In a
// service, run it beside the workers with go completer.Run(ctx), and keep the keys of
// one kind of work under one prefix (for the middleware, WithKeyPrefix).
func ExampleCompleter() {
	ctx := context.Background()
	client, _ := idem.New(daemonURL)
	prefix := freshKey("refunds") + "/"
	diedAfterRefunding(client, prefix+"order-7", "re_7")

	completer, err := idem.NewCompleter(client, idem.CompleterOptions{
		Prefix: prefix,
		Handler: func(ctx context.Context) (idem.Response, error) {
			lease, _ := idem.LeaseFrom(ctx)
			if p := lease.RecoveryPoint; p != nil && p.Name == "refunded" {
				// The refund was made: only its result is left to store.
				return idem.Response{Status: 200, Body: p.Data}, nil
			}
			// Nothing was recorded: look the refund up at the provider, or make it.
			return idem.Response{Status: 200, Body: []byte("re_new")}, nil
		},
	})
	if err != nil {
		panic(err)
	}
	stats, err := completer.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Printf("listed %d, finished %d\n", stats.Listed, stats.Finished)

	// The key's own caller, retrying, now gets the stored result.
	res, _ := client.Do(ctx, prefix+"order-7", "", func(ctx context.Context) (idem.Response, error) {
		return idem.Response{}, errors.New("not run: the key is done")
	})
	fmt.Println(string(res.Body), "replayed:", res.Replayed)
	// Output:
	// listed 1, finished 1
	// re_7 replayed: true
}

// diedAfterRefunding stands for a worker that claimed key, recorded that it made the
// refund, and died: it returns once the key's lease has run out, when the
// abandoned-keys feed lists it.
func diedAfterRefunding(client *idem.Client, key, refundID string) {
	ctx := context.Background()
	claim, err := client.Claim(ctx, key, idem.ClaimOptions{Lease: 100 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	if err := client.RecordRecoveryPoint(ctx, key, claim.Token, "refunded", []byte(refundID)); err != nil {
		panic(err)
	}
	err = testenv.Until(30*time.Second, func() error {
		page, err := client.Abandoned(ctx, idem.AbandonedOptions{Prefix: key})
		if err == nil && len(page.Keys) == 0 {
			err = errors.New("not listed yet")
		}
		return err
	})
	if err != nil {
		panic(err)
	}
}

func ExampleWithSealing() {
	ctx := context.Background()
	// In a service the ring comes from a secret store, as IDEMD_SEAL_KEYS or a key file:
	// "k-2026-11=<base64 of 32 random bytes>", the first key sealing.
	ring, err := idem.ParseKeyRing("k-2026-11=89T1OpfRF7vU7+7/NCy983Vqqz7M12Gr28FEz8hSg0g=")
	if err != nil {
		panic(err)
	}
	client, err := idem.New(daemonURL, idem.WithSealing("default", ring))
	if err != nil {
		panic(err)
	}
	key := freshKey("sign-up")
	res, err := client.Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
		return idem.Response{Status: 201, Body: []byte(`{"email":"ada@example.com"}`)}, nil
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, string(res.Body))

	// idemd keeps the status and an envelope it cannot open; this client opens it.
	rec, err := client.Lookup(ctx, key)
	if err != nil {
		panic(err)
	}
	fmt.Println(rec.State, rec.Response.Status, string(rec.Response.Body))

	// A client without the key cannot read it, and runs nothing for the key.
	other, _ := idem.New(daemonURL)
	_, err = other.Do(ctx, key, "", func(ctx context.Context) (idem.Response, error) {
		panic("never runs: the key is done")
	})
	var sealErr *idem.SealError
	if errors.As(err, &sealErr) {
		fmt.Println("without the ring:", sealErr.Reason, sealErr.KeyID)
	}
	// Output:
	// 201 {"email":"ada@example.com"}
	// completed 201 {"email":"ada@example.com"}
	// without the ring: unknown_key k-2026-11
}
