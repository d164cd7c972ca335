// Package tests3 starts a real S3-compatible server (SeaweedFS's weed, serving S3 with
// anonymous access) on free loopback ports for tests, its data in the test's temporary
// directory, and stops it by its process ID when the test ends.
//
// .ci/deps builds weed once into the tools cache, which make and .ci/run put on the
// PATH. Without it the tests that need it are skipped, unless IDEMD_REQUIRE_S3 is set
// (as make test does), which turns the skip into a failure.
package tests3

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/testing/wait"
)

// Bucket is the bucket every server is started with.
const Bucket = "idemd-test"

// Server is one weed process started by a test.
type Server struct {
	t   testing.TB
	Dir string
	// Port is the S3 port; the other ports weed needs are picked beside it.
	Port  int
	ports []int
	// extra are flags of weed server's after the harness's own, which they override.
	extra []string
	cmd   *exec.Cmd
	// exited is closed once the process has exited and been reaped.
	exited chan struct{}
	log    string
}

// Binary returns the path of weed, or skips (or fails) the test without it.
func Binary(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("weed")
	if err != nil {
		if os.Getenv("IDEMD_REQUIRE_S3") != "" {
			t.Fatalf("weed (SeaweedFS) is required (IDEMD_REQUIRE_S3 is set) but not found: %v; .ci/deps builds it into the tools cache", err)
		}
		t.Skip("weed (SeaweedFS) not found; run .ci/deps (make deps), which builds it into the tools cache on the PATH of make, to run this test")
	}
	return path
}

// freePorts returns n loopback ports that were free a moment ago, all held open
// together while picking so that they differ.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// attempts bounds how many sets of fresh ports Start tries: a port free when picked
// may be taken before weed binds it.
const attempts = 3

// Start runs weed with an S3 gateway and makes Bucket; the server stops when the test
// ends. extra are flags of weed server's, given after the harness's own: weed gives
// each bucket volumes of its own (7 at its first write), and a test that makes a second
// bucket gives "-volume.max=16", the harness's being 8.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Binary(t)
	s := &Server{t: t, Dir: t.TempDir(), extra: extra}
	t.Cleanup(s.Stop)
	var err error
	for range attempts {
		s.ports = freePorts(t, 8)
		s.Port = s.ports[0]
		if err = s.launch(bin); err == nil {
			return s
		}
		s.Stop()
	}
	t.Fatal(err)
	return nil
}

// Endpoint is the S3 endpoint's URL.
func (s *Server) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the blob store URL of idemd for the bucket, under prefix.
func (s *Server) URL(prefix string) string {
	return URLOf(s.Endpoint(), Bucket, prefix)
}

// Restart starts the server again on the same ports and data after Stop.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.launch(Binary(s.t)); err != nil {
		s.t.Fatal(err)
	}
}

// launch starts weed and waits until its S3 gateway makes the bucket, or weed exits.
func (s *Server) launch(bin string) error {
	p := func(i int) string { return strconv.Itoa(s.ports[i]) }
	data := filepath.Join(s.Dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	args := []string{"server",
		"-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-dir=" + data,
		"-master.port=" + p(1), "-master.port.grpc=" + p(2), "-master.telemetry=false",
		"-master.volumeSizeLimitMB=256",
		"-volume.port=" + p(3), "-volume.port.grpc=" + p(4), "-volume.max=8",
		"-filer", "-filer.port=" + p(5), "-filer.port.grpc=" + p(6),
		"-filer.localSocket=" + filepath.Join(s.Dir, "filer.sock"),
		"-s3", "-s3.port=" + p(0), "-s3.port.grpc=" + p(7),
		"-s3.port.iceberg=0", "-s3.port.lance=0",
		"-s3.localSocket=" + filepath.Join(s.Dir, "s3.sock"),
	}
	s.log = filepath.Join(s.Dir, "weed.log")
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, append(args, s.extra...)...)
	cmd.Dir = s.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start weed: %w", err)
	}
	s.cmd = cmd
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	ready := func() error {
		select {
		case <-exited:
			return nil
		default:
		}
		return s.makeBucket()
	}
	err = wait.Until(2*time.Minute, ready)
	select {
	case <-exited:
		s.cmd = nil
		log, _ := os.ReadFile(s.log)
		return fmt.Errorf("weed exited before its S3 gateway answered:\n%s", tail(string(log)))
	default:
	}
	if err != nil {
		log, _ := os.ReadFile(s.log)
		return fmt.Errorf("weed's S3 gateway on %s: %w\n%s", s.Endpoint(), err, tail(string(log)))
	}
	s.exited = exited
	return nil
}

func tail(log string) string {
	if lines := strings.Split(log, "\n"); len(lines) > 40 {
		return strings.Join(lines[len(lines)-40:], "\n")
	}
	return log
}

// makeBucket makes Bucket (CreateBucket, anonymous); one that exists already is fine.
func (s *Server) makeBucket() error {
	req, err := http.NewRequest(http.MethodPut, s.Endpoint()+"/"+Bucket, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusConflict {
		// The bucket is there once the gateway lists it.
		head, err := http.Head(s.Endpoint() + "/" + Bucket)
		if err != nil {
			return err
		}
		head.Body.Close()
		if head.StatusCode == http.StatusOK {
			return s.warmUp()
		}
		return fmt.Errorf("HEAD bucket answered %s", head.Status)
	}
	return fmt.Errorf("CreateBucket answered %s", resp.Status)
}

// warmUp writes and deletes one object: weed makes its first volumes at the first
// write, which takes seconds, and a test's first write should not pay for them
// under a store deadline.
func (s *Server) warmUp() error {
	url := s.Endpoint() + "/" + Bucket + "/warm-up"
	req, err := http.NewRequest(http.MethodPut, url, strings.NewReader("warm"))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("PUT of the warm-up object answered %s", resp.Status)
	}
	if req, err = http.NewRequest(http.MethodDelete, url, nil); err != nil {
		return err
	}
	if resp, err = http.DefaultClient.Do(req); err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("DELETE of the warm-up object answered %s", resp.Status)
	}
	return nil
}

// Stop kills weed (SIGKILL, by its process ID) and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	if s.exited != nil {
		<-s.exited
	}
	s.cmd, s.exited = nil, nil
}

// Pause stops weed (SIGSTOP) without closing its connections, as a hung machine
// would: connections are still accepted by the kernel, and nothing answers them.
// Resume lets it go on.
func (s *Server) Pause() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused server.
func (s *Server) Resume() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// MakeBucket makes a bucket of this name (anonymous CreateBucket); one that exists
// already is fine.
func (s *Server) MakeBucket(name string) error {
	req, err := http.NewRequest(http.MethodPut, s.Endpoint()+"/"+name, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
		return fmt.Errorf("CreateBucket %s answered %s", name, resp.Status)
	}
	return nil
}

// URLOf is the blob store URL of idemd for bucket, under prefix, reached at endpoint
// (the server's own, or a relay's in front of it).
func URLOf(endpoint, bucket, prefix string) string {
	return "s3://" + bucket + "/" + prefix + "?endpoint=" + endpoint + "&region=us-east-1&path_style=true&anonymous=true"
}
