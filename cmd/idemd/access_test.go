package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testredis"
	"github.com/idemd/idemd/internal/testing/wait"
)

// syncBuffer collects the daemon's logs, written from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runDaemon runs the real daemon in-process on a loopback port over a real Redis, with
// the extra flags, until the test ends.
func runDaemon(t *testing.T, flags ...string) (*Main, *syncBuffer) {
	t.Helper()
	r := testredis.Start(t)
	m := NewMain()
	args := append([]string{"--listen", "127.0.0.1:0", "--store", r.URL(), "--shutdown-timeout", "5s"}, flags...)
	if err := m.ParseFlags(args); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	m.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	if err := m.Open(); err != nil {
		t.Fatalf("the daemon did not start: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m, logs
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// authFile is an auth file giving each token the use scope in tenant team.
func authFile(tokens ...string) string {
	var b strings.Builder
	b.WriteString("tenants:\n  team: {}\ntokens:\n")
	for _, tok := range tokens {
		b.WriteString("  - {tenant: team, scopes: [use], sha256: " + sha256Hex(tok) + "}\n")
	}
	return b.String()
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	// Written aside and renamed, so that a reload never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// request sends one JSON request and returns the status and decoded body.
func request(t *testing.T, client *http.Client, method, url, token string, body any) (int, map[string]any) {
	t.Helper()
	var reader io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		reader = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, reader)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &out)
	return resp.StatusCode, out
}

func lookupStatus(client *http.Client, url, token string) (int, error) {
	req, err := http.NewRequest(http.MethodGet, url+"/v1/records/none", nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func TestOpenWithoutAuthFile(t *testing.T) {
	m, logs := runDaemon(t)
	status, body := request(t, http.DefaultClient, http.MethodPost, "http://"+m.Addr()+"/v1/claim", "", map[string]any{"key": "k"})
	if status != http.StatusCreated {
		t.Fatalf("claim without a token on an open daemon: %d %v", status, body)
	}
	if !strings.Contains(logs.String(), `"level":"WARN","msg":"no --auth-file: idemd is open`) {
		t.Fatalf("no warning about running open:\n%s", logs)
	}
}

// TestAllowedHosts runs an open daemon told one name: a client calling it by that name
// or by its address works, one calling it by another name is refused (DNS rebinding);
// and the flag takes names only, and no auth file.
func TestAllowedHosts(t *testing.T) {
	m, _ := runDaemon(t, "--allowed-hosts", "idemd.platform.svc, idemd.internal")
	addr := m.Addr()
	// Every name resolves to the daemon, as a rebound one would.
	client := &http.Client{Timeout: wait.Scale(10 * time.Second), Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	_, port, _ := net.SplitHostPort(addr)
	for host, want := range map[string]int{
		"idemd.internal":        http.StatusCreated,
		"idemd.platform.svc":    http.StatusCreated,
		"127.0.0.1":             http.StatusCreated,
		"localhost":             http.StatusCreated,
		"rebound.attacker.test": http.StatusForbidden,
	} {
		status, body := request(t, client, http.MethodPost, "http://"+net.JoinHostPort(host, port)+"/v1/claim", "", map[string]any{"key": "by-" + host})
		if status != want {
			t.Errorf("a claim by %s: %d %v, want %d", host, status, body, want)
		}
	}

	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeTestFile(t, path, authFile("steady", "old"))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--allowed-hosts", "idemd:8080"}, "a host name"},
		{[]string{"--allowed-hosts", "http://idemd"}, "a host name"},
		{[]string{"--allowed-hosts", "idemd,,x"}, "a host name"},
		{[]string{"--allowed-hosts", "idemd", "--auth-file", path}, "without --auth-file"},
	} {
		if err := NewMain().ParseFlags(c.args); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "--allowed-hosts") {
			t.Errorf("ParseFlags(%v) = %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

func TestBadAuthFileStopsStart(t *testing.T) {
	r := testredis.Start(t)
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeTestFile(t, path, "tokens:\n  - {tenant: team, scopes: [use], sha256: "+sha256Hex("x")+"}\n")
	m := NewMain()
	if err := m.ParseFlags([]string{"--listen", "127.0.0.1:0", "--store", r.URL(), "--auth-file", path}); err != nil {
		t.Fatal(err)
	}
	m.Logger = slog.New(slog.NewJSONHandler(io.Discard, nil))
	err := m.Open()
	if err == nil || !strings.Contains(err.Error(), "--auth-file") || !strings.Contains(err.Error(), "not declared") {
		t.Fatalf("Open = %v, want an --auth-file error about the undeclared tenant", err)
	}
}

func TestTLSFlagsGoTogether(t *testing.T) {
	for _, args := range [][]string{{"--tls-cert", "c.pem"}, {"--tls-key", "k.pem"}} {
		if err := NewMain().ParseFlags(args); err == nil || !strings.Contains(err.Error(), "together") {
			t.Errorf("ParseFlags(%v) = %v", args, err)
		}
	}
}

// TestReloadOnSIGHUP rotates tokens with SIGHUP while requests run: the token kept in
// every version never fails, the rotated ones switch, and a bad file changes nothing.
func TestReloadOnSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeTestFile(t, path, authFile("steady", "old"))
	m, logs := runDaemon(t, "--auth-file", path)
	url := "http://" + m.Addr()
	client := &http.Client{Timeout: wait.Scale(10 * time.Second)}

	var stop atomic.Bool
	var failures, served atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for i := 0; i < 10000 && !stop.Load(); i++ {
				status, err := lookupStatus(client, url, "steady")
				served.Add(1)
				if err != nil || status != http.StatusNotFound {
					failures.Add(1)
				}
			}
		})
	}

	waitStatus := func(token string, want int) {
		t.Helper()
		err := wait.Until(10*time.Second, func() error {
			status, err := lookupStatus(client, url, token)
			if err == nil && status != want {
				err = fmt.Errorf("status %d", status)
			}
			return err
		})
		if err != nil {
			t.Fatalf("token %q, want status %d: %v", token, want, err)
		}
	}
	waitStatus("old", http.StatusNotFound)
	waitStatus("new", http.StatusUnauthorized)

	writeTestFile(t, path, authFile("steady", "new"))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitStatus("new", http.StatusNotFound)
	waitStatus("old", http.StatusUnauthorized)

	writeTestFile(t, path, "tokens: [")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "a log line about the bad file on SIGHUP", func() bool {
		return strings.Contains(logs.String(), "auth file not reloaded")
	})
	waitStatus("new", http.StatusNotFound)

	stop.Store(true)
	wg.Wait()
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d of %d requests with a steady token failed across reloads", n, served.Load())
	}
	if strings.Contains(logs.String(), "steady") || strings.Contains(logs.String(), `"new"`) {
		t.Fatalf("the logs contain a token:\n%s", logs)
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key as PEM files.
func selfSigned(t *testing.T, certPath, keyPath string, serial int64) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: "idemd test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeTestFile(t, certPath, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	writeTestFile(t, keyPath, string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// TestTLS runs claim, complete and replay over HTTPS with a token, then rotates the
// certificate with a reload.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	certPath, keyPath, authPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "auth.yaml")
	first := selfSigned(t, certPath, keyPath, 1)
	writeTestFile(t, authPath, authFile("tls-token"))
	m, _ := runDaemon(t, "--tls-cert", certPath, "--tls-key", keyPath, "--auth-file", authPath)
	base := "https://" + m.Addr()

	clientFor := func(cert *x509.Certificate) *http.Client {
		roots := x509.NewCertPool()
		roots.AddCert(cert)
		return &http.Client{Timeout: wait.Scale(10 * time.Second), Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true}}
	}
	client := clientFor(first)

	status, claim := request(t, client, http.MethodPost, base+"/v1/claim", "tls-token", map[string]any{"key": "tls-1", "fingerprint": "f"})
	if status != http.StatusCreated || claim["outcome"] != "acquired" {
		t.Fatalf("claim over TLS: %d %v", status, claim)
	}
	status, done := request(t, client, http.MethodPost, base+"/v1/complete", "tls-token", map[string]any{"key": "tls-1",
		"lease_token": claim["lease_token"], "response": map[string]any{"status": 201, "body": "eyJpZCI6NDJ9"}})
	if status != http.StatusOK || done["state"] != "completed" {
		t.Fatalf("complete over TLS: %d %v", status, done)
	}
	status, replay := request(t, client, http.MethodPost, base+"/v1/claim", "tls-token", map[string]any{"key": "tls-1", "fingerprint": "f"})
	resp, _ := replay["response"].(map[string]any)
	if status != http.StatusOK || replay["outcome"] != "completed" || resp["body"] != "eyJpZCI6NDJ9" {
		t.Fatalf("replay over TLS: %d %v", status, replay)
	}
	if status, _ := request(t, client, http.MethodPost, base+"/v1/claim", "", map[string]any{"key": "tls-1"}); status != http.StatusUnauthorized {
		t.Fatalf("claim over TLS without a token: %d", status)
	}

	// Plain HTTP on the HTTPS port is refused.
	if resp, err := http.Get("http://" + m.Addr() + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served on the TLS port")
		}
	}

	second := selfSigned(t, certPath, keyPath, 2)
	m.Reload()
	if _, err := clientFor(first).Get(base + "/healthz"); err == nil {
		t.Fatal("after the reload the old certificate is still served")
	}
	r, err := clientFor(second).Get(base + "/healthz")
	if err != nil {
		t.Fatalf("the reloaded certificate: %v", err)
	}
	r.Body.Close()
	if r.TLS == nil || r.TLS.PeerCertificates[0].SerialNumber.Int64() != 2 {
		t.Fatalf("served certificate: %+v", r.TLS)
	}
}
