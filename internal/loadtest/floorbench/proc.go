package floorbench

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ), 100 a second
// on Linux.
const clockTick = 10 * time.Millisecond

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

// processCPU is the user and system time process pid has spent so far.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	u, s, err := parseStat(b)
	if err != nil {
		return 0, fmt.Errorf("process %d: %w", pid, err)
	}
	return time.Duration(u+s) * clockTick, nil
}

// cpuOf reads processCPU of every pid.
func cpuOf(pids []int) ([]time.Duration, error) {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		var err error
		if out[i], err = processCPU(pid); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loadAverage is the first field of /proc/loadavg, the load average over a minute.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := bytes.Fields(b); len(f) > 0 {
		return string(f[0])
	}
	return "?"
}
