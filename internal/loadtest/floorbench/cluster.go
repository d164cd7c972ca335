package floorbench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemd/idemd/internal/loadtest/proc"
)

// cluster is a Redis Cluster of masters only, with its idemd daemons.
type cluster struct {
	masters []*proc.Process
	daemons []*proc.Process
}

// startCluster starts a cluster of n masters (startMasters) and its daemons on it
// (Config.Daemons, or one per master).
func (b *bench) startCluster(ctx context.Context, n int) (*cluster, error) {
	masters, err := b.startMasters(ctx, n)
	if err != nil {
		return nil, err
	}
	c := &cluster{masters: masters}
	daemons := b.cfg.Daemons
	if daemons <= 0 {
		daemons = n
	}
	for i := range daemons {
		d, err := b.startIdemd(ctx, fmt.Sprintf("idemd (cluster of %d, daemon %d)", n, i+1), "--store", clusterURL(masters))
		if err != nil {
			return nil, err
		}
		c.daemons = append(c.daemons, d)
	}
	return c, nil
}

// clusterURL is the store URL of a cluster of these masters.
func clusterURL(masters []*proc.Process) string {
	addrs := make([]string, len(masters))
	for i, m := range masters {
		addrs[i] = m.Addr
	}
	return "redis+cluster://" + strings.Join(addrs, ",")
}

// startMasters starts n cluster-enabled redis-servers, gives each an equal range of
// the 16384 slots, joins them, and waits until every node sees the whole cluster
// serving every slot. redis-cli --cluster create is not used: it refuses fewer than
// three masters.
func (b *bench) startMasters(ctx context.Context, n int) ([]*proc.Process, error) {
	c := &cluster{}
	busPorts := make([]int, n)
	for i := range n {
		bus, err := proc.FreePort()
		if err != nil {
			return nil, err
		}
		busPorts[i] = bus
		p, err := b.startRedis(ctx, fmt.Sprintf("redis-server (cluster of %d, master %d)", n, i+1),
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", "5000")
		if err != nil {
			return nil, err
		}
		c.masters = append(c.masters, p)
	}
	for i, m := range c.masters {
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr})
		lo, hi := slotRange(i, n)
		err := rdb.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err()
		if err == nil && i > 0 {
			host, port, _ := strings.Cut(c.masters[0].Addr, ":")
			err = rdb.Do(ctx, "CLUSTER", "MEET", host, port, busPorts[0]).Err()
		}
		rdb.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.Name, err)
		}
	}
	for _, m := range c.masters {
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr})
		err := waitFor(ctx, m, "the cluster", func() bool {
			info, err := rdb.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_slots_ok:16384") && strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r")
		})
		rdb.Close()
		if err != nil {
			return nil, err
		}
	}
	return c.masters, nil
}

// slotRange is master i's share of the 16384 slots, of n masters.
func slotRange(i, n int) (lo, hi int) {
	return i * 16384 / n, (i+1)*16384/n - 1
}

// commandsProcessed is total_commands_processed of each Redis, which master served
// how many of a run's calls, and total_reads_processed, how many reads from its
// clients' connections they took: the more calls a read brings, the less CPU each
// costs.
func commandsProcessed(ctx context.Context, ps []*proc.Process) (cmds, reads []int64, err error) {
	cmds, reads = make([]int64, len(ps)), make([]int64, len(ps))
	for i, p := range ps {
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr})
		text, err := rdb.Info(ctx, "stats").Result()
		rdb.Close()
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p.Name, err)
		}
		for _, line := range strings.Split(text, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			switch k {
			case "total_commands_processed":
				cmds[i], _ = strconv.ParseInt(v, 10, 64)
			case "total_reads_processed":
				reads[i], _ = strconv.ParseInt(v, 10, 64)
			}
		}
	}
	return cmds, reads, nil
}

// clusterSample is one run against a cluster.
type clusterSample struct {
	masters  int
	clients  int
	cycles   int
	errors   int
	firstErr string
	elapsed  time.Duration
	claimP50 time.Duration
	claimP99 time.Duration
	// Per master: CPU during the run, and the commands it processed.
	masterCPU   []time.Duration
	masterCmds  []int64
	masterReads []int64
	// Per daemon: CPU during the run, and the cycles sent to it.
	daemonCPU    []time.Duration
	daemonCycles []int
	generator    time.Duration
}

func (s clusterSample) rate() float64 { return float64(s.cycles) / s.elapsed.Seconds() }

// masterPerServed is master i's CPU per cycle whose key it holds, in µs: its CPU over
// the run's cycles times its share of the commands.
func (s clusterSample) masterPerServed(i int) float64 {
	var all int64
	for _, n := range s.masterCmds {
		all += n
	}
	if all == 0 || s.cycles == 0 {
		return 0
	}
	served := float64(s.cycles) * float64(s.masterCmds[i]) / float64(all)
	return micros(s.masterCPU[i]) / served
}

// share is master i's share of the commands.
func (s clusterSample) share(i int) float64 {
	var all int64
	for _, n := range s.masterCmds {
		all += n
	}
	if all == 0 {
		return 0
	}
	return float64(s.masterCmds[i]) / float64(all)
}

// callsPerRead is how many calls master i took in from each read of a connection.
func (s clusterSample) callsPerRead(i int) float64 {
	if s.masterReads[i] == 0 {
		return 0
	}
	return float64(s.masterCmds[i]) / float64(s.masterReads[i])
}

// daemonPerServed is daemon i's CPU per cycle sent to it, in µs.
func (s clusterSample) daemonPerServed(i int) float64 {
	if s.daemonCycles[i] == 0 {
		return 0
	}
	return micros(s.daemonCPU[i]) / float64(s.daemonCycles[i])
}

func sum(ds []time.Duration) (t time.Duration) {
	for _, d := range ds {
		t += d
	}
	return t
}

func (b *bench) measureCluster(ctx context.Context, c *cluster, clients, cycles int, prefix string) (clusterSample, error) {
	var pids []int
	for _, p := range slices.Concat(c.masters, c.daemons) {
		pids = append(pids, p.PID())
	}
	urls := make([]string, len(c.daemons))
	for i, d := range c.daemons {
		urls[i] = "http://" + d.Addr
	}
	cmdsBefore, readsBefore, err := commandsProcessed(ctx, c.masters)
	if err != nil {
		return clusterSample{}, err
	}
	before, err := cpuOf(pids)
	if err != nil {
		return clusterSample{}, err
	}
	res, err := b.generate(ctx, urls, clients, cycles, prefix)
	if err != nil {
		return clusterSample{}, err
	}
	after, err := cpuOf(pids)
	if err != nil {
		return clusterSample{}, err
	}
	cmdsAfter, readsAfter, err := commandsProcessed(ctx, c.masters)
	if err != nil {
		return clusterSample{}, err
	}
	n := len(c.masters)
	s := clusterSample{masters: n, clients: clients, cycles: res.Cycles, errors: res.Errors, firstErr: res.FirstError, elapsed: res.Elapsed,
		claimP50: res.ClaimP50, claimP99: res.ClaimP99, generator: res.CPU, daemonCycles: res.CyclesByURL}
	if len(s.daemonCycles) != len(c.daemons) {
		// One daemon: the generator had a single URL.
		s.daemonCycles = []int{res.Cycles}
	}
	for i := range n {
		s.masterCPU = append(s.masterCPU, after[i]-before[i])
		s.masterCmds = append(s.masterCmds, cmdsAfter[i]-cmdsBefore[i])
		s.masterReads = append(s.masterReads, readsAfter[i]-readsBefore[i])
	}
	for i := range c.daemons {
		s.daemonCPU = append(s.daemonCPU, after[n+i]-before[n+i])
	}
	return s, nil
}

func (b *bench) runCluster(ctx context.Context) error {
	clients := slices.Max(b.cfg.Clients)
	clusters := make([]*cluster, len(b.cfg.Masters))
	for i, n := range b.cfg.Masters {
		c, err := b.startCluster(ctx, n)
		if err != nil {
			return fmt.Errorf("a cluster of %d: %w", n, err)
		}
		clusters[i] = c
		urls := make([]string, len(c.daemons))
		for j, d := range c.daemons {
			urls[j] = "http://" + d.Addr
		}
		if err := b.warm(ctx, &target{name: "cluster" + strconv.Itoa(n), title: fmt.Sprintf("a cluster of %d", n), urls: urls}); err != nil {
			return err
		}
	}
	if err := b.idle(ctx, clusters); err != nil {
		return err
	}
	daemons, load := "one idemd per master", fmt.Sprintf("%d clients and %d cycles a run", clients, b.cfg.Cycles)
	if b.cfg.Daemons > 0 {
		daemons = fmt.Sprintf("%d idemd daemons", b.cfg.Daemons)
	}
	if b.cfg.ClientsPerMaster {
		load = fmt.Sprintf("%d clients and %d cycles a run per master", clients, b.cfg.Cycles)
	}
	fmt.Fprintf(b.cfg.Out, "clusters of %v masters, %s, the clients shared out among them; %s%s; %d rounds\n\n",
		b.cfg.Masters, daemons, load, b.atMost(), b.cfg.Rounds)
	results := make([][]clusterSample, len(clusters))
	for round := 1; round <= b.cfg.Rounds; round++ {
		for k := range clusters {
			i := (k + round - 1) % len(clusters)
			c, n := clients, b.cfg.Cycles
			if b.cfg.ClientsPerMaster {
				c, n = c*b.cfg.Masters[i], n*b.cfg.Masters[i]
			}
			s, err := b.measureCluster(ctx, clusters[i], c, n, fmt.Sprintf("r%d-m%d-%d", round, b.cfg.Masters[i], time.Now().UnixNano()))
			if err != nil {
				return fmt.Errorf("round %d, a cluster of %d: %w", round, b.cfg.Masters[i], err)
			}
			printClusterSample(b.cfg.Out, round, s)
			results[i] = append(results[i], s)
		}
	}
	printClusterSummary(b.cfg.Out, results)
	return nil
}

// idleWindow is how long idle measures the CPU of clusters that serve nothing.
const idleWindow = 5 * time.Second

// idle prints the CPU the masters and daemons of each cluster spend with no load
// (timers, the cluster bus, refreshes of the slot map): the part of a run's CPU that
// does not come from its cycles.
func (b *bench) idle(ctx context.Context, clusters []*cluster) error {
	var pids []int
	for _, c := range clusters {
		for _, p := range slices.Concat(c.masters, c.daemons) {
			pids = append(pids, p.PID())
		}
	}
	before, err := cpuOf(pids)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(idleWindow):
	}
	after, err := cpuOf(pids)
	if err != nil {
		return err
	}
	perSecond := func(i int) float64 { return float64((after[i] - before[i]).Milliseconds()) / idleWindow.Seconds() }
	fmt.Fprintf(b.cfg.Out, "with no load, over %s:", idleWindow)
	k := 0
	for _, c := range clusters {
		var ms, ds []string
		for range c.masters {
			ms = append(ms, fmt.Sprintf("%.0f", perSecond(k)))
			k++
		}
		for range c.daemons {
			ds = append(ds, fmt.Sprintf("%.0f", perSecond(k)))
			k++
		}
		fmt.Fprintf(b.cfg.Out, " %d masters: masters %s ms/s, daemons %s ms/s;", len(c.masters), strings.Join(ms, ", "), strings.Join(ds, ", "))
	}
	fmt.Fprintln(b.cfg.Out)
	return nil
}

func printClusterSample(w io.Writer, round int, s clusterSample) {
	var masters, daemons []string
	for i := range s.masterCPU {
		masters = append(masters, fmt.Sprintf("%.0f µs (%.0f %%, %.1f calls a read)", s.masterPerServed(i), 100*s.share(i), s.callsPerRead(i)))
	}
	for i := range s.daemonCPU {
		daemons = append(daemons, fmt.Sprintf("%.0f µs (%d cycles)", s.daemonPerServed(i), s.daemonCycles[i]))
	}
	fmt.Fprintf(w, "round %d, %d masters, %d clients: %d cycles %.0f/s, claim p50 %.0f µs p99 %.0f µs; CPU per cycle it served: masters %s; daemons %s; generator %.0f µs per cycle (%d errors)\n",
		round, s.masters, s.clients, s.cycles, s.rate(), micros(s.claimP50), micros(s.claimP99),
		strings.Join(masters, ", "), strings.Join(daemons, ", "), micros(s.generator)/float64(max(s.cycles, 1)), s.errors)
	if s.firstErr != "" {
		fmt.Fprintf(w, "  the first error: %s\n", s.firstErr)
	}
}

// clusterModel is, from the runs against one cluster, each master's and each
// daemon's CPU per cycle it served (over every master or daemon and every round),
// and the claims/s the cluster would reach with each master on a core of its own.
type clusterModel struct {
	masters          int
	master, daemon   span
	share            span
	callsPerRead     span
	redisAll         span // all masters' CPU per cycle of the run
	rate, p50, p99   span
	generator        span
	capacity         span // n × 1 s / the master's CPU per cycle it served
	daemonCoresAtCap span // daemon CPU per cycle × capacity, in cores
}

func modelOf(ss []clusterSample) clusterModel {
	m := clusterModel{masters: ss[0].masters}
	var master, daemon, share, perRead, redisAll, rate, p50, p99, gen, capacity, cores []float64
	for _, s := range ss {
		var perServed []float64
		for i := range s.masterCPU {
			perServed = append(perServed, s.masterPerServed(i))
			share = append(share, s.share(i))
			perRead = append(perRead, s.callsPerRead(i))
		}
		master = append(master, perServed...)
		for i := range s.daemonCPU {
			daemon = append(daemon, s.daemonPerServed(i))
		}
		redisAll = append(redisAll, micros(sum(s.masterCPU))/float64(max(s.cycles, 1)))
		rate = append(rate, s.rate())
		p50, p99 = append(p50, micros(s.claimP50)), append(p99, micros(s.claimP99))
		gen = append(gen, micros(s.generator)/float64(max(s.cycles, 1)))
		// The busiest master bounds the cluster: on a core of its own it serves cycles
		// until it spends a second of CPU a second on them.
		var busiest float64
		for _, d := range s.masterCPU {
			busiest = max(busiest, micros(d)/float64(max(s.cycles, 1)))
		}
		if busiest > 0 {
			c := 1e6 / busiest
			capacity = append(capacity, c)
			cores = append(cores, c*micros(sum(s.daemonCPU))/float64(max(s.cycles, 1))/1e6)
		}
	}
	m.master, m.daemon, m.share, m.redisAll = spanOf(master), spanOf(daemon), spanOf(share), spanOf(redisAll)
	m.callsPerRead = spanOf(perRead)
	m.rate, m.p50, m.p99, m.generator = spanOf(rate), spanOf(p50), spanOf(p99), spanOf(gen)
	m.capacity, m.daemonCoresAtCap = spanOf(capacity), spanOf(cores)
	return m
}

func printClusterSummary(w io.Writer, results [][]clusterSample) {
	fmt.Fprintf(w, "\n%d rounds (min – max over rounds, and over masters or daemons):\n\n", len(results[0]))
	fmt.Fprintln(w, "| masters | cycles/s here | claim p50 / p99 µs | each master's CPU per cycle it served µs | each master's share of the calls | calls per read | all masters' CPU per cycle µs | each daemon's CPU per cycle it served µs | generator CPU per cycle µs | cycles/s with each master on a core of its own | daemon cores that needs |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, ss := range results {
		m := modelOf(ss)
		fmt.Fprintf(w, "| %d | %s | %s / %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", m.masters,
			m.rate.format("%.0f"), m.p50.format("%.0f"), m.p99.format("%.0f"), m.master.format("%.0f"),
			span{100 * m.share.lo, 100 * m.share.hi}.format("%.0f %%"), m.callsPerRead.format("%.1f"), m.redisAll.format("%.0f"),
			m.daemon.format("%.0f"), m.generator.format("%.0f"), m.capacity.format("%.0f"), m.daemonCoresAtCap.format("%.1f"))
	}
	fmt.Fprintln(w, "\nWith each master on a core of its own, a cluster serves cycles until its busiest master spends a second of CPU a second: N masters that each spend m µs per cycle they serve, with the keys spread evenly, reach N × 1,000,000 / m cycles/s (each a claim and its complete), and need that rate × the daemons' CPU per cycle in daemon cores. This machine runs every process on the same cores, so the rates are a model checked by the CPU counts, not a measurement.")
}
