package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Node is one master as Topology finds it, with the replicas it reports.
type Node struct {
	Address string
	// RoundTrip is the time a PING took, now.
	RoundTrip time.Duration
	Replicas  []Replica
	// Err says why the master did not answer; the other fields are then empty.
	Err error
}

// Replica is one replica as its master reports it (INFO replication), with a round
// trip measured from this daemon.
type Replica struct {
	Address string
	// State is the master's word for the link: online, wait_bgsave, send_bulk.
	State string
	// LagBytes is how far the replica's offset is behind its master's.
	LagBytes int64
	// SinceAck is the time since the replica last acknowledged (whole seconds).
	SinceAck time.Duration
	// RoundTrip is the time a PING to the replica took, now; zero with Err.
	RoundTrip time.Duration
	Err       error
}

// topologyPing bounds each PING of Topology, so that an unreachable replica costs the
// view a second, not the caller's whole deadline.
const topologyPing = time.Second

// Topology reports every master, its replicas and their round trips, read now: for
// the operator's console. It makes one short-lived connection per replica, since the
// store itself talks to masters only.
func (s *Store) Topology(ctx context.Context) ([]Node, error) {
	var mu sync.Mutex
	var nodes []Node
	err := s.client.ForEachMaster(ctx, func(ctx context.Context, master *redis.Client) error {
		n := inspectMaster(ctx, master)
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
		return nil
	})
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.Address, b.Address) })
	return nodes, err
}

func inspectMaster(ctx context.Context, master *redis.Client) Node {
	n := Node{Address: master.Options().Addr}
	pctx, cancel := context.WithTimeout(ctx, topologyPing)
	start := time.Now()
	err := master.Ping(pctx).Err()
	n.RoundTrip = time.Since(start)
	cancel()
	if err != nil {
		n.RoundTrip, n.Err = 0, err
		return n
	}
	if master.Options().Dialer != nil {
		// A Sentinel's failover client dials whichever master the Sentinels name; the
		// master says where it listens.
		if info, err := master.Do(ctx, "CLIENT", "INFO").Text(); err == nil {
			if addr := field(strings.Fields(info), "laddr="); addr != "" {
				n.Address = addr
			}
		}
	}
	info, err := master.Info(ctx, "replication").Result()
	if err != nil {
		n.Err = err
		return n
	}
	var offset int64
	var lines []string
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "master_repl_offset:"); ok {
			offset, _ = strconv.ParseInt(v, 10, 64)
		}
		if strings.HasPrefix(line, "slave") && strings.Contains(line, ":ip=") {
			lines = append(lines, line)
		}
	}
	var wg sync.WaitGroup
	n.Replicas = make([]Replica, len(lines))
	for i, line := range lines {
		_, kv, _ := strings.Cut(line, ":")
		fields := strings.Split(kv, ",")
		r := Replica{Address: field(fields, "ip=") + ":" + field(fields, "port="), State: field(fields, "state=")}
		if o, err := strconv.ParseInt(field(fields, "offset="), 10, 64); err == nil {
			r.LagBytes = max(offset-o, 0)
		}
		if l, err := strconv.Atoi(field(fields, "lag=")); err == nil {
			r.SinceAck = time.Duration(l) * time.Second
		}
		n.Replicas[i] = r
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Replicas[i].RoundTrip, n.Replicas[i].Err = pingReplica(ctx, master.Options(), r.Address)
		}()
	}
	wg.Wait()
	slices.SortFunc(n.Replicas, func(a, b Replica) int { return strings.Compare(a.Address, b.Address) })
	return n
}

// pingReplica dials addr with the master's credentials and TLS, and times a PING.
func pingReplica(ctx context.Context, master *redis.Options, addr string) (time.Duration, error) {
	if addr == ":" {
		return 0, errors.New("the master reports no address for it")
	}
	ctx, cancel := context.WithTimeout(ctx, topologyPing)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr, Username: master.Username, Password: master.Password,
		CredentialsProvider: master.CredentialsProvider, TLSConfig: master.TLSConfig, PoolSize: 1,
		DialTimeout: topologyPing, MaxRetries: -1, Protocol: master.Protocol})
	defer c.Close()
	// The first PING dials; the second is the round trip.
	if err := c.Ping(ctx).Err(); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := c.Ping(ctx).Err(); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// field is the value after prefix in the first of fields that starts with it.
func field(fields []string, prefix string) string {
	for _, f := range fields {
		if v, ok := strings.CutPrefix(f, prefix); ok {
			return v
		}
	}
	return ""
}
