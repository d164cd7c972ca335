package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// notifier shares pub/sub connections among all the waiters of a daemon. A channel (a
// record's key) is subscribed while at least one waiter watches it.
//
// On Redis 7 and later the scripts publish with SPUBLISH and the notifier subscribes
// with SSUBSCRIBE: on a Cluster a sharded message goes only to the nodes of the key's
// shard, where PUBLISH goes to every node. Sharded subscriptions are made on the node
// that serves the channel's slot, so a Cluster gets one pub/sub connection per master;
// elsewhere one connection serves every channel.
type notifier struct {
	client Client

	mu sync.Mutex
	// sharded is decided on the first watch, from the version of the server.
	sharded  *bool
	subs     map[string]*subscription // by master address; "" outside a Cluster
	channels map[string]*channel
	// closed is set by close; a watch after it fails instead of reconnecting.
	closed bool
	// subscribeWait bounds how long watch waits for Redis to confirm a subscription.
	subscribeWait time.Duration
}

type subscription struct {
	pubsub *redis.PubSub
	cancel context.CancelFunc
	done   chan struct{}
	// start runs the receive loop once a first channel is subscribed: a Receive before
	// that would connect a Cluster's pub/sub to a random node rather than to the node
	// of the channel's slot.
	start sync.Once
}

type channel struct {
	sub      *subscription
	watchers map[*watch]struct{}
	// ready is closed when Redis confirms the subscription.
	ready chan struct{}
}

// wake tells each watcher to look at its record again; n.mu is held.
func (ch *channel) wake() {
	for w := range ch.watchers {
		select {
		case w.c <- struct{}{}:
		default:
		}
	}
}

type watch struct {
	n     *notifier
	name  string
	c     chan struct{}
	close sync.Once
}

func (w *watch) C() <-chan struct{} { return w.c }

func (w *watch) Close() { w.close.Do(func() { w.n.unwatch(w) }) }

func newNotifier(client Client) *notifier {
	return &notifier{client: client, subs: map[string]*subscription{}, channels: map[string]*channel{},
		subscribeWait: subscribeWait}
}

// subscribeWait bounds how long watch waits for Redis to confirm a subscription. A
// watch that returns before the confirmation is woken when it comes (see receive), so
// that its waiter looks at the record again: a change made before Redis took the
// subscription in sent its message to nobody.
const subscribeWait = time.Second

// versionScript answers the server's version as a number (0x070000 for 7.0.0); Redis
// before 7 has no redis.REDIS_VERSION_NUM and answers 0. The scripts' notify makes the
// same test, so that publisher and subscriber agree.
var versionScript = redis.NewScript(`return redis.REDIS_VERSION_NUM or 0`)

const firstShardedVersion = 0x070000

func (n *notifier) isSharded(ctx context.Context) (bool, error) {
	n.mu.Lock()
	known := n.sharded
	n.mu.Unlock()
	if known != nil {
		return *known, nil
	}
	v, err := versionScript.Run(ctx, n.client, nil).Int64()
	if err != nil {
		return false, err
	}
	sharded := v >= firstShardedVersion
	n.mu.Lock()
	n.sharded = &sharded
	n.mu.Unlock()
	return sharded, nil
}

// shard names the connection a channel is subscribed on: with sharded pub/sub, the
// address of the master that serves its slot (the same for every channel outside a
// Cluster), so that a Cluster gets one pub/sub connection per master; "" otherwise.
func (n *notifier) shard(ctx context.Context, name string, sharded bool) (string, error) {
	if !sharded {
		return "", nil
	}
	master, err := n.client.MasterFor(ctx, name)
	if err != nil {
		return "", err
	}
	return master.Options().Addr, nil
}

func (n *notifier) watch(ctx context.Context, name string) (*watch, error) {
	sharded, err := n.isSharded(ctx)
	if err != nil {
		return nil, err
	}
	shard, err := n.shard(ctx, name, sharded)
	if err != nil {
		return nil, err
	}
	w := &watch{n: n, name: name, c: make(chan struct{}, 1)}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, engine.Unavailable(errors.New("the store is closed"))
	}
	ch, ok := n.channels[name]
	if !ok {
		sub := n.subs[shard]
		if sub == nil {
			sub = n.subscribe(sharded)
			n.subs[shard] = sub
		}
		ch = &channel{sub: sub, watchers: map[*watch]struct{}{}, ready: make(chan struct{})}
		n.channels[name] = ch
	}
	ch.watchers[w] = struct{}{}
	n.mu.Unlock()

	if !ok {
		var err error
		if sharded {
			err = ch.sub.pubsub.SSubscribe(ctx, name)
		} else {
			err = ch.sub.pubsub.Subscribe(ctx, name)
		}
		if err != nil {
			w.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, engine.Unavailable(err)
		}
	}
	ch.sub.start.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		ch.sub.cancel = cancel
		go n.receive(ctx, ch.sub)
	})
	timer := time.NewTimer(n.subscribeWait)
	defer timer.Stop()
	select {
	case <-ch.ready:
		// The caller reads the record after this; a wake-up from before is stale.
		select {
		case <-w.c:
		default:
		}
	case <-timer.C:
	case <-ctx.Done():
		w.Close()
		return nil, ctx.Err()
	}
	return w, nil
}

// subscribe makes a pub/sub with no channels and no connection yet; on a Cluster it
// connects to the node of the first channel subscribed. n.mu is held.
func (n *notifier) subscribe(sharded bool) *subscription {
	var pubsub *redis.PubSub
	if sharded {
		pubsub = n.client.SSubscribe(context.Background())
	} else {
		pubsub = n.client.Subscribe(context.Background())
	}
	return &subscription{pubsub: pubsub, done: make(chan struct{})}
}

func (n *notifier) unwatch(w *watch) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch, ok := n.channels[w.name]
	if !ok {
		return
	}
	delete(ch.watchers, w)
	if len(ch.watchers) == 0 {
		delete(n.channels, w.name)
		// Unsubscribing only writes the command; its confirmation is read by receive.
		if n.sharded != nil && *n.sharded {
			_ = ch.sub.pubsub.SUnsubscribe(context.Background(), w.name)
		} else {
			_ = ch.sub.pubsub.Unsubscribe(context.Background(), w.name)
		}
	}
}

func (n *notifier) receive(ctx context.Context, sub *subscription) {
	defer close(sub.done)
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	for ctx.Err() == nil {
		msg, err := sub.pubsub.Receive(ctx)
		if err != nil {
			// Redis is away; go-redis reconnects and resubscribes on the next Receive.
			// Waiters meanwhile fall back on re-checking the record.
			backoff.Reset(100 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-backoff.C:
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" || m.Kind == "ssubscribe" {
				// A confirmation that comes late, or again after go-redis reconnected and
				// resubscribed, may follow messages that went to nobody: every watcher
				// looks at its record again.
				n.mu.Lock()
				if ch, ok := n.channels[m.Channel]; ok {
					select {
					case <-ch.ready:
					default:
						close(ch.ready)
					}
					ch.wake()
				}
				n.mu.Unlock()
			}
		case *redis.Message:
			n.mu.Lock()
			if ch, ok := n.channels[m.Channel]; ok {
				ch.wake()
			}
			n.mu.Unlock()
		}
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	subs := n.subs
	n.subs, n.closed = map[string]*subscription{}, true
	n.mu.Unlock()
	for _, sub := range subs {
		started := true
		sub.start.Do(func() { started = false })
		_ = sub.pubsub.Close()
		if started {
			sub.cancel()
			<-sub.done
		}
	}
}
