package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color/palette"
	"image/draw"
	"image/png"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/input"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	idem "github.com/idemd/idemd/clients/go"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/server"
	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// The browser tests drive Debian's chromium, headless, through the DevTools protocol
// (chromedp). Nothing downloads a browser: without chromium on the machine the tests
// skip, unless IDEMD_REQUIRE_BROWSER is set (as make test sets it), which turns the
// skip into a failure.

// chromium finds the browser, or skips or fails the test.
func chromium(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		path, err = exec.LookPath("/usr/bin/chromium")
	}
	if err != nil {
		if os.Getenv("IDEMD_REQUIRE_BROWSER") != "" {
			t.Fatalf("chromium is required (IDEMD_REQUIRE_BROWSER is set) but not found: %v", err)
		}
		t.Skip("chromium not found; install it (apt-get install -y chromium) to run the console's browser tests")
	}
	return path
}

// startBrowser starts one headless chromium for the test; each subtest opens a tab of
// its own in it (newTab), whose sessionStorage is its own.
func startBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.WindowSize(1100, 760),
		chromedp.UserDataDir(t.TempDir()),
		// /dev/shm is small in containers; chromium falls back to /tmp.
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	if os.Geteuid() == 0 {
		// Chromium refuses to start as root with its sandbox on.
		opts = append(opts, chromedp.NoSandbox)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	browser, cancelBrowser := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
	})
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return browser
}

// pageWatch is installed in every document before the page's own script runs: it keeps
// the Content-Security-Policy violations, which must stay none (an inline script or
// style, a handler attribute in markup, a fetch elsewhere would each make one).
const pageWatch = `window.__cspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__cspViolations.push(e.violatedDirective + ' ' + (e.blockedURI || '') + ' ' + (e.sample || ''));
});`

// openConsole opens a tab at the console, watching it for CSP violations until the
// test ends.
func openConsole(t *testing.T, browser context.Context, d *authDaemon) context.Context {
	t.Helper()
	return openConsoleAt(t, browser, d, "")
}

// openConsoleAt opens a tab at the console's view that fragment names ("" for the
// page as the console opens it).
func openConsoleAt(t *testing.T, browser context.Context, d *authDaemon, fragment string) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	// A bound on the whole subtest, so that a page that never shows what the test
	// waits for fails the test instead of hanging it.
	ctx, cancelTimeout := context.WithTimeout(ctx, wait.Scale(2*time.Minute))
	t.Cleanup(cancelTimeout)
	run(t, ctx, chromedp.Func(func(ctx context.Context, target *chromedp.Target) error {
		_, err := cdp.Call(ctx, target, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: pageWatch})
		return err
	}), chromedp.Navigate(d.url+"/console/"+fragment))
	t.Cleanup(func() {
		violations, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__cspViolations`))
		if err != nil {
			t.Errorf("reading the CSP violations: %v", err)
		}
		if len(violations) > 0 {
			t.Errorf("the page broke its Content-Security-Policy: %q", violations)
		}
	})
	return ctx
}

// tab opens a tab at the console's key inspector, signed in with token ("" when the
// daemon is open).
func tab(t *testing.T, browser context.Context, d *authDaemon, token string) context.Context {
	t.Helper()
	ctx := openConsoleAt(t, browser, d, "#/records")
	if token != "" {
		run(t, ctx,
			chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), token),
			chromedp.Click(chromedp.CSS("#signin-submit")),
		)
	}
	run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#tabs")))
	return ctx
}

func run(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatal(err)
	}
}

// eval evaluates a JavaScript expression in the page, awaiting it when it is a promise.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	out, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return out
}

// js quotes s as a JavaScript string.
func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func textOf(t *testing.T, ctx context.Context, selector string) string {
	t.Helper()
	// One evaluation reads the text, so that a view redrawn meanwhile cannot take the
	// element away between finding it and reading it.
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(`+js(selector)+`).textContent`))
	if err != nil {
		t.Fatalf("the text of %s: %v", selector, err)
	}
	return s
}

// waitFor polls a JavaScript condition in the page until it holds.
func waitFor(t *testing.T, ctx context.Context, condition string) {
	t.Helper()
	// No timeout of the poll's own: the tab's context bounds the wait.
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](condition, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(0))); err != nil {
		t.Fatalf("waiting for %s: %v", condition, err)
	}
}

// screenshot takes the whole page as a PNG. With IDEMD_CONSOLE_SCREENSHOTS set to a
// directory (docs/console, from the repository's root), it is kept there for the docs.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("screenshot %s is not a PNG: %v", name, err)
	}
	dir := os.Getenv("IDEMD_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	// The page's few colours fit a fixed palette, which makes the file about a quarter
	// of the browser's.
	paletted := image.NewPaletted(img.Bounds(), palette.Plan9)
	draw.Draw(paletted, paletted.Rect, img, img.Bounds().Min, draw.Src)
	var small bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&small, paletted); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), small.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// seeder makes records through the API, as clients would.
type seeder struct {
	t *testing.T
	d *authDaemon
}

func (s seeder) claim(token, key string, fields map[string]any) string {
	s.t.Helper()
	body := map[string]any{"key": key}
	for k, v := range fields {
		body[k] = v
	}
	a := s.d.call(token, http.MethodPost, "/v1/claim", body)
	expectStatus(s.t, "claim "+key, a, http.StatusCreated, "")
	return a.str("lease_token")
}

func (s seeder) complete(token, key, lease string, status int, headers map[string][]string, body []byte) {
	s.t.Helper()
	response := map[string]any{"status": status}
	if headers != nil {
		response["headers"] = headers
	}
	if body != nil {
		response["body"] = body
	}
	a := s.d.call(token, http.MethodPost, "/v1/complete", map[string]any{"key": key, "lease_token": lease, "response": response})
	expectStatus(s.t, "complete "+key, a, http.StatusOK, "")
}

func (s seeder) point(token, key, lease, name string, data []byte) {
	s.t.Helper()
	req := map[string]any{"key": key, "lease_token": lease, "name": name}
	if data != nil {
		req["data"] = data
	}
	a := s.d.call(token, http.MethodPost, "/v1/recovery-point", req)
	expectStatus(s.t, "recovery point "+key, a, http.StatusOK, "")
}

// abandoned waits until tenant's feed (as token sees it) lists n keys under prefix.
func (s seeder) abandoned(token, prefix string, n int) {
	s.t.Helper()
	wait.For(s.t, 30*time.Second, fmt.Sprintf("%d abandoned keys under %q", n, prefix), func() bool {
		a := s.d.call(token, http.MethodGet, query("/v1/abandoned", "prefix", prefix, "limit", "1000"), nil)
		keys, _ := a.body["keys"].([]any)
		return len(keys) == n
	})
}

// Hostile data: each would run a script, or set the title, if the page ever turned it
// into markup.
const (
	xssKey   = `<img src=x onerror="window.__xss=1;document.title='pwned'">"><script>window.__xss=2</script>`
	xssOwner = `"><img src=x onerror=window.__xss=3><svg onload=window.__xss=4>`
	xssValue = `<script>window.__xss=5</script>"><img src=x onerror=window.__xss=6>`
	xssBody  = `<html><script>window.__xss=7;document.title='pwned'</script><img src=x onerror=window.__xss=8></html>`
	xssPoint = `<b onmouseover=window.__xss=9>charged</b>`
)

// TestConsoleInBrowser drives the console in a real chromium against a real idemd:
// signing in, the key inspector (a key as given and a middleware's key), the lease's
// countdown, purging as an admin and being refused without admin, a platform token
// choosing another tenant, the abandoned-keys feed with its filter and pages, traffic
// charts moving under claims, the store view, and hostile data shown as text.
func TestConsoleInBrowser(t *testing.T) {
	browser := startBrowser(t)
	d := newConsoleDaemon(t, consoleStore(t), false, server.StoreInfo{Kind: "embedded", Layout: "bbolt", Location: "/var/lib/idemd/idemd.db"})
	seed := seeder{t, d}

	t.Run("signing in", func(t *testing.T) {
		ctx := openConsole(t, browser, d)
		run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#signin-form")))
		screenshot(t, ctx, "signin")
		run(t, ctx, chromedp.SendKeys(chromedp.CSS("#token"), "not-a-token"), chromedp.Click(chromedp.CSS("#signin-submit")))
		waitFor(t, ctx, `document.getElementById('signin-error').textContent.includes('does not know this token')`)
		if stored := eval[any](t, ctx, `sessionStorage.getItem('idemd-console-token')`); stored != nil {
			t.Errorf("a refused token was kept: %v", stored)
		}
		// The console opens on the tenants' overview, and says so in its URL.
		run(t, ctx, chromedp.SendKeys(chromedp.CSS("#token"), alphaUse), chromedp.Click(chromedp.CSS("#signin-submit")),
			chromedp.WaitVisible(chromedp.CSS("#view-overview")))
		if got := eval[string](t, ctx, `location.hash`); got != "#/overview" {
			t.Errorf("the default view's URL ends in %q, want #/overview", got)
		}
		if got := textOf(t, ctx, "#tenant-name"); got != "alpha" {
			t.Errorf("signed in to tenant %q", got)
		}
		if cookies := eval[string](t, ctx, `document.cookie`); cookies != "" {
			t.Errorf("the console set cookies: %q", cookies)
		}
		if stored := eval[string](t, ctx, `sessionStorage.getItem('idemd-console-token')`); stored != alphaUse {
			t.Errorf("sessionStorage holds %q", stored)
		}
		run(t, ctx, chromedp.Click(chromedp.CSS("#sign-out")), chromedp.WaitVisible(chromedp.CSS("#signin-form")))
		if stored := eval[any](t, ctx, `sessionStorage.getItem('idemd-console-token')`); stored != nil {
			t.Errorf("signing out left the token: %v", stored)
		}
	})

	t.Run("inspecting a key and its countdown", func(t *testing.T) {
		lease := seed.claim(alphaAdmin, "order-42", map[string]any{"owner": "checkout-7", "lease_ms": 90000, "fingerprint": "sha256:5f2c"})
		seed.point(alphaAdmin, "order-42", lease, "charged", []byte(`{"charge":"ch_1NirD8"}`))
		ctx := tab(t, browser, d, alphaUse)
		run(t, ctx,
			chromedp.SendKeys(chromedp.CSS("#key"), "order-42"),
			chromedp.Click(chromedp.CSS("#lookup")),
			chromedp.WaitVisible(chromedp.CSS("#record")))
		for sel, want := range map[string]string{
			"#f-key": "order-42", "#f-tenant": "alpha", "#f-state": "pending", "#f-attempt": "1",
			"#f-owner": "checkout-7", "#f-fingerprint": "sha256:5f2c", "#f-point-name": "charged",
			"#f-point-data": `{"charge":"ch_1NirD8"}`, "#f-recovered": "no",
		} {
			if got := textOf(t, ctx, sel); got != want {
				t.Errorf("%s shows %q, want %q", sel, got, want)
			}
		}
		first := textOf(t, ctx, "#f-lease .live")
		if !strings.HasPrefix(first, "in ") {
			t.Errorf("the lease countdown reads %q", first)
		}
		// The countdown runs: its text changes as the lease's time passes.
		waitFor(t, ctx, `document.querySelector('#f-lease .live').textContent !== `+js(first))
		screenshot(t, ctx, "inspector")

		// A body that is not text is shown in hex.
		lease = seed.claim(alphaAdmin, "thumbnail-3", nil)
		seed.complete(alphaAdmin, "thumbnail-3", lease, 200, map[string][]string{"content-type": {"image/png"}}, []byte{0x89, 'P', 'N', 'G', 0, 0xff, '<'})
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#key"), "thumbnail-3"), chromedp.Click(chromedp.CSS("#lookup")))
		waitFor(t, ctx, `document.getElementById('f-key') && document.getElementById('f-key').textContent === 'thumbnail-3'`)
		if got := textOf(t, ctx, "#f-body"); got != "000000  89 50 4e 47 00 ff 3c" {
			t.Errorf("a binary body shows %q", got)
		}
	})

	t.Run("a sealed result and recovery point", func(t *testing.T) {
		// The envelopes' heads are what the console reads; it holds no key to open them.
		lease := seed.claim(alphaAdmin, "receipt-9", nil)
		a := d.call(alphaAdmin, http.MethodPost, "/v1/complete", map[string]any{"key": "receipt-9", "lease_token": lease,
			"response": map[string]any{"status": 201, "sealed": envelope(1, "k-2026-11", 60)}})
		expectStatus(t, "complete sealed", a, http.StatusOK, "")
		lease = seed.claim(alphaAdmin, "refund-5", map[string]any{"lease_ms": 90000})
		seed.point(alphaAdmin, "refund-5", lease, "refunded", envelope(1, "k-2026-05", 50))
		ctx := tab(t, browser, d, alphaUse)
		run(t, ctx, chromedp.SendKeys(chromedp.CSS("#key"), "receipt-9"), chromedp.Click(chromedp.CSS("#lookup")),
			chromedp.WaitVisible(chromedp.CSS("#record")))
		if got := textOf(t, ctx, "#f-sealed"); !strings.HasPrefix(got, "sealed by its client with key k-2026-11 (envelope version 1), 72 bytes") {
			t.Errorf("a sealed result shows %q", got)
		}
		if eval[bool](t, ctx, `document.getElementById('f-body') !== null || document.getElementById('f-headers') !== null`) {
			t.Error("a sealed result is shown with a body or headers")
		}
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#key"), "refund-5"), chromedp.Click(chromedp.CSS("#lookup")))
		waitFor(t, ctx, `document.getElementById('f-key') && document.getElementById('f-key').textContent === 'refund-5'`)
		if got := textOf(t, ctx, "#f-point-sealed"); !strings.HasPrefix(got, "sealed by its client with key k-2026-05") {
			t.Errorf("a sealed recovery point shows %q", got)
		}
		// Data that starts with the envelope's marker, and is no envelope, is data.
		lease = seed.claim(alphaAdmin, "refund-6", map[string]any{"lease_ms": 90000})
		seed.point(alphaAdmin, "refund-6", lease, "refunded", []byte{0xC1, 1, 2, 'k', '1', 0})
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#key"), "refund-6"), chromedp.Click(chromedp.CSS("#lookup")))
		waitFor(t, ctx, `document.getElementById('f-key') && document.getElementById('f-key').textContent === 'refund-6'`)
		if eval[bool](t, ctx, `document.getElementById('f-point-sealed') !== null`) {
			t.Errorf("data that merely starts with 0xC1 shows as sealed: %q", textOf(t, ctx, "#f-point-sealed"))
		}
		if got := eval[string](t, ctx, `(document.getElementById('f-point-data') || {}).textContent || ''`); got != "000000  c1 01 02 6b 31 00" {
			t.Errorf("the point's data shows %q, want it in hex", got)
		}
	})

	t.Run("a middleware's key", func(t *testing.T) {
		key := "payments:" + idem.MiddlewareKey("user-42", "checkout-2026-05-01")
		lease := seed.claim(alphaAdmin, key, map[string]any{"owner": "payments-api"})
		seed.complete(alphaAdmin, key, lease, 201, map[string][]string{"content-type": {"application/json"}, "location": {"/orders/981"}},
			[]byte(`{"order":981,"status":"paid"}`))
		ctx := tab(t, browser, d, alphaUse)
		run(t, ctx,
			chromedp.Click(chromedp.CSS("#mode-middleware")),
			chromedp.WaitVisible(chromedp.CSS("#scope")),
			chromedp.SendKeys(chromedp.CSS("#scope"), "user-42"),
			chromedp.SendKeys(chromedp.CSS("#idem-key"), "checkout-2026-05-01"),
			chromedp.SendKeys(chromedp.CSS("#prefix"), "payments:"),
			chromedp.Click(chromedp.CSS("#lookup")),
			chromedp.WaitVisible(chromedp.CSS("#record")))
		for sel, want := range map[string]string{
			"#f-key": key, "#f-state": "completed", "#f-status": "201", "#f-body": `{"order":981,"status":"paid"}`,
			"#f-lease": "no lease: the key is finished",
		} {
			if got := textOf(t, ctx, sel); got != want {
				t.Errorf("%s shows %q, want %q", sel, got, want)
			}
		}
		if got := textOf(t, ctx, "#f-derived"); !strings.Contains(got, "user-42") || !strings.Contains(got, "payments:") {
			t.Errorf("derived from: %q", got)
		}
		if got := textOf(t, ctx, "#f-headers"); !strings.Contains(got, "location/orders/981") {
			t.Errorf("headers: %q", got)
		}
		screenshot(t, ctx, "middleware-key")
	})

	t.Run("purging as an admin", func(t *testing.T) {
		seed.claim(alphaAdmin, "refund/77", map[string]any{"owner": "refunds"})
		ctx := tab(t, browser, d, alphaAdmin)
		run(t, ctx,
			chromedp.SendKeys(chromedp.CSS("#key"), "refund/77"),
			chromedp.Click(chromedp.CSS("#lookup")),
			chromedp.WaitVisible(chromedp.CSS("#record")),
			chromedp.Click(chromedp.CSS("#purge")),
			chromedp.WaitVisible(chromedp.CSS("#purge-confirm")))
		if got := textOf(t, ctx, "#purge-key"); got != "refund/77" {
			t.Errorf("the confirmation names %q", got)
		}
		// Cancelling purges nothing.
		run(t, ctx, chromedp.Click(chromedp.CSS("#purge-no")), chromedp.WaitNotVisible(chromedp.CSS("#purge-confirm")))
		expectStatus(t, "after cancel", d.call(alphaUse, http.MethodGet, recordPath("refund/77"), nil), http.StatusOK, "")
		run(t, ctx,
			chromedp.Click(chromedp.CSS("#purge")),
			chromedp.WaitVisible(chromedp.CSS("#purge-confirm")),
			chromedp.Click(chromedp.CSS("#purge-yes")))
		waitFor(t, ctx, `document.getElementById('purge-result').textContent.startsWith('Purged')`)
		expectStatus(t, "after purge", d.call(alphaUse, http.MethodGet, recordPath("refund/77"), nil), http.StatusNotFound, "not_found")
		if !strings.Contains(d.logs.String(), `"msg":"record purged","tenant":"alpha","key":"refund/77","token":"alpha-ops","token_tenant":"alpha","via":"console"`) {
			t.Errorf("the purge was not logged with who did it:\n%s", d.logs.String())
		}
	})

	t.Run("purging keys a URL's path would change", func(t *testing.T) {
		// A browser resolves dot segments in a URL's path, encoded or not, and keeps
		// '?' and '#' for the query and the fragment: each of these keys, put in a path,
		// would name another resource. Both stores, since each keeps keys its own way.
		keys := []string{".", "..", "a/../b", "%2e%2e", "./", "x/.", "?#"}
		r := testredis.Start(t)
		for _, store := range []struct {
			name string
			d    *authDaemon
		}{
			{"embedded", d},
			{"redis", newConsoleDaemon(t, redisStoreFor(t, r), false, server.StoreInfo{Kind: "redis"})},
		} {
			ss := seeder{t, store.d}
			ctx := tab(t, browser, store.d, alphaAdmin)
			for _, key := range keys {
				ss.claim(alphaAdmin, key, map[string]any{"owner": "dots"})
				run(t, ctx, chromedp.SetValue(chromedp.CSS("#key"), key), chromedp.Click(chromedp.CSS("#lookup")))
				waitFor(t, ctx, `!document.getElementById('record').hidden && document.getElementById('f-key').textContent === `+js(key))
				run(t, ctx, chromedp.Click(chromedp.CSS("#purge")), chromedp.WaitVisible(chromedp.CSS("#purge-confirm")),
					chromedp.Click(chromedp.CSS("#purge-yes")))
				waitFor(t, ctx, `document.getElementById('purge-result').textContent !== ''`)
				if got := textOf(t, ctx, "#purge-result"); !strings.HasPrefix(got, "Purged") {
					t.Errorf("%s: purging %q: %s", store.name, key, got)
				}
				expectStatus(t, store.name+": "+key+" after its purge",
					store.d.call(alphaUse, http.MethodGet, query("/console/api/records", "key", key), nil), http.StatusNotFound, "not_found")
				eval[bool](t, ctx, `(document.getElementById('purge-result').textContent = '') === ''`)
			}
		}
	})

	t.Run("refused without admin or platform", func(t *testing.T) {
		seed.claim(alphaAdmin, "order-43", nil)
		seed.claim(betaUse, "beta-secret", nil)
		ctx := tab(t, browser, d, alphaUse)
		run(t, ctx,
			chromedp.SendKeys(chromedp.CSS("#key"), "order-43"),
			chromedp.Click(chromedp.CSS("#lookup")),
			chromedp.WaitVisible(chromedp.CSS("#record")))
		if !eval[bool](t, ctx, `document.getElementById('purge').disabled`) {
			t.Error("the purge button is enabled for a token without admin")
		}
		if got := textOf(t, ctx, "#purge-note"); !strings.Contains(got, "admin scope") {
			t.Errorf("purge note: %q", got)
		}
		if eval[bool](t, ctx, `!document.getElementById('tenant').hidden`) {
			t.Error("a token without platform is offered a choice of tenants")
		}
		// What the page calls, called from the page with its token: refused.
		call := func(method, path string) int {
			return eval[int](t, ctx, `fetch(`+js(path)+`, {method: `+js(method)+`, headers: {Authorization: 'Bearer ' + sessionStorage.getItem('idemd-console-token')}}).then((r) => r.status)`)
		}
		for _, c := range []struct {
			method, path string
			status       int
		}{
			{"DELETE", recordPath("order-43"), 403},
			{"DELETE", query("/console/api/records", "key", "order-43"), 403},
			{"GET", query("/console/api/records", "tenant", "beta", "key", "beta-secret"), 403},
			{"GET", query("/console/api/abandoned", "tenant", "beta"), 403},
			{"GET", query("/console/api/traffic", "tenant", "beta"), 403},
			{"GET", recordPath("beta-secret"), 404},
		} {
			if got := call(c.method, c.path); got != c.status {
				t.Errorf("%s %s from the page: %d, want %d", c.method, c.path, got, c.status)
			}
		}
		expectStatus(t, "order-43 after the refusals", d.call(alphaUse, http.MethodGet, recordPath("order-43"), nil), http.StatusOK, "")
	})

	t.Run("a platform admin in another tenant", func(t *testing.T) {
		seed.claim(betaUse, "invoice-5", map[string]any{"owner": "billing"})
		ctx := tab(t, browser, d, platformAdmin)
		waitFor(t, ctx, `!document.getElementById('tenant').hidden && document.getElementById('tenant').options.length === 3`)
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#tenant"), "beta"))
		eval[bool](t, ctx, `document.getElementById('tenant').dispatchEvent(new Event('change'))`)
		run(t, ctx,
			chromedp.SendKeys(chromedp.CSS("#key"), "invoice-5"),
			chromedp.Click(chromedp.CSS("#lookup")),
			chromedp.WaitVisible(chromedp.CSS("#record")))
		if got := textOf(t, ctx, "#f-tenant"); got != "beta" {
			t.Errorf("tenant %q", got)
		}
		run(t, ctx,
			chromedp.Click(chromedp.CSS("#purge")),
			chromedp.WaitVisible(chromedp.CSS("#purge-confirm")),
			chromedp.Click(chromedp.CSS("#purge-yes")))
		waitFor(t, ctx, `document.getElementById('purge-result').textContent.startsWith('Purged')`)
		expectStatus(t, "beta's invoice-5", d.call(betaUse, http.MethodGet, recordPath("invoice-5"), nil), http.StatusNotFound, "not_found")
		if !strings.Contains(d.logs.String(), `"msg":"record purged","tenant":"beta","key":"invoice-5","token":"platform-oncall","token_tenant":"ops","via":"console"`) {
			t.Errorf("the purge was not logged with who did it:\n%s", d.logs.String())
		}
	})

	t.Run("the abandoned-keys feed", func(t *testing.T) {
		// 55 keys of one job, more than a page of 50, and two of another, whose leases
		// run out at once.
		for i := range 55 {
			lease := seed.claim(alphaAdmin, fmt.Sprintf("job-%02d", i), map[string]any{"lease_ms": 100, "owner": "worker-" + strconv.Itoa(i%3), "fingerprint": "sha256:9e1d"})
			if i%10 == 0 {
				seed.point(alphaAdmin, fmt.Sprintf("job-%02d", i), lease, "step-2", nil)
			}
		}
		seed.claim(alphaAdmin, "mail-1", map[string]any{"lease_ms": 100, "owner": "mailer"})
		seed.claim(alphaAdmin, "mail-2", map[string]any{"lease_ms": 100, "owner": "mailer"})
		seed.abandoned(alphaUse, "job-", 55)
		seed.abandoned(alphaUse, "mail-", 2)

		ctx := tab(t, browser, d, alphaUse)
		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-abandoned")), chromedp.WaitVisible(chromedp.CSS("#view-abandoned")),
			chromedp.SendKeys(chromedp.CSS("#abandoned-prefix"), "job-"), chromedp.Click(chromedp.CSS("#abandoned-filter")))
		waitFor(t, ctx, `document.getElementById('abandoned-table').dataset.prefix === 'job-' && document.querySelectorAll('#abandoned-rows tr').length === 50 && !document.getElementById('abandoned-next').hidden`)
		if got := textOf(t, ctx, "#abandoned-rows tr:first-child td:first-child"); got != "job-00" {
			t.Errorf("the first row's key: %q", got)
		}
		if got := textOf(t, ctx, "#abandoned-rows tr:first-child td:nth-child(7)"); got != "step-2" {
			t.Errorf("the first row's recovery point: %q", got)
		}
		since := textOf(t, ctx, "#abandoned-rows tr:first-child .live")
		waitFor(t, ctx, `document.querySelector('#abandoned-rows tr:first-child .live').textContent !== `+js(since))
		run(t, ctx, chromedp.Click(chromedp.CSS("#abandoned-next")))
		waitFor(t, ctx, `document.querySelectorAll('#abandoned-rows tr').length === 5 && document.getElementById('abandoned-next').hidden`)
		if got := textOf(t, ctx, "#abandoned-rows tr:first-child td:first-child"); got != "job-50" {
			t.Errorf("the second page's first key: %q", got)
		}
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#abandoned-prefix"), "mail-"), chromedp.Click(chromedp.CSS("#abandoned-filter")))
		waitFor(t, ctx, `document.getElementById('abandoned-table').dataset.prefix === 'mail-' && document.querySelectorAll('#abandoned-rows tr').length === 2`)
		screenshot(t, ctx, "abandoned")
		// Inspect opens the key.
		run(t, ctx, chromedp.Click(chromedp.CSS("#abandoned-rows tr:first-child button")), chromedp.WaitVisible(chromedp.CSS("#record")))
		if got := textOf(t, ctx, "#f-key"); got != "mail-1" {
			t.Errorf("inspected %q", got)
		}
		if got := textOf(t, ctx, "#f-lease .live"); !strings.HasPrefix(got, "ran out ") {
			t.Errorf("an abandoned key's lease reads %q", got)
		}
	})

	t.Run("a feed whose first pages are empty", func(t *testing.T) {
		// A page of the feed reads at most 10,000 pending keys: behind that many live
		// leases, the first page is empty and has a cursor, and the abandoned key is on
		// the next. The ops tenant holds nothing else.
		const live = 10000
		for i := 0; i < live; i += server.MaxBatchItems {
			var items []any
			for j := i; j < min(i+server.MaxBatchItems, live); j++ {
				items = append(items, map[string]any{"claim": map[string]any{"key": fmt.Sprintf("scan-a-%05d", j), "lease_ms": 600000}})
			}
			expectStatus(t, "a batch of live claims", d.call(platformAdmin, http.MethodPost, "/v1/batch", map[string]any{"items": items}), http.StatusOK, "")
		}
		seed.claim(platformAdmin, "scan-z", map[string]any{"lease_ms": 100, "owner": "behind-the-live"})
		first := d.call(platformAdmin, http.MethodGet, query("/v1/abandoned", "prefix", "scan-", "limit", "50"), nil)
		if keys, _ := first.body["keys"].([]any); len(keys) != 0 || first.str("next_cursor") == "" {
			t.Fatalf("the first page is not empty with a cursor, so this tests nothing: %s", first.raw)
		}
		seed.abandoned(platformAdmin, "scan-z", 1)

		ctx := tab(t, browser, d, platformAdmin)
		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-abandoned")), chromedp.WaitVisible(chromedp.CSS("#view-abandoned")),
			chromedp.SendKeys(chromedp.CSS("#abandoned-prefix"), "scan-"), chromedp.Click(chromedp.CSS("#abandoned-filter")))
		waitFor(t, ctx, `document.getElementById('abandoned-table').dataset.prefix === 'scan-' && `+
			`(document.querySelectorAll('#abandoned-rows tr').length > 0 || !document.getElementById('abandoned-empty').hidden)`)
		if !eval[bool](t, ctx, `document.getElementById('abandoned-empty').hidden`) {
			t.Errorf("the feed says %q while an abandoned key is on a later page", textOf(t, ctx, "#abandoned-empty"))
		}
		if got := textOf(t, ctx, "#abandoned-rows"); !strings.Contains(got, "scan-z") {
			t.Errorf("the feed's rows read %q, want scan-z", got)
		}
	})

	t.Run("long values squeeze no word", func(t *testing.T) {
		// The longest owner, key and fingerprint, without a space in them, and a header
		// value as long as a body.
		owner := strings.Repeat("worker", 256/6)
		key := "wide-" + strings.Repeat("k", 250)
		seed.claim(alphaAdmin, key, map[string]any{"lease_ms": 100, "owner": owner, "fingerprint": "sha256:" + strings.Repeat("f", 249)})
		seed.abandoned(alphaUse, "wide-", 1)
		lease := seed.claim(alphaAdmin, "wide-header", nil)
		seed.complete(alphaAdmin, "wide-header", lease, 200, map[string][]string{"content-type": {"text/plain"},
			"x-trace": {strings.Repeat("0123456789abcdef", 120)}}, nil)

		// lines counts the lines the text of each element matching sel is drawn on.
		lines := func(ctx context.Context, sel string) map[string]int {
			t.Helper()
			return eval[map[string]int](t, ctx, `(() => {
				const out = {};
				for (const e of document.querySelectorAll(`+js(sel)+`)) {
					const r = document.createRange();
					r.selectNodeContents(e);
					out[e.textContent] = new Set(Array.from(r.getClientRects(), (c) => Math.round(c.top))).size;
				}
				return out;
			})()`)
		}
		ctx := tab(t, browser, d, alphaUse)
		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-abandoned")), chromedp.WaitVisible(chromedp.CSS("#view-abandoned")),
			chromedp.SendKeys(chromedp.CSS("#abandoned-prefix"), "wide-"), chromedp.Click(chromedp.CSS("#abandoned-filter")))
		waitFor(t, ctx, `document.getElementById('abandoned-table').dataset.prefix === 'wide-' && document.querySelectorAll('#abandoned-rows tr').length === 1`)
		for text, n := range lines(ctx, "#abandoned-rows button") {
			if n != 1 {
				t.Errorf("the button %q is drawn on %d lines", text, n)
			}
		}
		// A column's name breaks between its words, if at all.
		for text, n := range lines(ctx, "#abandoned-table th") {
			if words := len(strings.Fields(text)); n > max(words, 1) {
				t.Errorf("the column %q is drawn on %d lines: a word of it is broken", text, n)
			}
		}

		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-inspect")), chromedp.SetValue(chromedp.CSS("#key"), "wide-header"), chromedp.Click(chromedp.CSS("#lookup")))
		waitFor(t, ctx, `!document.getElementById('record').hidden && document.getElementById('f-key').textContent === 'wide-header'`)
		for text, n := range lines(ctx, "#f-headers tbody td:first-child") {
			if n != 1 {
				t.Errorf("the header name %q is drawn on %d lines", text, n)
			}
		}
		if got := eval[bool](t, ctx, `document.documentElement.scrollWidth <= document.documentElement.clientWidth`); !got {
			t.Error("the record is wider than the window")
		}
	})

	t.Run("traffic moves under claims", func(t *testing.T) {
		ctx := tab(t, browser, d, platformAdmin)
		waitFor(t, ctx, `document.getElementById('tenant').options.length === 3`)
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#tenant"), "beta"))
		eval[bool](t, ctx, `document.getElementById('tenant').dispatchEvent(new Event('change'))`)
		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-traffic")))
		waitFor(t, ctx, `document.getElementById('traffic-summary').dataset.total !== undefined && document.querySelector('#chart-claims svg') !== null`)
		counts := func() map[string]int {
			got := eval[map[string]string](t, ctx, `({...document.getElementById('traffic-summary').dataset})`)
			out := map[string]int{}
			for name, v := range got {
				n, err := strconv.Atoi(v)
				if err != nil {
					t.Fatalf("the summary's %s is %q", name, v)
				}
				out[name] = n
			}
			return out
		}
		before := counts()
		maxBefore := eval[string](t, ctx, `document.querySelector('#chart-claims svg').dataset.max`)
		// Claims of each outcome, sent as clients would, until they have filled three
		// whole seconds of the chart: a new key, a duplicate while it is held, one with
		// another payload, a replay once it is finished, and now and then one refused.
		secondsWithClaims := func() int {
			a := d.call(platformAdmin, http.MethodGet, query("/console/api/traffic", "tenant", "beta"), nil)
			acquired, _ := a.body["claims"].(map[string]any)["acquired"].([]any)
			n := 0
			for _, v := range acquired {
				if v.(float64) > 0 {
					n++
				}
			}
			return n
		}
		start := secondsWithClaims()
		rounds, refused := 0, 0
		claim := func(key, fingerprint string, status int) {
			a := d.call(betaUse, http.MethodPost, "/v1/claim", map[string]any{"key": key, "fingerprint": fingerprint})
			if a.status != status {
				t.Fatalf("claim %s: %d %s, want %d", key, a.status, a.raw, status)
			}
		}
		for ; rounds < 100000 && secondsWithClaims() < start+3; rounds++ {
			key := fmt.Sprintf("load-%d", rounds)
			lease := seed.claim(betaUse, key, map[string]any{"fingerprint": "a"})
			claim(key, "a", http.StatusConflict)
			claim(key, "b", http.StatusUnprocessableEntity)
			seed.complete(betaUse, key, lease, 200, nil, nil)
			claim(key, "a", http.StatusOK)
			if rounds%4 == 0 {
				claim("", "a", http.StatusBadRequest)
				refused++
			}
		}
		n := rounds
		waitFor(t, ctx, fmt.Sprintf(`Number(document.getElementById('traffic-summary').dataset.total) >= %d`, before["total"]+4*n+refused))
		after := counts()
		for outcome, want := range map[string]int{"acquired": n, "in_progress": n, "fingerprint_mismatch": n, "replayed": n, "other": refused} {
			if got := after[outcome] - before[outcome]; got != want {
				t.Errorf("the summary counted %d more %s claims, want %d", got, outcome, want)
			}
		}
		if summary := textOf(t, ctx, "#traffic-summary"); !strings.Contains(summary, "in tenant beta") ||
			!strings.Contains(summary, fmt.Sprintf("%d acquired", after["acquired"])) {
			t.Errorf("summary %q", summary)
		}
		if got := eval[string](t, ctx, `document.querySelector('#chart-claims svg').dataset.max`); got == maxBefore || got == "0" {
			t.Errorf("the claims chart's peak stayed %s", got)
		}
		if got := eval[int](t, ctx, `document.querySelectorAll('#chart-claims path.line-acquired, #chart-latency path.line-p99').length`); got != 2 {
			t.Errorf("%d lines drawn for acquired claims and p99, want 2", got)
		}
		if legend := textOf(t, ctx, "#chart-claims .legend"); !strings.Contains(legend, fmt.Sprintf("acquired: %d,", after["acquired"])) {
			t.Errorf("the claims chart's legend reads %q", legend)
		}

		// A time axis: a label every 30 s of the clock, in order, left to right.
		ticks := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#chart-claims .tick-label'), (e) => e.textContent)`)
		if len(ticks) < 5 {
			t.Errorf("the claims chart's time axis has the labels %q, want one every 30 s", ticks)
		}
		for i, tick := range ticks {
			at, err := time.Parse("15:04:05", tick)
			if err != nil || at.Second()%30 != 0 {
				t.Errorf("the time axis's label %q is not a time on a half minute", tick)
			}
			if i > 0 && tick <= ticks[i-1] && !strings.HasPrefix(tick, "00:") {
				t.Errorf("the time axis's labels are out of order: %q", ticks)
			}
		}
		// Hover values: each second has a column whose title names its time and each
		// outcome's value, and the values of all the columns add up to the summary's.
		sums := eval[map[string]float64](t, ctx, `(() => {
			const sums = {};
			const summary = {...document.getElementById('traffic-summary').dataset};
			for (const title of document.querySelectorAll('#chart-claims .column title')) {
				for (const m of title.textContent.matchAll(/(acquired|replayed|in progress|fingerprint mismatch|other) (\d+)\/s/g)) {
					sums[m[1]] = (sums[m[1]] || 0) + Number(m[2]);
				}
			}
			for (const [k, v] of Object.entries(summary)) sums['summary ' + k] = Number(v);
			return sums;
		})()`)
		for outcome, label := range map[string]string{"acquired": "acquired", "replayed": "replayed", "in_progress": "in progress", "fingerprint_mismatch": "fingerprint mismatch", "other": "other"} {
			if sums[label] != sums["summary "+outcome] {
				t.Errorf("the claims chart's columns add up to %v %s claims, the summary says %v", sums[label], label, sums["summary "+outcome])
			}
		}
		// Pointing at a second shows its values under the chart.
		box := eval[[]float64](t, ctx, `(() => {
			const cols = Array.from(document.querySelectorAll('#chart-claims .column'));
			const busiest = cols.reduce((a, b) => (JSON.parse(b.dataset.total) > JSON.parse(a.dataset.total) ? b : a));
			const r = busiest.getBoundingClientRect();
			return [r.left + r.width / 2, r.top + r.height / 2];
		})()`)
		run(t, ctx, chromedp.MouseEvent(input.DispatchMouseEventTypeMouseMoved, box[0], box[1]))
		waitFor(t, ctx, `/^\d\d:\d\d:\d\d UTC: acquired \d+\/s/.test(document.querySelector('#chart-claims .readout').textContent)`)
		// No outcome's claims hide another's: in the busiest second, each outcome that
		// has claims enough for a pixel is what the browser draws somewhere on the line
		// through it.
		unseen := eval[[]string](t, ctx, `(() => {
			const svg = document.querySelector('#chart-claims svg');
			const cols = Array.from(svg.querySelectorAll('.column'));
			const busiest = cols.reduce((a, b) => (JSON.parse(b.dataset.total) > JSON.parse(a.dataset.total) ? b : a));
			const values = JSON.parse(busiest.dataset.values);
			const r = busiest.getBoundingClientRect();
			const x = r.left + r.width / 2;
			const pxPerClaim = r.height / Number(svg.dataset.ymax);
			const seen = new Set();
			for (let y = r.top; y <= r.bottom; y += 0.5) {
				const drawn = document.elementsFromPoint(x, y).find((e) => e.classList.contains('band') || e.classList.contains('line'));
				if (drawn) seen.add(drawn.dataset.series);
			}
			return Object.entries(values).filter(([name, v]) => v * pxPerClaim >= 2 && !seen.has(name)).map(([name, v]) => name + ' ' + v);
		})()`)
		if len(unseen) > 0 {
			t.Errorf("in the busiest second, the claims chart hides %q", unseen)
		}
		// p50 and p99 may be equal: their lines differ by more than colour.
		if dashes := eval[[]string](t, ctx, `Array.from(document.querySelectorAll('#chart-latency path.line'), (p) => getComputedStyle(p).strokeDasharray)`); len(dashes) != 2 || dashes[0] == dashes[1] {
			t.Errorf("the latency lines' dashes are %q, want two kinds", dashes)
		}
		screenshot(t, ctx, "traffic")
	})

	t.Run("hostile data is shown as text", func(t *testing.T) {
		lease := seed.claim(alphaAdmin, xssKey, map[string]any{"owner": xssOwner})
		seed.complete(alphaAdmin, xssKey, lease, 200, map[string][]string{"x-note": {xssValue}}, []byte(xssBody))
		pending := "pending " + xssKey
		lease = seed.claim(alphaAdmin, pending, map[string]any{"owner": xssOwner, "lease_ms": 100})
		seed.point(alphaAdmin, pending, lease, xssPoint, []byte(xssBody))
		seed.abandoned(alphaUse, "pending ", 1)

		ctx := tab(t, browser, d, alphaUse)
		run(t, ctx,
			chromedp.SetValue(chromedp.CSS("#key"), xssKey),
			chromedp.Click(chromedp.CSS("#lookup")),
			chromedp.WaitVisible(chromedp.CSS("#record")))
		for sel, want := range map[string]string{"#f-key": xssKey, "#f-owner": xssOwner, "#f-body": xssBody} {
			if got := textOf(t, ctx, sel); got != want {
				t.Errorf("%s shows %q, want the text %q", sel, got, want)
			}
		}
		if got := textOf(t, ctx, "#f-headers tbody"); got != "x-note"+xssValue {
			t.Errorf("headers show %q", got)
		}
		inert(t, ctx, "#record")
		screenshot(t, ctx, "hostile")

		run(t, ctx,
			chromedp.SetValue(chromedp.CSS("#key"), pending),
			chromedp.Click(chromedp.CSS("#lookup")))
		waitFor(t, ctx, `document.getElementById('f-key').textContent === `+js(pending))
		for sel, want := range map[string]string{"#f-point-name": xssPoint, "#f-point-data": xssBody, "#f-owner": xssOwner} {
			if got := textOf(t, ctx, sel); got != want {
				t.Errorf("%s shows %q, want the text %q", sel, got, want)
			}
		}
		inert(t, ctx, "#record")

		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-abandoned")),
			chromedp.SendKeys(chromedp.CSS("#abandoned-prefix"), "pending "), chromedp.Click(chromedp.CSS("#abandoned-filter")))
		waitFor(t, ctx, `document.getElementById('abandoned-table').dataset.prefix === 'pending ' && document.querySelectorAll('#abandoned-rows tr').length === 1`)
		row := textOf(t, ctx, "#abandoned-rows tr")
		for _, want := range []string{pending, xssOwner, xssPoint} {
			if !strings.Contains(row, want) {
				t.Errorf("the feed's row %q lacks the text %q", row, want)
			}
		}
		inert(t, ctx, "#abandoned-table")
	})

	t.Run("client text turns nothing of the page around", func(t *testing.T) {
		// A right-to-left override, never closed, in a key, an owner, a recovery point's
		// name and a header, and invisible characters: shown as what they are, each
		// kept to its own place.
		key := "\u202Erefund-88"
		owner := "pay\u202Ements\u200B"
		point := "\u2067charged\u2069\u200F"
		lease := seed.claim(alphaAdmin, key, map[string]any{"owner": owner, "lease_ms": 90000})
		seed.point(alphaAdmin, key, lease, point, []byte("ok"))
		ctx := tab(t, browser, d, alphaAdmin)
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#key"), key), chromedp.Click(chromedp.CSS("#lookup")))
		waitFor(t, ctx, `!document.getElementById('record').hidden`)
		for sel, want := range map[string]string{"#f-key": "U+202Erefund-88", "#f-owner": "payU+202EmentsU+200B", "#f-point-name": "U+2067chargedU+2069U+200F"} {
			if got := textOf(t, ctx, sel); got != want {
				t.Errorf("%s shows %q, want %q", sel, got, want)
			}
		}
		// leftToRight says whether the console's own words after a client string in an
		// element are laid out left to right, as written, by where the browser drew them.
		leftToRight := func(sel, words string) {
			t.Helper()
			got := eval[string](t, ctx, `(() => {
				const root = document.querySelector(`+js(sel)+`);
				const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
				let n;
				while ((n = walk.nextNode()) && !n.data.includes(`+js(words)+`)) {}
				if (!n) return 'no text ' + `+js(words)+`;
				const at = n.data.indexOf(`+js(words)+`);
				const x = (i) => { const r = document.createRange(); r.setStart(n, i); r.setEnd(n, i + 1); return r.getBoundingClientRect().left; };
				if (root.getClientRects().length === 0) return 'not drawn';
				return x(at) < x(at + `+js(words)+`.length - 1) ? 'left to right' : 'reversed';
			})()`)
			if got != "left to right" {
				t.Errorf("%q in %s: %s", words, sel, got)
			}
		}
		run(t, ctx, chromedp.Click(chromedp.CSS("#purge")), chromedp.WaitVisible(chromedp.CSS("#purge-confirm")))
		leftToRight("#purge-confirm p", "in tenant")
		leftToRight("#purge-confirm p", "Its stored result")
		// Nowhere in the record does a bidi control or an invisible character stay.
		hidden := eval[[]string](t, ctx, `(() => {
			const found = [];
			const walk = document.createTreeWalker(document.getElementById('record'), NodeFilter.SHOW_TEXT);
			for (let n; (n = walk.nextNode());) if (/[\u200B-\u200F\u202A-\u202E\u2066-\u2069\u061C]/.test(n.data)) found.push(n.data);
			return found;
		})()`)
		if len(hidden) > 0 {
			t.Errorf("text nodes hold invisible characters as they are: %q", hidden)
		}
		run(t, ctx, chromedp.Click(chromedp.CSS("#purge-yes")))
		waitFor(t, ctx, `document.getElementById('purge-result').textContent.startsWith('Purged')`)
		leftToRight("#purge-result", "from tenant")
	})

	t.Run("deep links", func(t *testing.T) {
		// Keys a URL would otherwise change: dot segments, a path's, a query's and a
		// fragment's separators, a percent sign, a space and a plus, and a right-to-left
		// override.
		keys := map[string]string{
			".": ".", "..": "..", "a/../b": "a/../b", "x?y#z&key=w": "x?y#z&key=w", "100% +1": "100% +1",
			"\u202Eevil": "U+202Eevil",
		}
		for key := range keys {
			seed.claim(betaUse, key, map[string]any{"owner": "linked"})
		}
		seed.claim(betaUse, "late-1", map[string]any{"lease_ms": 100, "owner": "linked"})
		seed.abandoned(betaUse, "late-", 1)
		ctx := tab(t, browser, d, platformAdmin)
		// load opens a URL afresh, as an alert's link would: the tab keeps its token.
		load := func(fragment string) {
			t.Helper()
			run(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(d.url+"/console/"+fragment),
				chromedp.WaitVisible(chromedp.CSS("#tabs")))
		}
		shown := func() string {
			return eval[string](t, ctx, `[...document.querySelectorAll('.view')].filter((v) => !v.hidden).map((v) => v.id).join(' ')`)
		}

		for key, text := range keys {
			link := "#/records?" + url.Values{"tenant": {"beta"}, "key": {key}}.Encode()
			load(link)
			waitFor(t, ctx, `!document.getElementById('record').hidden && document.getElementById('f-key').textContent === `+js(text))
			if got := shown(); got != "view-inspect" {
				t.Errorf("%s shows %q", link, got)
			}
			if got := textOf(t, ctx, "#f-tenant"); got != "beta" {
				t.Errorf("%s shows tenant %q", link, got)
			}
			if got := eval[string](t, ctx, `document.getElementById('tenant').value`); got != "beta" {
				t.Errorf("%s leaves the tenant chooser at %q", link, got)
			}
		}

		// A key looked up in the inspector gets its URL, which opens it again.
		load("#/records?tenant=beta")
		run(t, ctx, chromedp.SetValue(chromedp.CSS("#key"), "x?y#z&key=w"), chromedp.Click(chromedp.CSS("#lookup")))
		waitFor(t, ctx, `!document.getElementById('record').hidden && document.getElementById('f-key').textContent === 'x?y#z&key=w'`)
		link := eval[string](t, ctx, `location.hash`)
		load(link)
		waitFor(t, ctx, `!document.getElementById('record').hidden && document.getElementById('f-key').textContent === 'x?y#z&key=w'`)

		// A tenant's link opens the overview at its line.
		load("#/tenants/beta")
		waitFor(t, ctx, `document.querySelector('#overview-rows tr[data-tenant="beta"]') !== null`)
		if got := shown(); got != "view-overview" {
			t.Errorf("#/tenants/beta shows %q", got)
		}
		if got := eval[string](t, ctx, `document.querySelector('#overview-rows tr[aria-current]')?.dataset.tenant || ''`); got != "beta" {
			t.Errorf("#/tenants/beta marks the line of %q", got)
		}
		// The keys are counted at most every 30 s: the count reaches the keys claimed
		// above within that.
		wait.For(t, time.Minute, "beta's pending keys to show in the overview", func() bool {
			pending := textOf(t, ctx, `#overview-rows tr[data-tenant="beta"] .pending`)
			if n, err := strconv.Atoi(pending); err == nil && n >= len(keys)+1 {
				return true
			}
			load("#/tenants/beta")
			waitFor(t, ctx, `document.querySelector('#overview-rows tr[data-tenant="beta"]') !== null`)
			return false
		})

		load("#/abandoned?tenant=beta&prefix=late-")
		waitFor(t, ctx, `document.getElementById('abandoned-table').dataset.prefix === 'late-' && document.querySelectorAll('#abandoned-rows tr').length === 1`)
		if got := shown(); got != "view-abandoned" {
			t.Errorf("the abandoned keys' link shows %q", got)
		}
		if got := eval[string](t, ctx, `document.getElementById('abandoned-prefix').value`); got != "late-" {
			t.Errorf("the prefix reads %q", got)
		}

		load("#/traffic?tenant=beta")
		waitFor(t, ctx, `document.getElementById('traffic-summary').textContent.includes('in tenant beta')`)
		host, _ := os.Hostname()
		if got := textOf(t, ctx, "#traffic-scope"); !strings.Contains(got, host) || !strings.Contains(got, "only") {
			t.Errorf("the traffic view says %q; want it to name the daemon %s whose claims alone it counts", got, host)
		}

		// Navigating writes the URL, and back and forward return through it.
		load("#/overview")
		waitFor(t, ctx, `document.querySelector('#overview-rows tr[data-tenant="beta"] .overview-traffic') !== null`)
		run(t, ctx, chromedp.Click(chromedp.CSS(`#overview-rows tr[data-tenant="beta"] .overview-traffic`)))
		waitFor(t, ctx, `!document.getElementById('view-traffic').hidden && location.hash === '#/traffic?tenant=beta'`)
		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-abandoned")))
		waitFor(t, ctx, `!document.getElementById('view-abandoned').hidden && location.hash === '#/abandoned?tenant=beta'`)
		eval[bool](t, ctx, `(history.back(), true)`)
		waitFor(t, ctx, `!document.getElementById('view-traffic').hidden && location.hash === '#/traffic?tenant=beta'`)
		eval[bool](t, ctx, `(history.back(), true)`)
		waitFor(t, ctx, `!document.getElementById('view-overview').hidden && location.hash === '#/overview'`)
		eval[bool](t, ctx, `(history.forward(), true)`)
		waitFor(t, ctx, `!document.getElementById('view-traffic').hidden && document.getElementById('traffic-summary').textContent.includes('in tenant beta')`)
	})

	t.Run("the store", func(t *testing.T) {
		sen := testredis.StartSentinel(t)
		store, err := redisstore.Open(sen.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		rd := newConsoleDaemon(t, store, false, server.StoreInfo{Kind: "sentinel", Layout: "lean-only", Location: sen.Addr(),
			Stats: store, Topology: topologyOf(store)})
		expectStatus(t, "a claim, for a round trip", rd.call(alphaUse, http.MethodPost, "/v1/claim", map[string]any{"key": "k"}), http.StatusCreated, "")
		// The store view is the platform's: a tenant's token is not offered it.
		ctx := tab(t, browser, rd, alphaAdmin)
		if !eval[bool](t, ctx, `document.getElementById('tab-store').hidden`) {
			t.Error("a tenant's token is offered the store view")
		}
		ctx = tab(t, browser, rd, platformReader)
		run(t, ctx, chromedp.Click(chromedp.CSS("#tab-store")))
		waitFor(t, ctx, `document.querySelectorAll('#masters-rows tr.master').length === 1 && document.querySelectorAll('#masters-rows tr.replica').length === 1`)
		for sel, want := range map[string]string{"#s-kind": "sentinel", "#s-layout": "lean-only", "#s-ready": "yes: the store takes writes"} {
			if got := textOf(t, ctx, sel); got != want {
				t.Errorf("%s shows %q, want %q", sel, got, want)
			}
		}
		master, replica := textOf(t, ctx, "#masters-rows tr.master"), textOf(t, ctx, "#masters-rows tr.replica")
		if !strings.Contains(master, sen.Master.Addr()) || !strings.Contains(master, " ms") {
			t.Errorf("the master's row reads %q, want %s and a round trip", master, sen.Master.Addr())
		}
		if !strings.Contains(replica, sen.Replica.Addr()) || !strings.Contains(replica, "bytes behind") || !strings.Contains(replica, " ms") {
			t.Errorf("the replica's row reads %q, want %s, its lag and its PING", replica, sen.Replica.Addr())
		}
		screenshot(t, ctx, "store")
	})

	t.Run("open, without an auth file", func(t *testing.T) {
		od := newConsoleDaemon(t, consoleStore(t), true, server.StoreInfo{Kind: "embedded"})
		ctx := tab(t, browser, od, "")
		if got := textOf(t, ctx, "#tenant-name"); got != "default" {
			t.Errorf("tenant %q", got)
		}
		if eval[bool](t, ctx, `document.getElementById('open-note').hidden`) {
			t.Error("the page does not say that idemd runs open")
		}
	})
}

// inert checks that nothing hostile ran or became markup under root: no script set
// its marker or the title, and no element a payload names exists there.
func inert(t *testing.T, ctx context.Context, root string) {
	t.Helper()
	if got := eval[string](t, ctx, `String(window.__xss)`); got != "undefined" {
		t.Errorf("a payload ran: window.__xss = %s", got)
	}
	if got := eval[string](t, ctx, `document.title`); got != "idemd console" {
		t.Errorf("the title became %q", got)
	}
	sel := js(root + " img, " + root + " script, " + root + " svg:not(.chart-svg), " + root + " b, " + root + " html")
	if n := eval[int](t, ctx, `document.querySelectorAll(`+sel+`).length`); n != 0 {
		t.Errorf("%d elements of a payload under %s", n, root)
	}
}

// topologyOf hands the console a Redis store's topology, as the daemon does.
func topologyOf(store *redisstore.Store) func(context.Context) ([]server.StoreNode, error) {
	return func(ctx context.Context) ([]server.StoreNode, error) {
		nodes, err := store.Topology(ctx)
		var out []server.StoreNode
		for _, n := range nodes {
			sn := server.StoreNode{Address: n.Address, RoundTrip: n.RoundTrip, Err: n.Err}
			for _, r := range n.Replicas {
				sn.Replicas = append(sn.Replicas, server.StoreReplica(r))
			}
			out = append(out, sn)
		}
		return out, err
	}
}
