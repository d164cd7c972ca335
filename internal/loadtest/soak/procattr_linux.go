package soak

import "syscall"

// childAttr makes the kernel kill a child when the soak dies without its cleanup (a
// SIGKILL), so that no redis-server or idemd outlives it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
