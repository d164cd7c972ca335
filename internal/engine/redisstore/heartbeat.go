package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/version"
)

// A store opened by OpenWith names its connections <name>.<instance> (DaemonClientName
// or MigratingClientName, then a random instance id) and keeps a heartbeat in Redis:
// heartbeatKey(instance), saying the release it runs, that it knows markers, and
// whether it serves the store or moves records out of it, refreshed every
// heartbeatEvery and expiring after heartbeatLife. A live move (Census) tells by them
// which connections are daemons that know markers: any other connection, of a release
// before heartbeats (whose connections are named idemd or nothing) or of anything else,
// may be a daemon that does not, and counts as one until it is gone.
const (
	heartbeatEvery = 5 * time.Second
	heartbeatLife  = 3 * heartbeatEvery
	// roleServing and roleMigrating are what a heartbeat says a store is to its Redis.
	roleServing   = "serving"
	roleMigrating = "migrating"
	// heartbeatSettle is how often a store that has not settled its layout looks
	// whether it has, before its first heartbeat.
	heartbeatSettle = 50 * time.Millisecond
)

// heartbeatKey is the heartbeat of one store's instance; it names no tenant, and no
// SCAN of records matches it.
func heartbeatKey(instance string) string { return "\x00daemon:" + instance }

// heartbeat is what a store says of itself in its heartbeat.
type heartbeat struct {
	instance, role string
}

func (h heartbeat) value() string {
	return "idemd " + version.Release + " markers " + h.role
}

// newInstance is a random instance id, 16 hex digits.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// startHeartbeat writes the store's heartbeat now and every heartbeatEvery until the
// store closes. A heartbeat that cannot be written is tried again at the next beat: a
// move meanwhile counts the store's connections as those of a daemon that may not know
// markers, which only delays it.
func (s *Store) startHeartbeat(h heartbeat) {
	s.heartbeat = h
	s.agreeWG.Add(1)
	go func() {
		defer s.agreeWG.Done()
		// A store that settles its layout by looking at what Redis holds (LayoutAuto)
		// writes no heartbeat before it has looked, so that its own key does not make
		// an empty Redis look used; it waits without starting the look itself.
		for s.layout.Load() == nil {
			select {
			case <-s.closing.Done():
				return
			case <-time.After(heartbeatSettle):
			}
		}
		for {
			ctx, cancel := context.WithTimeout(s.closing, heartbeatEvery)
			p := s.client.Pipeline()
			p.Set(ctx, heartbeatKey(h.instance), h.value(), heartbeatLife)
			_, _ = p.Exec(ctx)
			cancel()
			select {
			case <-s.closing.Done():
				return
			case <-time.After(heartbeatEvery):
			}
		}
	}()
}

// connection is one line of CLIENT LIST.
type connection struct {
	addr, name, flags string
}

// connections lists the clients connected to every master, but for replication links.
func (s *Store) connections(ctx context.Context) ([]connection, error) {
	var mu sync.Mutex
	var out []connection
	err := s.client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		list, err := m.ClientList(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLIENT LIST on %s: %w", m.Options().Addr, err)
		}
		mu.Lock()
		defer mu.Unlock()
		for _, line := range strings.Split(list, "\n") {
			var c connection
			for _, field := range strings.Fields(line) {
				k, v, _ := strings.Cut(field, "=")
				switch k {
				case "addr":
					c.addr = v
				case "name":
					c.name = v
				case "flags":
					c.flags = v
				}
			}
			if c.addr == "" || strings.ContainsAny(c.flags, "SM") {
				continue
			}
			out = append(out, c)
		}
		return nil
	})
	return out, err
}

// daemonName splits a connection's name into the name a store of this release gives
// (DaemonClientName or MigratingClientName) and its instance; ok is false for any
// other name.
func daemonName(name string) (base, instance string, ok bool) {
	base, instance, found := strings.Cut(name, ".")
	if !found || instance == "" || (base != DaemonClientName && base != MigratingClientName) {
		return "", "", false
	}
	return base, instance, true
}

// Census implements engine.ClientCensus: the store's other connections, as daemons of
// this release or later serving it alone (their heartbeats say so), and connections
// that may be daemons that do not know markers. A migrating daemon's connections and
// the store's own count as neither.
func (s *Store) Census(ctx context.Context) (engine.Census, error) {
	conns, err := s.connections(ctx)
	if err != nil {
		return engine.Census{}, engine.Unavailable(err)
	}
	instances := map[string]bool{}
	for _, c := range conns {
		if _, instance, ok := daemonName(c.name); ok && instance != s.heartbeat.instance {
			instances[instance] = true
		}
	}
	beats := map[string]*redis.StringCmd{}
	if len(instances) > 0 {
		p := s.client.Pipeline()
		for instance := range instances {
			beats[instance] = p.Get(ctx, heartbeatKey(instance))
		}
		// An absent heartbeat answers redis.Nil, which leaves the connection unknown.
		_, _ = p.Exec(ctx)
	}
	var census engine.Census
	alone := map[string]string{}
	var unknown []string
	for _, c := range conns {
		_, instance, named := daemonName(c.name)
		if named && instance == s.heartbeat.instance {
			continue
		}
		var fields []string
		if named {
			fields = strings.Fields(beats[instance].Val())
		}
		if len(fields) == 4 && fields[0] == "idemd" && fields[2] == "markers" {
			if fields[3] == roleServing {
				host, _, _ := strings.Cut(c.addr, ":")
				alone[instance] = fmt.Sprintf("a daemon of release %s (instance %s, from %s) serves it alone", fields[1], instance, host)
			}
			continue
		}
		name := "no name"
		if c.name != "" {
			name = fmt.Sprintf("named %q", c.name)
		}
		unknown = append(unknown, fmt.Sprintf("connection %s (%s), not a daemon with a heartbeat: may not know markers", c.addr, name))
	}
	for _, line := range alone {
		census.Alone = append(census.Alone, line)
	}
	sort.Strings(census.Alone)
	sort.Strings(unknown)
	census.Unknown = unknown
	return census, nil
}
