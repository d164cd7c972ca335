package soak

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/redisstore"
	"github.com/idemd/idemd/internal/loadtest/proc"
)

// child is a process the soak started, and stops by its PID.
type child struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
}

func startChild(name string, cmd *exec.Cmd, log *os.File) (*child, error) {
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.exited) }()
	return c, nil
}

// Pid is the child's process id.
func (c *child) Pid() int { return c.cmd.Process.Pid }

// Exited reports whether the child has ended.
func (c *child) Exited() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// stop sends sig and waits for the child to end, killing it if it has not ended
// within grace.
func (c *child) stop(sig os.Signal, grace time.Duration) {
	if c == nil {
		return
	}
	_ = c.cmd.Process.Signal(sig)
	select {
	case <-c.exited:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// redisServer is the soak's redis-server: one port and one data directory, kept
// across restarts so that a restart reads back what was written before it.
type redisServer struct {
	bin  string
	dir  string
	port int
	log  *os.File
	proc *child
}

// redisArgs are the settings the soak runs Redis with. appendfsync always writes
// and fsyncs the append-only file before Redis answers a write, so a write idemd saw
// confirmed (and acknowledged to its client) survives a SIGKILL of Redis as well as
// a SIGTERM; with everysec a SIGKILL could lose up to a second of them, which the
// loss check would then report. RDB snapshots are off so that the append-only file
// is the one source read at start-up.
func (r *redisServer) args() []string {
	return []string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--protected-mode", "no",
		"--dir", r.dir, "--appendonly", "yes", "--appendfsync", "always", "--save", "",
		"--maxmemory-policy", "noeviction",
	}
}

func startRedis(ctx context.Context, bin, dir string, log *os.File) (*redisServer, error) {
	r := &redisServer{bin: bin, dir: dir, log: log}
	var err error
	// A port taken between proc.FreePort and redis-server's bind is tried again.
	for attempt := 0; attempt < 5; attempt++ {
		if r.port, err = proc.FreePort(); err != nil {
			return nil, err
		}
		if err = r.start(ctx); err == nil {
			return r, nil
		}
	}
	return nil, err
}

// start runs redis-server and waits until it answers PING with its data loaded.
func (r *redisServer) start(ctx context.Context) error {
	proc, err := startChild("redis-server", exec.Command(r.bin, r.args()...), r.log)
	if err != nil {
		return err
	}
	r.proc = proc
	client := r.client()
	defer client.Close()
	deadline := time.Now().Add(30 * time.Second)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		if proc.Exited() {
			return fmt.Errorf("redis-server on port %d exited at start (see %s)", r.port, r.log.Name())
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := client.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			proc.stop(syscall.SIGKILL, 5*time.Second)
			return fmt.Errorf("redis-server on port %d does not answer: %w", r.port, err)
		}
		time.Sleep(pause)
	}
}

// restart stops Redis with sig and starts it again on the same port and data.
func (r *redisServer) restart(ctx context.Context, sig syscall.Signal) error {
	r.proc.stop(sig, 30*time.Second)
	var err error
	// The port was just released; a start that finds it taken for a moment is tried
	// again, a bounded number of times.
	for attempt := 0; attempt < 5; attempt++ {
		if err = r.start(ctx); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func (r *redisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisServer) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr(), MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: 5 * time.Second, PoolSize: 2})
}

// redisInfo reads used_memory and the key count of database 0.
func redisInfo(ctx context.Context, client *redis.Client) (usedMemory, keys int64, err error) {
	text, err := client.Info(ctx, "memory", "keyspace").Result()
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			usedMemory, _ = strconv.ParseInt(v, 10, 64)
		case "db0":
			// keys=12,expires=12,avg_ttl=0
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "keys="); ok {
					keys, _ = strconv.ParseInt(n, 10, 64)
				}
			}
		}
	}
	return usedMemory, keys, nil
}

// countRecords counts the records in Redis by SCAN, a record's key in every layout
// (RecordKey and LeanKey: the pending indexes and usage hashes have a NUL where a
// tenant's name begins), then reads what the store's usage counts of the default
// tenant; -1 for what could not be read.
func countRecords(ctx context.Context, client *redis.Client, url string) (records, usage int64) {
	records = 0
	for _, match := range []string{"idem:*:*", "{??}[a-z0-9]*"} {
		iter := client.Scan(ctx, 0, match, 1000).Iterator()
		for iter.Next(ctx) {
			records++
		}
		if iter.Err() != nil {
			records = -1
			break
		}
	}
	store, err := redisstore.Open(url)
	if err != nil {
		return records, -1
	}
	defer store.Close()
	u, err := store.Usage(ctx, engine.DefaultTenant)
	if err != nil {
		return records, -1
	}
	return records, u.Records
}

// buildIdemd builds cmd/idemd of the module the working directory is in.
func buildIdemd(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "idemd")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/idemd/idemd/cmd/idemd").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build cmd/idemd: %w\n%s", err, out)
	}
	return bin, nil
}

// startIdemd runs idemd over the store URL and waits until /readyz answers 200.
func startIdemd(ctx context.Context, bin, store, dataDir string, retention time.Duration, log *os.File) (*child, string, error) {
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := proc.FreePort()
		if err != nil {
			return nil, "", err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		cmd := exec.Command(bin, "--listen", addr, "--store", store, "--data-dir", dataDir,
			"--retention", retention.String(), "--require-noeviction", "--log-level", "warn")
		cmd.Env = idemdEnv()
		proc, err := startChild("idemd", cmd, log)
		if err != nil {
			return nil, "", err
		}
		base := "http://" + addr
		if lastErr = awaitReady(ctx, proc, base); lastErr == nil {
			return proc, base, nil
		}
		proc.stop(syscall.SIGKILL, 5*time.Second)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, "", lastErr
}

// idemdEnv is the environment without IDEMD_ variables, which would configure idemd
// behind the soak's back.
func idemdEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMD_") {
			env = append(env, kv)
		}
	}
	return env
}

func awaitReady(ctx context.Context, proc *child, base string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		if proc.Exited() {
			return errors.New("idemd exited at start (see its log)")
		}
		resp, err := client.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("/readyz answered %d", resp.StatusCode)
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return fmt.Errorf("idemd not ready: %w", err)
		}
		time.Sleep(pause)
	}
}
