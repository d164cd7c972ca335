package testredis

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/testing/wait"
)

// Sentinel is a master, its replica and one Sentinel watching them, on loopback.
type Sentinel struct {
	Master, Replica *Server
	Port            int
	cmd             *exec.Cmd
}

// SentinelMaster is the master name the Sentinel watches.
const SentinelMaster = "idemd"

// StartSentinel starts a master, a replica of it and a Sentinel, waits until the
// Sentinel knows the master and its replica, and stops them when the test ends. Under
// go test -short it skips the test: the Sentinel takes seconds to see the replica.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no Sentinel")
	}
	bin := Binary(t)
	s := &Sentinel{Master: Start(t)}
	s.Replica = Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(s.Master.Port))
	s.Port = FreePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	cfg := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nsentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
		s.Port, dir, SentinelMaster, s.Master.Port, SentinelMaster, SentinelMaster)
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(bin, conf, "--sentinel", "--logfile", filepath.Join(dir, "sentinel.log"))
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start sentinel: %v", err)
	}
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		_, _ = s.cmd.Process.Wait()
	})
	ctx, cancel := context.WithTimeout(context.Background(), wait.Scale(20*time.Second))
	defer cancel()
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	defer sc.Close()
	err := wait.Until(20*time.Second, func() error {
		replicas, err := sc.Replicas(ctx, SentinelMaster).Result()
		if err == nil && (len(replicas) != 1 || replicas[0]["master-link-status"] != "ok") {
			err = fmt.Errorf("replicas %v", replicas)
		}
		return err
	})
	if err != nil {
		t.Fatalf("the sentinel does not see the replica: %v", err)
	}
	return s
}

// Addr is the Sentinel's host:port.
func (s *Sentinel) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

// URL is the redis+sentinel:// store URL.
func (s *Sentinel) URL() string { return "redis+sentinel://" + s.Addr() + "/" + SentinelMaster }
