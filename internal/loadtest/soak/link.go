package soak

import (
	"context"
	"net"
	"sync"
	"time"
)

// cutMode is how a link is cut.
type cutMode int

const (
	// cutDrop closes every connection through the link and closes each new one at
	// once, as a peer that is gone does: the client sees errors straight away.
	cutDrop cutMode = iota
	// cutStall keeps every connection open but passes no byte either way until the
	// link is restored, as a partition does: the client sees nothing until its own
	// timeout, and what was held is delivered when the link heals.
	cutStall
)

func (m cutMode) String() string {
	if m == cutStall {
		return "stall"
	}
	return "drop"
}

// link is a TCP relay on loopback between idemd and Redis that can be cut. Unlike
// netsplit.Relay it delays nothing while it is whole: it exists to be cut.
type link struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// open is closed while the link passes bytes, and replaced by a fresh channel
	// when it is stalled, so that the copiers wait on it without polling.
	open chan struct{}
	mode cutMode
	cut  bool
}

// newLink listens on a free loopback port and relays every connection to target.
func newLink(target string) (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	return &link{ln: ln, target: target, conns: make(map[net.Conn]struct{}), open: open}, nil
}

// Addr is the address idemd dials instead of Redis.
func (l *link) Addr() string { return l.ln.Addr().String() }

// serve accepts and relays connections until ctx ends, then closes every one.
func (l *link) serve(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		_ = l.ln.Close()
		l.mu.Lock()
		for c := range l.conns {
			_ = c.Close()
		}
		l.mu.Unlock()
	})
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.relay(ctx, c)
		}()
	}
}

// track adds c to the connections a cut closes, or refuses it when the link is
// dropped or ctx has ended.
func (l *link) track(ctx context.Context, c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if (l.cut && l.mode == cutDrop) || ctx.Err() != nil {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

func (l *link) relay(ctx context.Context, c net.Conn) {
	defer c.Close()
	if !l.track(ctx, c) {
		return
	}
	defer l.untrack(c)
	// A stalled link holds a new connection before dialling too, so that Redis sees
	// nothing of it until the link heals.
	if !l.await(ctx) {
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	u, err := d.DialContext(ctx, "tcp", l.target)
	if err != nil {
		return
	}
	defer u.Close()
	if !l.track(ctx, u) {
		return
	}
	defer l.untrack(u)
	done := make(chan struct{}, 2)
	go func() { l.copy(ctx, u, c); done <- struct{}{} }()
	go func() { l.copy(ctx, c, u); done <- struct{}{} }()
	// Either direction ending ends both: closing the two connections (deferred above)
	// unblocks the other copier's read.
	<-done
	_ = c.Close()
	_ = u.Close()
	<-done
}

// await blocks while the link is stalled; it reports false when ctx ended first.
func (l *link) await(ctx context.Context) bool {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	select {
	case <-open:
		return true
	case <-ctx.Done():
		return false
	}
}

// copy passes src to dst, holding each read while the link is stalled.
func (l *link) copy(ctx context.Context, dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !l.await(ctx) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Cut cuts the link in the given mode until Restore.
func (l *link) Cut(mode cutMode) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		return
	}
	l.cut, l.mode = true, mode
	switch mode {
	case cutDrop:
		for c := range l.conns {
			_ = c.Close()
		}
	case cutStall:
		l.open = make(chan struct{})
	}
}

// Restore makes the link whole again; stalled bytes flow on.
func (l *link) Restore() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.cut {
		return
	}
	if l.mode == cutStall {
		close(l.open)
	}
	l.cut = false
}
