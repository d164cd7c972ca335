package netsplit

import (
	"context"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Relay joins every connection accepted on ln to a new connection to target, and holds
// each stretch of bytes it reads for delay, plus up to jitter, before passing it on, in
// both directions: a link whose round trip is 2×delay longer. Bytes keep their order,
// so jitter spreads the delays without reordering a stream. It returns when ctx ends.
//
// It stands in for netem's delay, which a kernel without sch_netem lacks: the relay
// delays what the application reads, not packets, so TCP's own round-trip estimate
// (and with it the retransmission timer) still sees a short link.
func Relay(ctx context.Context, ln net.Listener, target string, delay, jitter time.Duration) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			var d net.Dialer
			u, err := d.DialContext(ctx, "tcp", target)
			if err != nil {
				return
			}
			defer u.Close()
			ended := make(chan struct{}, 2)
			go func() { hold(u, c, delay, jitter); ended <- struct{}{} }()
			go func() { hold(c, u, delay, jitter); ended <- struct{}{} }()
			select {
			case <-ended:
			case <-ctx.Done():
			}
		}()
	}
}

// hold copies src to dst, writing each read no sooner than delay (plus up to jitter)
// after it came, and never before an earlier one.
func hold(dst, src net.Conn, delay, jitter time.Duration) {
	type stretch struct {
		b   []byte
		due time.Time
	}
	q := make(chan stretch, 4096)
	go func() {
		defer close(q)
		buf := make([]byte, 64<<10)
		var last time.Time
		for {
			n, err := src.Read(buf)
			if n > 0 {
				due := time.Now().Add(delay)
				if jitter > 0 {
					due = due.Add(rand.N(jitter))
				}
				if due.Before(last) {
					due = last
				}
				last = due
				q <- stretch{append([]byte(nil), buf[:n]...), due}
			}
			if err != nil {
				return
			}
		}
	}()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for s := range q {
		if wait := time.Until(s.due); wait > 0 {
			timer.Reset(wait)
			<-timer.C
		}
		if _, err := dst.Write(s.b); err != nil {
			_ = src.Close()
			for range q {
			}
			return
		}
	}
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// Lose drops share (0 to 1) of the packets between n and other, both ways, at random,
// with an nftables rule in n's namespace; Heal removes it. TCP retransmits what is
// dropped. It needs nft (Debian's nftables); without it the test is skipped, or fails
// when IDEMD_REQUIRE_NETNS is set.
func (n *Node) Lose(other *Node, share float64) {
	l := n.lab
	l.t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		skip(l.t, "nft (nftables) is not installed")
	}
	if share <= 0 || share > 1 {
		l.t.Fatalf("netsplit: a share of packets is in (0, 1], not %v", share)
	}
	// numgen counts in ten-thousandths.
	below := strconv.Itoa(int(share*10000 + 0.5))
	rules := "table inet netsplit {\n" +
		"  chain in { type filter hook input priority 0; ip saddr " + other.IP + " numgen random mod 10000 < " + below + " drop; }\n" +
		"  chain out { type filter hook output priority 0; ip daddr " + other.IP + " numgen random mod 10000 < " + below + " drop; }\n" +
		"}\n"
	l.mu.Lock()
	if l.lossy[n] {
		l.mu.Unlock()
		l.t.Fatalf("netsplit: %s already loses packets; Heal first", n.Name)
	}
	l.lossy[n] = true
	l.mu.Unlock()
	cmd := exec.Command("ip", "netns", "exec", n.NS, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		l.t.Fatalf("netsplit: nft on %s: %v\n%s", n.Name, err, out)
	}
}
