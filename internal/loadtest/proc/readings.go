package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ClockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ), 100 a second
// on Linux.
const ClockTick = 10 * time.Millisecond

// parseStat reads utime and stime (fields 14 and 15, in clock ticks) from the text of
// /proc/<pid>/stat. The command name, field 2, is in parentheses and may hold spaces
// and parentheses of its own, so the fields are counted from the last ')'.
func parseStat(b []byte) (utime, stime int64, err error) {
	end := bytes.LastIndexByte(b, ')')
	if end < 0 {
		return 0, 0, errors.New("no command name in /proc stat")
	}
	// After the name: state (field 3), then fields 4 onwards; utime is the 12th of
	// those after the state, stime the 13th.
	f := bytes.Fields(b[end+1:])
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc stat has %d fields after the command name, want at least 13", len(f))
	}
	if utime, err = strconv.ParseInt(string(f[11]), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("utime: %w", err)
	}
	if stime, err = strconv.ParseInt(string(f[12]), 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stime: %w", err)
	}
	return utime, stime, nil
}

// CPU is the user and system time process pid has spent so far.
func CPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	u, s, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return time.Duration(u+s) * ClockTick, nil
}

// parseStatus reads VmRSS and VmHWM (the peak RSS), in bytes, from the text of
// /proc/<pid>/status.
func parseStatus(b []byte) (rss, hwm int64, err error) {
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch name {
		case "VmRSS":
			rss = n << 10
		case "VmHWM":
			hwm = n << 10
		}
	}
	if rss == 0 || hwm == 0 {
		return 0, 0, errors.New("no VmRSS or VmHWM in /proc status")
	}
	return rss, hwm, nil
}

// Memory is process pid's resident set and its peak, in bytes.
func Memory(pid int) (rss, hwm int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, err
	}
	return parseStatus(b)
}

// LoadAverage is the first n fields of /proc/loadavg (the load averages over 1, 5
// and 15 minutes) joined by spaces, or "?" where they cannot be read.
func LoadAverage(n int) string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return parseLoadavg(b, n)
}

func parseLoadavg(b []byte, n int) string {
	f := strings.Fields(string(b))
	if n < 1 || len(f) < n {
		return "?"
	}
	return strings.Join(f[:n], " ")
}
