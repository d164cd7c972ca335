package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/engine"
)

// notifier shares one pub/sub connection among all the waiters of a daemon. A channel
// (a record's key) is subscribed while at least one waiter watches it.
type notifier struct {
	client Client

	mu       sync.Mutex
	pubsub   *redis.PubSub
	channels map[string]*channel
	cancel   context.CancelFunc
	done     chan struct{}
	// closed is set by close; a watch after it fails instead of reconnecting.
	closed bool
}

type channel struct {
	watchers map[*watch]struct{}
	// ready is closed when Redis confirms the subscription.
	ready chan struct{}
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
	return &notifier{client: client, channels: map[string]*channel{}}
}

// subscribeWait bounds how long watch waits for Redis to confirm a subscription; past
// it the waiter still re-checks the record on its own schedule.
const subscribeWait = time.Second

func (n *notifier) watch(ctx context.Context, name string) (*watch, error) {
	w := &watch{n: n, name: name, c: make(chan struct{}, 1)}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil, engine.Unavailable(errors.New("the store is closed"))
	}
	if n.pubsub == nil {
		n.pubsub = n.client.Subscribe(context.Background())
		loopCtx, cancel := context.WithCancel(context.Background())
		n.cancel, n.done = cancel, make(chan struct{})
		go n.receive(loopCtx, n.pubsub, n.done)
	}
	ch, ok := n.channels[name]
	if !ok {
		ch = &channel{watchers: map[*watch]struct{}{}, ready: make(chan struct{})}
		n.channels[name] = ch
	}
	ch.watchers[w] = struct{}{}
	pubsub := n.pubsub
	n.mu.Unlock()

	if !ok {
		if err := pubsub.Subscribe(ctx, name); err != nil {
			w.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, engine.Unavailable(err)
		}
	}
	timer := time.NewTimer(subscribeWait)
	defer timer.Stop()
	select {
	case <-ch.ready:
	case <-timer.C:
	case <-ctx.Done():
		w.Close()
		return nil, ctx.Err()
	}
	return w, nil
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
		if n.pubsub != nil {
			// Unsubscribe only writes the command; its confirmation is read by receive.
			_ = n.pubsub.Unsubscribe(context.Background(), w.name)
		}
	}
}

func (n *notifier) receive(ctx context.Context, pubsub *redis.PubSub, done chan struct{}) {
	defer close(done)
	backoff := time.NewTimer(0)
	defer backoff.Stop()
	for ctx.Err() == nil {
		msg, err := pubsub.Receive(ctx)
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
			if m.Kind == "subscribe" {
				n.mu.Lock()
				if ch, ok := n.channels[m.Channel]; ok {
					select {
					case <-ch.ready:
					default:
						close(ch.ready)
					}
				}
				n.mu.Unlock()
			}
		case *redis.Message:
			n.mu.Lock()
			if ch, ok := n.channels[m.Channel]; ok {
				for w := range ch.watchers {
					select {
					case w.c <- struct{}{}:
					default:
					}
				}
			}
			n.mu.Unlock()
		}
	}
}

func (n *notifier) close() {
	n.mu.Lock()
	pubsub, cancel, done := n.pubsub, n.cancel, n.done
	n.pubsub, n.cancel, n.done, n.closed = nil, nil, nil, true
	n.mu.Unlock()
	if pubsub == nil {
		return
	}
	cancel()
	_ = pubsub.Close()
	<-done
}
