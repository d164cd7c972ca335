package floorbench

import (
	"fmt"
	"io"
	"time"
)

// sample is one run of the load generator against one target.
type sample struct {
	target   string
	clients  int
	cycles   int
	errors   int
	firstErr string
	elapsed  time.Duration
	claimP50 time.Duration
	claimP99 time.Duration
	// CPU spent during the run: by the server (all its processes), by the Redis
	// processes behind it, and by the load generator.
	server, redis, generator time.Duration
}

func (s sample) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.cycles) / s.elapsed.Seconds()
}

// perCycle is d in microseconds per successful cycle.
func (s sample) perCycle(d time.Duration) float64 {
	if s.cycles == 0 {
		return 0
	}
	return float64(d.Nanoseconds()) / 1e3 / float64(s.cycles)
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// span is the least and the greatest of a figure over rounds.
type span struct{ lo, hi float64 }

func spanOf(vs []float64) span {
	if len(vs) == 0 {
		return span{}
	}
	s := span{vs[0], vs[0]}
	for _, v := range vs[1:] {
		s.lo, s.hi = min(s.lo, v), max(s.hi, v)
	}
	return s
}

// format prints the span with verb (such as "%.0f"), as one figure when both ends
// print alike.
func (s span) format(verb string) string {
	lo, hi := fmt.Sprintf(verb, s.lo), fmt.Sprintf(verb, s.hi)
	if lo == hi {
		return lo
	}
	return lo + " – " + hi
}

// ratio is a against b, per round: the rounds' a[i]/b[i].
func ratios(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		if b[i] != 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

func collect(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

// printSample prints one run as it ends.
func printSample(w io.Writer, round int, s sample, hasRedis bool) {
	redis := "–"
	if hasRedis {
		redis = fmt.Sprintf("%.0f", s.perCycle(s.redis))
	}
	fmt.Fprintf(w, "round %d, %d clients, %-18s %6d cycles %7.0f/s  claim p50 %6.0f µs p99 %7.0f µs  CPU per cycle: server %4.0f µs, Redis %4s µs, generator %3.0f µs  (%d errors)\n",
		round, s.clients, s.target+":", s.cycles, s.rate(), micros(s.claimP50), micros(s.claimP99),
		s.perCycle(s.server), redis, s.perCycle(s.generator), s.errors)
	if s.firstErr != "" {
		fmt.Fprintf(w, "  the first error: %s\n", s.firstErr)
	}
}

// printSummary prints, for one number of clients, the spread over rounds of every
// target's figures, and of each against the first target (the floor) in the same
// round.
func printSummary(w io.Writer, clients int, targets []*target, results map[string][]sample) {
	fmt.Fprintf(w, "\n%d clients, %d rounds (min – max):\n\n", clients, len(results[targets[0].name]))
	fmt.Fprintln(w, "| | cycles/s | claim p50 µs | claim p99 µs | server CPU per cycle µs | Redis CPU per cycle µs | generator CPU per cycle µs |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|")
	for _, t := range targets {
		ss := results[t.name]
		redis := "–"
		if t.redis != nil {
			redis = spanOf(collect(ss, func(s sample) float64 { return s.perCycle(s.redis) })).format("%.0f")
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", t.title,
			spanOf(collect(ss, sample.rate)).format("%.0f"),
			spanOf(collect(ss, func(s sample) float64 { return micros(s.claimP50) })).format("%.0f"),
			spanOf(collect(ss, func(s sample) float64 { return micros(s.claimP99) })).format("%.0f"),
			spanOf(collect(ss, func(s sample) float64 { return s.perCycle(s.server) })).format("%.0f"),
			redis,
			spanOf(collect(ss, func(s sample) float64 { return s.perCycle(s.generator) })).format("%.0f"))
	}
	base := results[targets[0].name]
	if len(targets) < 2 {
		return
	}
	fmt.Fprintf(w, "\nagainst %s in the same round:\n\n", targets[0].title)
	fmt.Fprintln(w, "| | cycles/s | claim p50 | server CPU per cycle | Redis CPU per cycle |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	for _, t := range targets[1:] {
		ss := results[t.name]
		redis := "–"
		if t.redis != nil && targets[0].redis != nil {
			redis = spanOf(ratios(collect(ss, func(s sample) float64 { return s.perCycle(s.redis) }),
				collect(base, func(s sample) float64 { return s.perCycle(s.redis) }))).format("%.2f×")
		}
		p50 := func(s sample) float64 { return micros(s.claimP50) }
		fmt.Fprintf(w, "| %s | %s | %s µs | %s | %s |\n", t.title,
			spanOf(ratios(collect(ss, sample.rate), collect(base, sample.rate))).format("%.2f×"),
			spanOf(differences(collect(ss, p50), collect(base, p50))).format("%+.0f"),
			spanOf(ratios(collect(ss, func(s sample) float64 { return s.perCycle(s.server) }),
				collect(base, func(s sample) float64 { return s.perCycle(s.server) }))).format("%.2f×"),
			redis)
	}
}

// differences is a[i]-b[i] per round.
func differences(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]-b[i])
	}
	return out
}
