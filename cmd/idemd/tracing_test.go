package main

import (
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/testdaemon"
	"github.com/idemd/idemd/internal/testing/wait"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a real OTLP/HTTP endpoint on loopback that keeps what it is sent.
type otlpReceiver struct {
	url string

	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string
}

func startReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		var export coltrace.ExportTraceServiceRequest
		if err != nil || req.URL.Path != "/v1/traces" || proto.Unmarshal(body, &export) != nil {
			http.Error(w, "not an OTLP trace export", http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		for _, rs := range export.ResourceSpans {
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "service.name" {
					r.service = append(r.service, a.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	r.url = "http://" + l.Addr().String()
	return r
}

func (r *otlpReceiver) received() ([]*tracepb.Span, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([]string(nil), r.service...)
}

// TestTracingToOTLP runs the binary with the standard OTEL_ variables and a real OTLP
// receiver: a claim carrying a traceparent arrives as a span of the caller's trace;
// with OTEL_TRACES_EXPORTER=none nothing is sent; an unsupported protocol stops the
// start naming its variable.
func TestTracingToOTLP(t *testing.T) {
	bin := buildDaemon(t)
	start := func(t *testing.T, env ...string) (*process, *syncBuffer) {
		t.Helper()
		addr := testdaemon.FreeAddr(t)
		p := &process{base: "http://" + addr, logs: &strings.Builder{}}
		p.cmd = exec.Command(bin, "--listen", addr, "--data-dir", filepath.Join(t.TempDir(), "data"), "--log-level", "warn")
		p.cmd.Env = daemonEnv(env...)
		logs := &syncBuffer{}
		p.cmd.Stdout, p.cmd.Stderr = logs, logs
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Kill()
				_ = p.cmd.Wait()
			}
		})
		waitReady(t, p)
		return p, logs
	}
	claim := func(t *testing.T, p *process, traceparent string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/claim", strings.NewReader(`{"key":"traced-key"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("traceparent", traceparent)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("claim: %d", resp.StatusCode)
		}
	}
	stop := func(t *testing.T, p *process) {
		t.Helper()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Wait(); err != nil {
			t.Fatalf("idemd exited with %v", err)
		}
	}
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

	t.Run("spans reach the collector in the caller's trace", func(t *testing.T) {
		rcv := startReceiver(t)
		p, logs := start(t, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.url, "OTEL_SERVICE_NAME=idemd-test", "OTEL_BSP_SCHEDULE_DELAY=50")
		claim(t, p, "00-"+traceID+"-"+parentID+"-01")
		deadline := time.Now().Add(wait.Scale(20 * time.Second))
		for {
			spans, services := rcv.received()
			for _, s := range spans {
				if s.Name == "POST /v1/claim" {
					if hex.EncodeToString(s.TraceId) != traceID || hex.EncodeToString(s.ParentSpanId) != parentID {
						t.Fatalf("the claim's span is in trace %x under %x, want %s under %s", s.TraceId, s.ParentSpanId, traceID, parentID)
					}
					if len(services) == 0 || services[0] != "idemd-test" {
						t.Fatalf("service.name: %v, want OTEL_SERVICE_NAME's", services)
					}
					stop(t, p)
					return
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no span of the claim within 20s (received %d spans):\n%s", len(spans), logs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	t.Run("none sends nothing", func(t *testing.T) {
		rcv := startReceiver(t)
		p, _ := start(t, "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.url, "OTEL_TRACES_EXPORTER=none")
		claim(t, p, "00-"+traceID+"-"+parentID+"-01")
		// A daemon that traced would send its batch when it stops, before it exits.
		stop(t, p)
		if spans, _ := rcv.received(); len(spans) != 0 {
			t.Fatalf("OTEL_TRACES_EXPORTER=none sent %d spans", len(spans))
		}
	})

	t.Run("an unsupported protocol stops the start", func(t *testing.T) {
		code, out := runToExit(t, bin, daemonEnv("OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"),
			"--listen", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"))
		if code != 2 || !strings.Contains(out, "OTEL_EXPORTER_OTLP_PROTOCOL") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
		code, out = runToExit(t, bin, daemonEnv("OTEL_TRACES_EXPORTER=zipkin"), "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(t.TempDir(), "data"))
		if code != 2 || !strings.Contains(out, "OTEL_TRACES_EXPORTER") {
			t.Fatalf("exit %d:\n%s", code, out)
		}
	})
}
