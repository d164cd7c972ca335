//go:build !linux

package soak

import "syscall"

// childAttr is empty where the kernel cannot tie a child's life to its parent; the
// soak's own cleanup stops its children there.
func childAttr() *syscall.SysProcAttr { return nil }
