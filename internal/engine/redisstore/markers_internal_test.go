package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemd/idemd/internal/engine"
	"github.com/idemd/idemd/internal/engine/enginetest"
	"github.com/idemd/idemd/internal/testing/testredis"
)

// putMarker writes a marker of a live move over a record's keys, in the record layout
// layout (1 hashes, 2 strings, 3 lean), with the fields a record has and the marker's
// state: 'm' moving, 'x' moved (lua/prelude.lua). It leaves the key's pending entry,
// which a move drops: the stores must cope with one left behind.
const putMarker = `
local layout, st, xa, now = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('DEL', KEYS[1], KEYS[2])
if layout == 1 then
  redis.call('HSET', KEYS[1], 'k', ARGV[5], 't', ARGV[6], 'st', st, 'at', '1', 'tok', 'old',
    'rec', '0', 'ca', now, 'ua', now, 'xa', xa)
  redis.call('PEXPIREAT', KEYS[1], xa)
elseif layout == 2 then
  redis.call('SET', KEYS[1], cmsgpack.pack(2, ARGV[5], ARGV[6], st, nil, nil, 1, 'old', nil, '0',
    now, now, xa), 'PXAT', xa)
else
  redis.call('SET', KEYS[2], cmsgpack.pack(3, st, nil, nil, 1, 'old', nil, nil, now, 0, xa - now),
    'PXAT', xa)
end
return 1
`

// rawKeys is everything Redis keeps of a record: both keys as DUMP has them, when each
// expires, and the key's pending entry.
const rawKeys = `
local out = {}
for i = 1, 2 do
  out[#out + 1] = redis.call('DUMP', KEYS[i]) or ''
  out[#out + 1] = tostring(redis.call('PEXPIRETIME', KEYS[i]))
end
out[#out + 1] = redis.call('ZSCORE', KEYS[3], ARGV[1]) or ''
return out
`

// TestMarkers writes the markers of a live move straight into Redis, in every record
// layout a daemon of each layout reads, and on a Cluster, and holds the scripts to
// refusing them.
func TestMarkers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		opts    Options
		markers []int
	}{
		{"hashes", Options{HashRecords: true}, []int{1}},
		{"strings", Options{}, []int{2}},
		{"lean ready", Options{LeanReady: true}, []int{2, 3}},
		{"lean", Options{LeanRecords: true}, []int{3, 2}},
		{"lean only", Options{LeanRecords: true, LeanOnly: true}, []int{3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := testredis.Start(t)
			for _, layout := range c.markers {
				t.Run(fmt.Sprintf("marker in layout %d", layout), func(t *testing.T) {
					runMarkers(t, srv.URL(), c.opts, layout)
				})
			}
		})
	}
	t.Run("cluster", func(t *testing.T) {
		if testing.Short() {
			t.Skip("a Cluster is not started in -short")
		}
		t.Parallel()
		cluster := testredis.StartCluster(t)
		runMarkers(t, cluster.URL(), Options{LeanRecords: true}, 3)
	})
}

func runMarkers(t *testing.T, url string, opts Options, layout int) {
	enginetest.RunMarkers(t, func(t *testing.T) engine.Store {
		s, err := OpenWith(url, opts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}, func(st engine.Store) enginetest.Markers {
		s := st.(*Store)
		eval := func(t *testing.T, script string, id engine.ID, args ...any) any {
			t.Helper()
			keys := recordKeys(id)
			ctx := context.Background()
			m, err := s.client.MasterFor(ctx, keys[0])
			if err != nil {
				t.Fatal(err)
			}
			v, err := m.Eval(ctx, script, keys, args...).Result()
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		return enginetest.Markers{
			Put: func(t *testing.T, id engine.ID, phase engine.State, expires time.Time) {
				st := map[engine.State]string{engine.StateMoving: "m", engine.StateMoved: "x"}[phase]
				eval(t, putMarker, id, layout, st, expires.UnixMilli(), time.Now().UnixMilli(), id.Key, id.Tenant)
			},
			Raw: func(t *testing.T, id engine.ID) []byte {
				return fmt.Appendf(nil, "%q", eval(t, rawKeys, id, id.Key))
			},
		}
	})
}
